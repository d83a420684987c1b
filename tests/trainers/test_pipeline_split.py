"""The pipeline split: per-block costs from FLOPs, the balanced partition, pruning a model to its
stages, and the errors of a layout that cannot run."""

import itertools
import random
from dataclasses import replace

import pytest
import torch
from torch import nn

from helpers import tiny_gpt
from tiny_models import tiny_translator
from trainers import Strategy
from trainers.loop.data import pipeline_microbatches
from trainers.pipeline.split import PipelineLayout, attached_modules, check_pipeline_plan, given_split
from trainers.pipeline.balance import PieceCosts, balanced_split, estimate_costs, stage_costs
from trainers.pipeline.stage import prune
from zoo.plan import ModelPlan, model_plan


def brute_force_best(costs: PieceCosts, stages: int) -> float:
    n = len(costs.blocks)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(stage_costs(costs, [range(a, b) for a, b in zip(bounds, bounds[1:])])))
    return best


@pytest.mark.parametrize("seed", range(5))
def test_balanced_split_is_the_best_contiguous_split(seed):
    rng = random.Random(seed)
    costs = PieceCosts(rng.uniform(0, 5), [rng.uniform(1, 10) for _ in range(9)], rng.uniform(0, 30))
    for stages in (2, 3, 4):
        ranges = balanced_split(costs, stages)
        assert [i for r in ranges for i in r] == list(range(9)) and all(len(r) >= 1 for r in ranges)
        assert max(stage_costs(costs, ranges)) == pytest.approx(brute_force_best(costs, stages))


def test_a_large_vocabulary_head_gets_a_stage_of_fewer_blocks_by_flops():
    model = tiny_gpt(n_layer=8, vocab_size=4096)
    batch = {"input_ids": torch.randint(0, 4096, (2, 16)), "labels": torch.randint(0, 4096, (2, 16))}
    costs = estimate_costs(model, list(model.blocks), [model.embeddings], [model.norm, model.embeddings.word], batch,
                           recompute=False, microbatches=4, measure=False)
    # One block: 2 x 16 tokens through q, k, v, out and a 4x feed-forward on width 32, plus attention.
    assert costs.blocks[0] == pytest.approx(costs.blocks[7]) and costs.blocks[0] > 0
    assert costs.exit > 4 * costs.blocks[0]  # the 4096-row head
    assert costs.enter < costs.blocks[0]  # lookups cost no multiplies
    ranges = balanced_split(costs, 2)
    assert len(ranges[1]) < len(ranges[0])
    equal = [range(0, 4), range(4, 8)]
    assert max(stage_costs(costs, ranges)) < max(stage_costs(costs, equal))


def test_costs_on_the_meta_device_count_the_same_multiplies():
    batch = {"input_ids": torch.randint(0, 48, (2, 16)), "labels": torch.randint(0, 48, (2, 16))}
    real = tiny_gpt(n_layer=2)
    with torch.device("meta"):
        meta = tiny_gpt(n_layer=2)
    pieces = lambda m: (list(m.blocks), [m.embeddings], [m.norm, m.embeddings.word])  # noqa: E731
    real_costs = estimate_costs(real, *pieces(real), batch, recompute=False, microbatches=1, measure=False)
    meta_costs = estimate_costs(meta, *pieces(meta), batch, recompute=False, microbatches=1)
    assert meta_costs.exit == pytest.approx(real_costs.exit)
    assert meta_costs.blocks[0] == pytest.approx(real_costs.blocks[0], rel=0.2)


def test_measured_costs_see_a_large_head_and_cheap_lookups():
    model = tiny_gpt(n_layer=2, n_embd=64, vocab_size=32768, block_size=64)
    batch = {"input_ids": torch.randint(0, 32768, (4, 64)), "labels": torch.randint(0, 32768, (4, 64))}
    costs = estimate_costs(model, list(model.blocks), [model.embeddings], [model.norm, model.embeddings.word], batch,
                           recompute=False, microbatches=4)
    # Seconds, not FLOPs: a 32k-word head on 256 tokens runs far longer than a 64-wide block.
    assert 0 < costs.enter < costs.exit and costs.blocks[0] < costs.exit / 2 and costs.exit < 10.0


def test_more_stages_than_blocks_is_refused():
    with pytest.raises(ValueError, match=r"Strategy.pp \* Strategy.stages_per_rank = 5 stages, more than the "
                                         r"model's 4 blocks"):
        balanced_split(PieceCosts(1.0, [1.0] * 4, 1.0), 5)


def test_a_given_split_is_taken_as_given():
    assert given_split((1, 3), 4) == [range(0, 1), range(1, 4)]
    assert given_split((2, 1, 1), 4) == [range(0, 2), range(2, 3), range(3, 4)]
    with pytest.raises(ValueError, match=r"Strategy.pp_split=\(2, 3\) covers 5 blocks; the model has 4"):
        given_split((2, 3), 4)


def test_pruning_keeps_the_stage_modules_under_their_names():
    model = tiny_gpt(n_layer=4)
    prune(model, {"blocks.2", "blocks.3", "norm", "embeddings.word"})
    names = set(model.state_dict())
    assert {"blocks.2.attn.q.weight", "blocks.3.mlp.fc2.weight", "norm.weight", "embeddings.word.weight"} <= names
    assert not any(n.startswith(("blocks.0.", "blocks.1.", "embeddings.position")) for n in names)
    assert list(model.blocks.keys()) == ["2", "3"]


def test_an_attached_module_is_held_by_the_stage_of_its_block():
    model = tiny_translator()
    split = model.parallel_plan().pipeline
    blocks = model.parallel_plan().block_names(model)
    assert attached_modules(model, split, blocks) == {"encoder.1": ["encoder_norm"]}
    layout = PipelineLayout(ranges=[range(0, 1), range(1, 4)], block_names=blocks, pre=["embeddings"],
                            post=["decoder_norm", "embeddings.word"], pp=2, pp_rank=0, costs=None, tied=[],
                            attached={"encoder.1": ["encoder_norm"]})
    assert layout.stage_modules(0) == (["encoder.0"], ["embeddings"])
    assert layout.stage_modules(1) == (["encoder.1", "decoder.0", "decoder.1"],
                                       ["encoder_norm", "decoder_norm", "embeddings.word"])
    with pytest.raises(ValueError, match="PipelineSplit.attached pairs 'encoder_norm' with 'encoder', which is not one"):
        attached_modules(model, replace(split, attached=(("encoder_norm", "encoder"),)), blocks)


def test_a_model_without_split_points_is_refused():
    class Plain(nn.Module):
        def parallel_plan(self) -> ModelPlan:
            return ModelPlan(blocks=("layers.*",))

    with pytest.raises(ValueError, match="Strategy.pp > 1 needs split points, but Plain declares none"):
        check_pipeline_plan(Plain(), model_plan(Plain()))
    gpt = tiny_gpt()
    assert check_pipeline_plan(gpt, model_plan(gpt)).post == ("norm", "embeddings.word")


@pytest.mark.parametrize("fields,message", [
    (dict(pp=0), "Strategy.pp must be an integer >= 1; got 0"),
    (dict(pp=2, pp_schedule="pipedream"), "Strategy.pp_schedule must be one of"),
    (dict(pp=2, pp_schedule="interleaved_1f1b"), "Strategy.pp_schedule='interleaved_1f1b' runs several stages per "
                                                 "rank and needs Strategy.stages_per_rank > 1; got 1"),
    (dict(pp=2, stages_per_rank=2), "Strategy.stages_per_rank=2 needs a schedule that runs several stages"),
    (dict(stages_per_rank=2, pp_schedule="interleaved_1f1b"), "needs Strategy.pp > 1; got pp=1"),
    (dict(pp=2, microbatches=0), "Strategy.microbatches must be None or an integer >= 1; got 0"),
    (dict(pp=2, pp_split=(3,)), "Strategy.pp_split must give pp x stages_per_rank = 2 block counts of at least 1 "
                                "each (with pp > 1); got (3,)"),
    (dict(pp=2, pp_split=(4, 0)), "Strategy.pp_split must give pp x stages_per_rank = 2 block counts"),
    (dict(pp_split=(4,)), "Strategy.pp_split must give pp x stages_per_rank = 1 block counts of at least 1 each "
                          "(with pp > 1)"),
])
def test_strategy_refuses_bad_pipeline_fields(fields, message):
    with pytest.raises(ValueError, match=message.replace("*", r"\*").replace("(", r"\(").replace(")", r"\)")):
        Strategy(**fields)


def test_microbatches_must_divide_the_step():
    assert pipeline_microbatches(32, 2, 2, None) == 8
    assert pipeline_microbatches(32, 2, 2, 4) == 4
    with pytest.raises(ValueError, match=r"Strategy.microbatches=3 must divide the micro batches of each step and "
                                         r"data-parallel rank: .* = 32 / \(2 x 2\) = 8"):
        pipeline_microbatches(32, 2, 2, 3)

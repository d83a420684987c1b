"""Tensor-parallel plans and strategies: every bad combination is refused with the field named."""

import pytest
import torch
from torch import nn

from helpers import tiny_gpt
from trainers import Strategy, TrainConfig, Trainer
from trainers.parallel.tensor import check_plan
from zoo.plan import ModelPlan


def test_strategy_fields_are_validated():
    assert Strategy(tp=2, sequence_parallel=True).tp == 2
    with pytest.raises(ValueError, match="Strategy.tp must be an integer >= 1; got 0"):
        Strategy(tp=0)
    with pytest.raises(ValueError, match="Strategy.tp must be an integer >= 1; got True"):
        Strategy(tp=True)
    with pytest.raises(ValueError, match="Strategy.sequence_parallel=True .* needs Strategy.tp > 1; got tp=1"):
        Strategy(sequence_parallel=True)
    with pytest.raises(ValueError, match="Strategy.sequence_parallel must be True or False; got 'yes'"):
        Strategy(tp=2, sequence_parallel="yes")


def test_gpt_plan_resolves_and_checks_divisibility():
    names = check_plan(model := tiny_gpt(n_head=4), model.parallel_plan(), 2, True)
    assert names["vocab_parallel"] == ["embeddings.word"]
    assert names["regions"] == ["blocks.0.attn", "blocks.0.mlp", "blocks.1.attn", "blocks.1.mlp"]
    assert names["sequence_gather"] == ["norm"] and names["sequence_split"] == ["embeddings"]
    with pytest.raises(ValueError, match=r"Strategy.tp=4 must divide the 2 heads of 'blocks.0.attn.q'"):
        check_plan(model := tiny_gpt(), model.parallel_plan(), 4, False)
    with pytest.raises(ValueError, match=r"Strategy.tp=4 must divide the 2 heads of 'blocks.0.attn.k'"):
        check_plan(model := tiny_gpt(n_head=4, n_kv_head=2), model.parallel_plan(), 4, False)
    check_plan(model := tiny_gpt(vocab_size=49), model.parallel_plan(), 2, False)  # 25 + 24 rows
    with pytest.raises(ValueError, match=r"Strategy.tp=4 leaves a rank without rows of the 3 vocabulary rows"):
        check_plan(model := tiny_gpt(vocab_size=3, n_head=4), model.parallel_plan(), 4, False)


def test_multi_query_keys_and_values_are_replicated():
    names = check_plan(model := tiny_gpt(n_head=4, n_kv_head=1), model.parallel_plan(), 4, False)
    assert names["replicated"] == [f"blocks.{i}.attn.{p}" for i in (0, 1) for p in "kv"]
    assert "blocks.0.attn.k" not in names["colwise"]


class ScaledLinear(nn.Linear):
    """A linear with a learned output scale of its own, written outside the zoo."""

    def __init__(self, width: int, features: int) -> None:
        super().__init__(width, features)
        self.scale = nn.Parameter(torch.ones(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * self.scale


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down, self.norm = nn.Linear(8, 16), nn.Linear(16, 8), nn.LayerNorm(8)
        self.embed = nn.Embedding(10, 8, padding_idx=0)
        self.scaled = ScaledLinear(8, 16)


@pytest.mark.parametrize("plan,message", [
    (ModelPlan(), r"Strategy.tp=2 needs a tensor-parallel plan, but Pair declares no colwise"),
    (ModelPlan(colwise=("upp",)), r"ModelPlan.colwise pattern 'upp' matches no submodule of Pair"),
    (ModelPlan(colwise=("norm",)), r"ModelPlan.colwise names 'norm', a LayerNorm; it must name Linear modules"),
    (ModelPlan(vocab_parallel=("up",)), r"ModelPlan.vocab_parallel names 'up', a Linear; it must name Embedding"),
    (ModelPlan(vocab_parallel=("embed",)), r"'embed', an nn.Embedding with padding_idx"),
    (ModelPlan(colwise=("scaled",)), r"ModelPlan.colwise names 'scaled', a ScaledLinear holding parameters its split "
                                     r"does not cover: \['scaled.scale'\] \(it splits only weight, bias\)"),
    (ModelPlan(rowwise=("scaled",)), r"ModelPlan.rowwise names 'scaled', a ScaledLinear holding parameters"),
    (ModelPlan(colwise=("up",), tensor_parallel_refusals=("'up' is 'packed_colwise' in Pair's plan",)),
     r"Strategy.tp=2 cannot split Pair: 'up' is 'packed_colwise'"),
    (ModelPlan(colwise=("up",), replicated=("up",)), r"ModelPlan.replicated names linears that colwise or rowwise split"),
    (ModelPlan(colwise=("up",), regions=("",)), r"ModelPlan.regions pattern '' matches no submodule"),
    (ModelPlan(colwise=("up",), sequence_parallel=("norm",)), r"Strategy.sequence_parallel needs the plan of Pair"),
])
def test_bad_plans_are_refused_with_the_field_named(plan, message):
    with pytest.raises(ValueError, match=message):
        check_plan(Pair(), plan, 2, sequence_parallel="sequence" in message)


def test_split_features_must_divide():
    with pytest.raises(ValueError, match=r"Strategy.tp=3 must divide the 16 output features of 'up'"):
        check_plan(Pair(), ModelPlan(colwise=("up",)), 3, False)
    with pytest.raises(ValueError, match=r"Strategy.tp=3 must divide the 16 input features of 'down'"):
        check_plan(Pair(), ModelPlan(rowwise=("down",)), 3, False)


def test_a_region_holds_exactly_one_row_parallel_linear():
    model = nn.Module()
    model.block = Pair()
    with pytest.raises(ValueError, match=r"ModelPlan.regions names 'block', which holds 0 row-parallel linears"):
        check_plan(model, ModelPlan(colwise=("block.up",), regions=("block",)), 2, False)


def test_tp_must_divide_the_ranks():
    with pytest.raises(ValueError, match="Strategy.tp=2 must divide the number of ranks; got 1 ranks"):
        Trainer(tiny_gpt(), TrainConfig(global_batch_size=2, micro_batch_size=2, progress=False,
                                        output_dir="/tmp/memzoo-test-runs"), Strategy(tp=2))
    assert torch.distributed.is_initialized()


class GainedAttention(nn.Module):
    """An attention-like region with a learned gain of its own, written outside the zoo."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.o = nn.Linear(8, 16), nn.Linear(16, 8)
        self.gain = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o(torch.tanh(self.q(x)) * self.gain)


class GainedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn, self.norm = GainedAttention(), nn.LayerNorm(8)
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.norm(x)) * self.scale


class GainedModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.blocks, self.head = nn.Linear(4, 8), nn.ModuleList([GainedBlock()]), nn.Linear(8, 1)


GAINED = dict(blocks=("blocks.*",), colwise=("blocks.*.attn.q",), rowwise=("blocks.*.attn.o",),
              regions=("blocks.*.attn",), sequence_split=("embed",), sequence_gather=("blocks.0",))


def test_a_parameter_that_would_get_a_partial_gradient_is_refused_by_name():
    with pytest.raises(ValueError, match=r"partial gradient under tensor parallelism.*region 'blocks.0.attn': "
                                         r"\['blocks.0.attn.gain'\]"):
        check_plan(GainedModel(), ModelPlan(**GAINED), 2, False)
    check_plan(GainedModel(), ModelPlan(**GAINED, replicated=("blocks.*.attn",)), 2, False)
    with pytest.raises(ValueError, match=r"sequence shards: \['blocks.0.scale', 'blocks.0.norm.weight', "
                                         r"'blocks.0.norm.bias'\]"):
        check_plan(GainedModel(), ModelPlan(**GAINED, replicated=("blocks.*.attn",)), 2, True)
    check_plan(GainedModel(), ModelPlan(**GAINED, replicated=("blocks.*.attn",),
                                        sequence_parallel=("blocks.*", "blocks.*.norm")), 2, True)

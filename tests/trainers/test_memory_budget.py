"""Training under `Strategy(memory_budget=)`: a quarter of the unconstrained peak, the same losses
(planned for the training set's largest micro batch, or for a given example batch); the
per-operator recompute it rests on; its errors."""

from __future__ import annotations

import itertools
import logging
import typing

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import lm_examples, shakespeare_gpt, tiny_gpt
from trainers import Strategy, TrainConfig, Trainer
from trainers.estimate.budget import GPU_PLANNING_MARGIN, MemoryBudgetError, _fit_in_fresh_process
from trainers.estimate.held_budget import _reweighted
from trainers.loop.data import first_micro_batch
from trainers.estimate.process import run_fresh
from trainers.memory.recompute import OpCost, RecomputePolicy, apply_recompute, choose_saved_ops, uniform_keep
from zoo.parity import relative_error
from zoo.plan import ModelPlan


class CharMixer(nn.Module):
    """A model written here, not in the zoo: residual feed-forward blocks over embedded characters,
    each predicting the next."""

    def __init__(self, vocab: int, width: int = 32, hidden: int = 128, blocks: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, hidden), nn.GELU(),
                                                  nn.Linear(hidden, width)) for _ in range(blocks))
        self.head = nn.Linear(width, vocab)

    def parallel_plan(self) -> ModelPlan:
        return ModelPlan(blocks=("blocks.*",))

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.embed(input_ids)
        for block in self.blocks:
            hidden = hidden + block(hidden)
        logits = self.head(hidden)
        return {"loss": F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())}


def mixer_case():
    build_gpt, data, collate, rows = shakespeare_gpt(n_layer=1)
    vocab = build_gpt().config.vocab_size
    return (lambda: CharMixer(vocab)), data, collate, rows


def conformer_case():
    from asr.data import SpeechExamples, collate_speech, recorded_speech
    from asr.model import Transducer, TransducerConfig
    from asr.text import TranscriptTokenizer

    tokenizer = TranscriptTokenizer("char")
    data = list(SpeechExamples(recorded_speech(), tokenizer))[:6]  # every step holds the same 6 recordings
    config = TransducerConfig.sized("tiny", vocab_size=tokenizer.vocab_size, encoder_layers=5, encoder_width=64,
                                    decoder_dim=64, joiner_dim=64, loss="samplewise", spec_augment=None)
    return (lambda: Transducer(config)), data, collate_speech, len(data)


def train(case, budget, tmp_path, example: bool):
    """`Trainer.fit` of `case` for 2 steps under `budget` (None: unconstrained); `example`: plan for
    the first micro batch, given, rather than for the training set's largest."""
    build, data, collate, rows = case
    config = TrainConfig(global_batch_size=rows, micro_batch_size=rows, max_steps=2, lr=1e-3, warmup_steps=1,
                         log_every=1, progress=False, output_dir=str(tmp_path / f"run-{budget}"))
    torch.manual_seed(0)
    trainer = Trainer(build(), config, Strategy(memory_budget=budget),
                      example_batch=first_micro_batch(data, rows, collate) if example else None)
    history = trainer.fit(data, collate_fn=collate)
    return trainer, history


def held_quarter(case, tmp_path, caplog, example: bool):
    """The unconstrained run and the run under a quarter of its measured peak: (trainer, losses) of
    each; asserts the budget held, planned and measured."""
    free, free_history = train(case, None, tmp_path, example)
    budget = free.memory_report()[0]["peak"] // 4
    with caplog.at_level(logging.INFO, logger="trainers"):
        held, history = train(case, budget, tmp_path, example)
    peaks = [record["measured_peak_bytes"] for record in history]
    assert len(peaks) == 2 and max(peaks) <= budget, (peaks, budget, held.budget.plan.describe())
    assert held.budget.plan.peak <= budget
    assert "memory budget" in caplog.text and "estimated peak" in caplog.text
    return held, [r["loss"] for r in history], [r["loss"] for r in free_history]


@pytest.mark.sequential
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", [conformer_case], ids=["conformer"])
def test_a_quarter_of_the_peak_trains_with_the_same_losses(case, tmp_path, caplog):
    """The Conformer with its sample-wise loss (the chunks of the model's own chunked operations set
    by the budget), planned for a given example batch. GPT and the folding model at a quarter:
    `python benchmarks/memory_budget.py`."""
    held, losses, free_losses = held_quarter(case(), tmp_path, caplog, example=True)
    assert any(keep != "all" for keep in held.budget.plan.keep.values())  # it had to recompute
    assert relative_error(torch.tensor(losses), torch.tensor(free_losses)) <= 1e-6, (losses, free_losses)


@pytest.mark.sequential
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", [lambda: shakespeare_gpt(n_layer=4, dropout=0.0),
                                  mixer_case],
                         ids=["gpt-4", "written-here"])
def test_a_quarter_of_the_peak_trains_planned_from_the_training_set(case, tmp_path, caplog):
    """No example batch: the trainer plans at fit for the training set's largest micro batch, and
    lowers the micro batch (same global batch, more accumulated) where no plan holds the configured
    one, as 4 blocks of 32 x 128 characters need. Without dropout the losses differ only by the
    order of summation. (32 blocks: `benchmarks/budget_from_training_set.py 32`.)"""
    held, losses, free_losses = held_quarter(case(), tmp_path, caplog, example=False)
    lowered = held.config.micro_batch_size < 32
    assert held.budget.plan.micro_batch_size == held.config.micro_batch_size
    assert lowered == ("micro batches of" in caplog.text and "configured: 32" in caplog.text)
    tolerance = 1e-5 if lowered else 1e-6
    for loss, free in zip(losses, free_losses, strict=True):
        assert abs(loss - free) <= tolerance * abs(free), (losses, free_losses, held.budget.plan.describe())


@pytest.mark.sequential
def test_a_budget_below_the_floor_names_the_smallest_peak_and_a_world_that_fits(tmp_path):
    examples = lm_examples(8)
    config = TrainConfig(global_batch_size=4, micro_batch_size=4, max_steps=1, progress=False,
                         output_dir=str(tmp_path / "run"))
    with pytest.raises(MemoryBudgetError, match=r"memory_budget=0\.1 MiB per rank is below .* the smallest peak found is "
                                                r"[0-9.]+ MiB .* model states; .*(ranks|micro batch)"):
        Trainer(tiny_gpt(), config, Strategy(memory_budget=100_000), example_batch=first_micro_batch(examples, 4))
    unplanned = Trainer(tiny_gpt(), config, Strategy(memory_budget="1GiB"))  # plans at fit
    with pytest.raises(RuntimeError, match="memory_budget without Trainer\\(example_batch=...\\) plans .* at fit"):
        unplanned.full_state_dict()
    assert unplanned.num_parameters() == sum(p.numel() for p in tiny_gpt().parameters())
    with pytest.raises(ValueError, match="accepted|KiB, MiB, GiB"):
        Strategy(memory_budget="6 parsecs")
    assert Strategy(memory_budget="1.5 KiB").memory_budget == 1536


def plan(model, batch, rows: int, budget: int, workspaces: int = 0, device_type: str = "cpu"):
    """The budget plan of one process, or the refusal's message (as `fit_budget` plans, in a fresh
    process; `workspaces` as a GPU would measure them; the trace runs on the CPU whatever
    `device_type` the plan is for)."""
    config = TrainConfig(global_batch_size=rows, micro_batch_size=rows, max_steps=1, progress=False)
    return run_fresh(_fit_in_fresh_process, model, batch, Strategy(memory_budget=budget), 1, config, device_type,
                     workspaces)


def test_a_budget_that_chunks_alone_hold_keeps_every_activation():
    """A GPT of 4096 tokens: chunking its logits takes the peak from 21.8 to about 8 MiB. At half the
    peak, full recompute is traced first (it also prices the operators) and keeping everything in
    chunks, which fits, is the plan: no recompute."""
    batch = first_micro_batch(lm_examples(8, length=128, vocab=4096), 8)
    model = tiny_gpt(vocab_size=4096, block_size=128)
    free = plan(model, batch, 8, 2**33)
    half = plan(model, batch, 8, free.peak // 2)
    assert set(half.keep.values()) == {"all"} and half.chunk_bytes is not None and half.peak <= free.peak // 2
    assert [line.split(", ")[2] for line in half.tried] == ["keep everything", "recompute every block", "keep everything"]
    assert "no recompute" in half.describe()


def test_the_gpus_cublas_workspaces_count_in_every_planned_peak():
    """On a GPU the budget holds the allocator's peak, which counts cuBLAS's workspaces beside the
    traced tensors: the plan adds them (here given, as a GPU would measure them)."""
    batch = first_micro_batch(lm_examples(8), 4)
    workspaces = 64 * 2**20
    free = plan(tiny_gpt(), batch, 4, 2**30)
    assert plan(tiny_gpt(), batch, 4, 2**30, workspaces).peak == free.peak + workspaces
    refusal = plan(tiny_gpt(), batch, 4, free.peak * 2 + workspaces // 2, workspaces)  # room for the tensors only
    assert isinstance(refusal, str), refusal
    assert "64.0 MiB cuBLAS workspaces" in refusal and "activations, temporaries and workspaces alone" in refusal


def test_a_gpu_plan_leaves_the_gpus_wider_margin():
    """A budget 5% above the peak of keeping everything: within the CPU's 3% margin that plan
    stands, within the GPU's 8% it does not, and the GPU plan recomputes."""
    batch = first_micro_batch(lm_examples(8), 4)
    free = plan(tiny_gpt(), batch, 4, 2**30)
    budget = int(free.peak / 0.95)
    on_cpu, on_gpu = plan(tiny_gpt(), batch, 4, budget), plan(tiny_gpt(), batch, 4, budget, device_type="cuda")
    assert set(on_cpu.keep.values()) == {"all"} and on_cpu.peak == free.peak
    assert set(on_gpu.keep.values()) != {"all"} and on_gpu.peak <= budget * (1 - GPU_PLANNING_MARGIN)


def test_keeping_chosen_operators_gives_the_plain_gradients():
    model = tiny_gpt(dropout=0.1)
    batch = {key: torch.stack([e[key] for e in lm_examples(4)]) for key in ("input_ids", "labels")}

    def gradients(module):
        torch.manual_seed(3)
        module.zero_grad()
        module(**batch)["loss"].backward()
        return [p.grad.clone() for p in module.parameters()]

    plain = gradients(model)
    names = model.parallel_plan().recompute_names(model)
    policy = RecomputePolicy(uniform_keep(names, "blocks"), profile=True)
    apply_recompute(model, policy)
    assert all(torch.equal(a, b) for a, b in zip(gradients(model), plain, strict=True))
    costs = policy.profiles[names[0]]
    assert costs and all(cost.flops > 0 and cost.bytes > 0 for cost in costs)
    half = choose_saved_ops(policy.profiles, sum(cost.bytes for cost in costs))
    assert 0 < sum(map(len, half.values())) < sum(len(c) for c in policy.profiles.values())
    for keep in (half, dict.fromkeys(names, "all"), dict.fromkeys(names, "matmuls")):
        policy.keep.update(keep)  # changed between steps, without rebuilding the model
        assert all(torch.equal(a, b) for a, b in zip(gradients(model), plain, strict=True))


def test_the_knapsack_keeps_the_most_flops_within_the_bytes():
    generator = torch.Generator().manual_seed(0)
    sizes = torch.randint(1, 50, (2, 6), generator=generator).tolist()
    flops = torch.randint(1, 100, (2, 6), generator=generator).tolist()
    profiles = {f"b{b}": [OpCost(("aten.mm.default", i), sizes[b][i] * 1000, flops[b][i]) for i in range(6)]
                for b in range(2)}
    items = [(block, cost) for block, costs in profiles.items() for cost in costs]
    for capacity in (0, 20_000, 77_000, 150_000, 10**6):
        chosen = choose_saved_ops(profiles, capacity)
        kept = [cost for block, cost in items if cost.key in chosen[block]]
        assert sum(cost.bytes for cost in kept) <= capacity
        best = max(sum(c.flops for _, c in subset) for r in range(len(items) + 1)
                   for subset in itertools.combinations(items, r) if sum(c.bytes for _, c in subset) <= capacity)
        assert sum(cost.flops for cost in kept) == best, capacity


def test_the_dropout_mask_of_chunked_attention_does_not_depend_on_the_chunks():
    from zoo.nn import chunk_memory
    from zoo.nn.attention import attention

    q, k, v = (torch.randn(2, 3, 40, 8, generator=torch.Generator().manual_seed(i), requires_grad=True) for i in range(3))
    results = []
    for chunk in (None, 4 * 2 * 3 * 40 * 3):  # whole, then 3 query rows per chunk
        chunk_memory.set_chunk_bytes(chunk)
        torch.manual_seed(0)
        try:
            out = attention(q, k, v, causal=True, dropout_p=0.3)
            results.append([out, *torch.autograd.grad(out.square().sum(), (q, k, v))])
        finally:
            chunk_memory.set_chunk_bytes(None)
    for whole, chunked in zip(*results):
        assert relative_error(chunked, whole) < 1e-6


def test_the_command_line_takes_a_budget_with_a_unit_or_in_bytes():
    from zoo.recipes import _convert

    hint = typing.get_type_hints(Strategy)["memory_budget"]
    assert _convert("6GiB", hint, "strategy.memory_budget") == "6GiB"
    assert _convert("1048576", hint, "strategy.memory_budget") == 2**20
    assert _convert("none", hint, "strategy.memory_budget") is None
    assert Strategy(memory_budget=_convert("6GiB", hint, "strategy.memory_budget")).memory_budget == 6 * 2**30


def test_a_lowered_micro_batch_says_when_it_changes_the_objective():
    """Labels that ignore positions (-100) make a per-micro-batch mean loss depend on the split: the
    budget's warning that it lowered the micro batch then says so; labels that ignore none do not."""
    labels = torch.tensor([[1, 2, -100], [3, -100, -100]])
    assert "micro_batch_size=4" in _reweighted({"labels": labels}, 4, 16)
    assert _reweighted({"labels": labels.clamp(min=0)}, 4, 16) == "" and _reweighted(None, 4, 16) == ""

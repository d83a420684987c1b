"""The planner: layouts that fit a budget, ranked by the cost model; budgets and devices checked."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import torch

from helpers import TINY
from nlp.gpt import GPT
from trainers import Strategy
from trainers.estimate.devices import DEVICES, DeviceSpec, device_spec, parse_bytes
from trainers.estimate.trace import MemoryEstimate
from trainers.memory.measure import RankMemory
from trainers.estimate.planner import SearchSpace, compute_seconds, plan

CPU = DeviceSpec("cpu", 1 << 34, 1e11, 5e10, 1e9, 1e9, 4e9, 2, False, 1e-4, 5e9, 2e-6)
"""A fixed CPU-like device, so that the ranking does not depend on this machine's load."""
SPACE = SearchSpace(zero=(0, 3), offload=("none",), recompute=("none", "blocks"), pp=(1,), micro_batch_sizes=(4, 2))


def tiny_batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, TINY.vocab_size, (4, TINY.block_size), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids}


@pytest.mark.timeout(300)
def test_plans_fit_the_budget_and_come_fastest_first():
    plans = plan(functools.partial(GPT, TINY), tiny_batch(), 2, 10 << 20, CPU, space=SPACE, top=20)
    assert len(plans) >= 6  # dp2 x {zero 0, 3} and tp2 x zero 0, each x recompute x micro 4 / 2
    assert all(p.peak <= 10 << 20 for p in plans)
    totals = [p.time.total for p in plans]
    assert totals == sorted(totals)
    by_flags = {p.train_flags(): p for p in plans}
    one = by_flags["--nproc 2 --strategy.zero 0 --strategy.offload none --strategy.recompute none "
                   "--strategy.precision fp32 --train.micro_batch_size 4"]
    again = by_flags["--nproc 2 --strategy.zero 0 --strategy.offload none --strategy.recompute blocks "
                     "--strategy.precision fp32 --train.micro_batch_size 4"]
    assert again.estimate.work[0].flops > one.estimate.work[0].flops  # recompute runs the blocks' forward twice
    assert again.peak < one.peak
    sharded = by_flags["--nproc 2 --strategy.zero 3 --strategy.offload none --strategy.recompute none "
                       "--strategy.precision fp32 --train.micro_batch_size 2"]
    assert sharded.accumulation == 2 and sharded.time.data_parallel > one.time.data_parallel


@pytest.mark.timeout(300)
def test_pipelined_plans_carry_their_split_and_their_bubble():
    space = SearchSpace(zero=(0,), offload=("none",), recompute=("none",), pp=(1, 2), micro_batch_sizes=(2,))
    plans = plan(functools.partial(GPT, TINY), tiny_batch(), 2, 10 << 20, CPU, space=space, top=20)
    by_schedule = {p.strategy.pp_schedule: p for p in plans if p.strategy.pp == 2}
    assert set(by_schedule) == {"gpipe", "1f1b", "zero_bubble"}
    plain = next(p for p in plans if p.strategy.pp == 1)
    gpipe, one_f_one_b = by_schedule["gpipe"], by_schedule["1f1b"]
    # TINY has 2 blocks: one a stage, traced on both pipeline ranks; 4 micro batches of 2 a step.
    assert one_f_one_b.strategy.pp_split == (1, 1) and len(one_f_one_b.estimate.ranks) == 2
    assert one_f_one_b.train_flags().startswith("--nproc 2 --pp 2 --pp-schedule 1f1b --strategy.pp_split 1,1 ")
    assert one_f_one_b.accumulation == 4 and plain.accumulation == 2
    # GPipe keeps all 4 micro batches' activations on the first stage, 1F1B at most 2.
    assert gpipe.peak > one_f_one_b.peak
    assert one_f_one_b.time.pipeline > 0 == plain.time.pipeline
    # The bubble: 1F1B's ranks idle (p - 1) / m of their busy time at unit pass costs.
    busiest = max(one_f_one_b.estimate.work, key=lambda work: compute_seconds(work, one_f_one_b.strategy, CPU))
    assert one_f_one_b.time.compute == pytest.approx(busiest.flops / CPU.fp32_flops + busiest.memory_bytes / CPU.memory_bandwidth
                                                     + busiest.calls * CPU.op_seconds)
    assert one_f_one_b.time.pipeline >= one_f_one_b.time.compute * (2 - 1) / 4


@pytest.mark.timeout(300)
def test_the_first_guess_prices_tensor_parallel_collectives():
    # One trace allowed: the layout traced is the first guess's fastest. Tensor parallelism saves
    # the data-parallel gradient all-reduce but calls an all-reduce per block and pass; at 50 ms a
    # call it is the slower layout, and the first guess must know it before tracing. (Operator
    # calls are free here: with its 2 micro batches to 1, the tensor-parallel rank calls more.)
    slow_calls = replace(CPU, latency=0.05, op_seconds=0.0)
    space = SearchSpace(zero=(0,), offload=("none",), recompute=("none",), pp=(1,), micro_batch_sizes=(4,))
    (chosen,) = plan(functools.partial(GPT, TINY), tiny_batch(), 2, 10 << 20, slow_calls, space=space, max_traces=1)
    assert chosen.strategy.tp == 1
    both = plan(functools.partial(GPT, TINY), tiny_batch(), 2, 10 << 20, slow_calls, space=space, max_traces=2)
    assert [p.strategy.tp for p in both] == [1, 2] and both[1].time.tensor_parallel > both[0].time.total


@pytest.mark.timeout(300)
def test_a_budget_below_every_layout_names_what_would_fit():
    with pytest.raises(ValueError, match=r"memory_budget=0.29 MiB per rank fits no layout on world_size=2; the smallest "
                                         r"traced peak is \d+.\d\d MiB \(--nproc 2 .*\)"):
        plan(functools.partial(GPT, TINY), tiny_batch(), 2, 300 << 10, CPU, space=SPACE, max_traces=4)
    with pytest.raises(ValueError, match=r"memory_budget=0.10 MiB per rank is below the model states alone of every "
                                         r"layout on world_size=2: at least 0.2\d MiB per rank \(ZeRO-3\)"):
        plan(functools.partial(GPT, TINY), tiny_batch(), 2, 100 << 10, CPU, space=SPACE)


@pytest.mark.ranks  # measures this machine: its cores and a 4-rank gloo link
def test_budgets_and_devices_are_checked():
    assert parse_bytes("6GiB") == 6 << 30 and parse_bytes("512 mib") == 512 << 20 and parse_bytes("80GB") == 80 * 10**9
    for bad in ("six", "6 parsecs", "-1GiB", 0, True):
        with pytest.raises(ValueError, match=r"memory_budget must be a positive number of bytes or a string with a unit "
                                             r"\(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"):
            parse_bytes(bad)
    assert device_spec("h100") is DEVICES["h100"]
    with pytest.raises(ValueError, match="device must be one of 'h100', 'a100', 'cpu' or a trainers.DeviceSpec; got 'tpu'"):
        device_spec("tpu")
    measured = device_spec("cpu", ranks=4)
    assert measured.fp32_flops > 1e8 and measured.host_bandwidth > 1e7
    assert measured.node_bandwidth > 1e6 and 0 < measured.latency < 0.1


def test_the_budget_holds_the_device_share_of_an_offloaded_peak():
    at_peak = {"cuda:0": {"parameters": 100, "activations": 300}, "cpu": {"optimizer": 800}}
    rank = RankMemory(rank=0, parameters=100, gradients=0, optimizer=800, other=0, activation_peak=300, peak=1200,
                      by_device=at_peak, cuda_max_allocated=None)
    estimate = MemoryEstimate(Strategy(offload="optimizer"), 1, [rank], [0], [{}], 1, 0.0)
    assert estimate.peak == 1200 and estimate.device_peak == 400
    on_cpu = MemoryEstimate(Strategy(), 1, [RankMemory(0, 1, 0, 8, 0, 3, 12, {"cpu": {"optimizer": 8, "activations": 4}},
                                                       None)], [0], [{}], 1, 0.0)
    assert on_cpu.device_peak == 12


class NeedsFourRows(torch.nn.Module):
    """A model that refuses micro batches of fewer than 4 rows, as a user's model may."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        if x.shape[0] < 4:
            raise ValueError(f"NeedsFourRows takes at least 4 rows; got {x.shape[0]}")
        return {"loss": self.net(x).square().mean()}


@pytest.mark.timeout(300)
def test_an_error_of_the_model_is_raised_not_taken_for_a_layout_that_does_not_fit():
    space = replace(SPACE, zero=(0,), recompute=("none",), micro_batch_sizes=(2,))
    with pytest.raises(RuntimeError, match=r"planning failed:(.|\n)*NeedsFourRows takes at least 4 rows; got 2"):
        plan(NeedsFourRows, {"x": torch.randn(4, 8)}, 2, 10 << 20, CPU, space=space)


@pytest.mark.timeout(300)
def test_a_model_with_experts_is_planned_with_its_experts_shared_out():
    """GPT with 4 experts a block on 2 ranks: the search tries ep=1 and ep=2; at ep=2 each rank holds
    half the experts' states (ZeRO-3 over the one rank that holds the same experts) and pays the
    all-to-alls, which the cost model prices on their own."""
    config = replace(TINY, n_experts=4, moe_top_k=2)
    space = SearchSpace(zero=(0,), offload=("none",), recompute=("none",), tp=(1,), pp=(1,), micro_batch_sizes=(4,))
    plans = {p.strategy.ep: p for p in plan(functools.partial(GPT, config), tiny_batch(), 2, 64 << 20, CPU, space=space,
                                            top=20)}
    assert set(plans) == {1, 2}
    shared, whole = plans[2], plans[1]
    assert shared.train_flags().startswith("--nproc 2 --ep 2 --strategy.zero 0 ")
    assert shared.time.expert_parallel > 0 == whole.time.expert_parallel
    model = GPT(config)
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    dense = sum(p.numel() for p in model.parameters()) - experts
    for p in (shared, whole):  # fp32 at ZeRO 0: 16 bytes a parameter, the experts' 1/ep share
        assert p.estimate.ranks[0].parameters == pytest.approx(4 * (dense + experts / p.strategy.ep), rel=0.01)

"""Measured model-state bytes per rank against the ZeRO formula."""

from __future__ import annotations

import pytest
import torch

from trainers import Strategy, zero_model_states

WORKER_RUNS = [(2, "memory", "{out}/memory-z3.pt", "3"), (2, "memory", "{out}/memory-z1.pt", "1")]
"""The memory reports of 2 ranks at ZeRO 3 and at ZeRO 1 (conftest.py)."""


@pytest.fixture(scope="module")
def measured(worker_runs) -> dict[int, dict]:
    return {zero: torch.load(worker_runs / f"memory-z{zero}.pt") for zero in (3, 1)}


def test_zero3_model_states_are_16_bytes_per_parameter_over_ranks(measured):
    result = measured[3]
    expected = 16 * result["numel"] / 2
    assert zero_model_states(result["numel"], Strategy(zero=3), 2)["total"] == expected
    for report in result["reports"]:
        model_states = report["parameters"] + report["gradients"] + report["optimizer"]
        assert abs(model_states - expected) / expected < 0.10, report
        assert report["activation_peak"] > 0


def test_zero1_shards_optimizer_state_and_reduce_scatters_the_steps_gradients(measured):
    """ZeRO-1 accumulates whole gradients over a step's micro batches, then reduce-scatters them
    once: at the update each rank holds its half (the parameters' dim-0 shards)."""
    result = measured[1]
    numel = result["numel"]
    reports = result["reports"]
    for report in reports:
        assert report["gradients"] == 4 * numel // 2
    # Each rank holds the Adam moments of its own parameters only; together, all of them.
    total_optimizer = sum(r["optimizer"] for r in reports)
    assert abs(total_optimizer - 8 * numel) / (8 * numel) < 0.01
    assert max(r["optimizer"] for r in reports) < 0.6 * 8 * numel

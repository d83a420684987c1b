"""Each block's activations kept, swapped or recomputed (`trainers.memory.activations.plan`): the choice
under a budget, the settings refused, and training that matches training in memory whatever each
block does."""

from __future__ import annotations

import pytest

from helpers import chunk_budget, device_budget, lm_examples, tiny_gpt
from trainers import Strategy, TrainConfig, Trainer
from trainers.memory.activations.host import HostSwap
from trainers.memory.activations.plan import BlockCost, choose_block_activations, parse_block_activations
from zoo.parity import relative_error


def test_blocks_keep_what_costs_most_to_lose_and_the_rest_take_the_cheaper_way():
    costs = [BlockCost("a", 100, 0.5), BlockCost("b", 100, 3.0), BlockCost("c", 200, 0.2), BlockCost("d", 50, 0.3)]
    # A byte written and read back costs 0.01 s: swapping a, b, c, d would take 1, 1, 2, 0.5 s, so losing
    # them costs 0.5 (recompute), 1 (swap), 0.2 (recompute), 0.3 s (recompute): 0.005, 0.01, 0.001, 0.006 s a byte.
    assert choose_block_activations(costs, room=150, seconds_per_byte=0.01) == {
        "a": "recompute", "b": "keep", "c": "recompute", "d": "keep"}
    assert choose_block_activations(costs, room=0, seconds_per_byte=0.01) == {
        "a": "recompute", "b": "swap", "c": "recompute", "d": "recompute"}
    assert choose_block_activations(costs, room=10**6, seconds_per_byte=0.01) == dict.fromkeys("abcd", "keep")
    assert choose_block_activations(costs, room=0, seconds_per_byte=0.0) == dict.fromkeys("abcd", "swap")


def test_bad_block_choices_are_refused():
    with pytest.raises(ValueError, match=r"Strategy.activation_memory or Strategy.block_activations \(one of them\) "
                                         r"chooses .* with recompute='none'; got activation_memory=1048576, "
                                         r"offload='chunks', recompute='blocks'"):
        Strategy(offload="chunks", offload_dir="x", memory_budget="1GiB", activation_memory="1MiB", recompute="blocks")
    with pytest.raises(ValueError, match=r"one of them"):
        Strategy(activation_memory="1MiB")
    with pytest.raises(ValueError, match=r"entries must read 'NAME=keep', 'NAME=swap' or 'NAME=recompute'; "
                                         r"got \['blocks.0=drop'\]"):
        Strategy(offload="chunks", offload_dir="x", memory_budget="1GiB", block_activations=("blocks.0=drop",))
    with pytest.raises(ValueError, match=r"must give each block of the model \(blocks.0, blocks.1\) one of keep, swap, "
                                         r"recompute, once; got \['blocks.0=keep'\]"):
        parse_block_activations(("blocks.0=keep",), ["blocks.0", "blocks.1"])


def config(**overrides) -> TrainConfig:
    return TrainConfig(**{"max_steps": 4, "global_batch_size": 8, "micro_batch_size": 4, "lr": 1e-3, "warmup_steps": 1,
                          "grad_clip": 0.5, "log_every": 1, "progress": False, **overrides})


@pytest.mark.timeout(300)
def test_blocks_that_keep_swap_or_recompute_train_as_in_memory(tmp_path):
    """GPT (4 blocks, dropout): blocks set by hand to keep, swap, recompute, swap (to files; and,
    under a device tier, to host memory), and blocks chosen under a budget for a quarter of what they
    save, each match training in memory to 1e-6; under the budget, and with the device's blocks
    swapping to host memory, the step's tensors peak lower than with every block keeping."""
    build = lambda: tiny_gpt(n_embd=128, n_layer=4, vocab_size=512, block_size=32, dropout=0.1)  # noqa: E731
    data = lm_examples(64, length=32, vocab=512)
    plain = Trainer(build(), config(output_dir=str(tmp_path / "plain")))
    expected, reference = plain.fit(data), plain.full_state_dict()

    def chunked(name: str, **choice) -> Trainer:
        strategy = Strategy(offload="chunks", offload_dir=str(tmp_path / name), memory_budget=chunk_budget(2**26), **choice)
        trainer = Trainer(build(), config(output_dir=str(tmp_path / f"{name}-run")), strategy)
        trainer.history = trainer.fit(data)
        assert [r["loss"] for r in trainer.history] == pytest.approx([r["loss"] for r in expected], rel=1e-6), name
        params = trainer.full_state_dict()
        for key, value in reference.items():
            assert relative_error(params[key], value) < 1e-6, (name, key)
        return trainer

    by_hand_choices = ("blocks.0=keep", "blocks.1=swap", "blocks.2=recompute", "blocks.3=swap")
    by_hand = chunked("by-hand", block_activations=by_hand_choices)
    assert by_hand.block_activations.choices == {"blocks.0": "keep", "blocks.1": "swap", "blocks.2": "recompute",
                                         "blocks.3": "swap"}
    assert all(r["swapped_activation_bytes"] > 0 for r in by_hand.history)
    to_host = chunked("to-host", block_activations=tuple(f"blocks.{i}=swap" for i in range(4)),
                      device_memory_budget=device_budget(2**26))
    assert isinstance(to_host.chunks.swap, HostSwap)
    assert all(r["swapped_activation_bytes"] > 0 for r in to_host.history)
    assert not list((tmp_path / "to-host").glob("*/activations/*"))  # host memory, not files
    kept = chunked("kept", activation_memory=2**40)
    assert set(kept.block_activations.choices.values()) == {"keep"}
    assert all(r["swapped_activation_bytes"] == 0 for r in kept.history)
    saved = sum(cost.saved_bytes for cost in kept.block_activations.costs)
    assert all(cost.saved_bytes > 2**16 and cost.forward_seconds > 0 for cost in kept.block_activations.costs)
    budgeted = chunked("budget", activation_memory=saved // 4)
    plan = budgeted.block_activations.choices
    assert sorted(plan) == [f"blocks.{i}" for i in range(4)] and list(plan.values()).count("keep") == 1
    assert _peak(budgeted) < _peak(kept)
    assert _peak(to_host) < _peak(kept) / 2


def _peak(trainer: Trainer) -> int:
    """The most bytes of the step's other tensors alive at once in the first step."""
    return max(moment.other_bytes for moment in trainer.chunks.placement.moments)

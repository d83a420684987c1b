"""Chunked model states on 2 data-parallel ranks (each rank its own chunk files), every rank
keeping all chunks or ZeRO-3 over the chunks, train as one process in memory does."""

from __future__ import annotations

import pytest
import torch

from zoo.parity import relative_error

MODES = ("memory", "chunks", "zero3", "zero3-swap", "chunks-device", "zero3-device", "zero3-plan")
WORKER_RUNS = [run for model in ("gpt", "conformer") for run in (
    (1, "chunks", f"{{out}}/chunks-{model}-one.pt", f"{{out}}/chunks-{model}-one", model, "memory"),
    (2, "chunks", f"{{out}}/chunks-{model}-two.pt", f"{{out}}/chunks-{model}-two", model, *MODES))] + [
    (2, "chunks_checkpoint", "{out}/chunks-checkpoint", "{out}/chunks-checkpoint-runs.pt"),
    (1, "routed", "{out}/routed-one.pt", "{out}/routed", "memory"),
    (2, "routed", "{out}/routed-two.pt", "{out}/routed", "chunks")]
"""Each model in memory in one process, and in memory and every chunked mode on 2 ranks; the
chunk checkpoints on 2 ranks (conftest.py)."""


@pytest.mark.parametrize("model", ["gpt", "conformer"])
def test_two_ranks_with_chunked_states_match_one_process_in_memory(worker_runs, model):
    """GPT (1.6M parameters, 26 MB of states against 8 MiB of room; dropout, clipping, a tied
    vocabulary embedding) and the Conformer transducer with the sample-wise pruned loss (3.4 MiB of
    states, 4 MiB of room): 3 steps on 2 ranks chunked and ZeRO-3 over chunks (and with saved
    activations swapped to disk; each with a device tier too small for the states, host memory
    standing for the device, copying chunks up and down every step; and with every block swapping or
    recomputing its activations) match the same 2 ranks in memory to 1e-6, which match one process to 1e-5 (the batch's sum splits in another order); under ZeRO-3 each rank's
    files hold about half the states that every rank holds when not sharded, each rank's under a
    folder of its own, all removed when the ranks exit."""
    single = torch.load(worker_runs / f"chunks-{model}-one.pt")["memory"]
    two = torch.load(worker_runs / f"chunks-{model}-two.pt")
    runs = [("memory", single, 1e-5), ("chunks", two["memory"], 1e-6), ("zero3", two["memory"], 1e-6),
            ("zero3-swap", two["memory"], 1e-6), ("chunks-device", two["memory"], 1e-6),
            ("zero3-device", two["memory"], 1e-6), ("zero3-plan", two["memory"], 1e-6)]
    for mode, reference, tolerance in runs:
        assert two[mode]["losses"] == pytest.approx(reference["losses"], rel=tolerance), mode
        for name, expected in reference["params"].items():
            if expected.is_floating_point():
                assert relative_error(two[mode]["params"][name], expected) < tolerance, (mode, name)
    assert single["losses"][-1] < single["losses"][0]
    replicated, sharded = two["chunks"]["disk"], two["zero3"]["disk"]
    for mode in ("chunks", "zero3"):  # states beyond the room are read back every step
        if two[mode]["disk"][0] > two[mode]["room"]:
            assert all(read > 0 for read in two[mode]["read"][1:]), mode
    assert replicated[0] > two["chunks"]["room"]
    assert all(swapped > 0 for swapped in two["zero3-swap"]["swapped"])
    for mode in ("chunks-device", "zero3-device"):
        assert all(up > 0 for up in two[mode]["device_up_bytes"]) and any(two[mode]["device_down_bytes"]), mode
        assert any(two[mode]["device_updated_chunks"]), mode
    assert replicated[0] == replicated[1] > 0
    assert 0.4 < sharded[0] / replicated[0] < 0.6 and 0.4 < sharded[1] / replicated[0] < 0.6
    assert two["zero3"]["folders"] == ["rank00000", "rank00001"]  # while training: each rank's own files
    assert not list((worker_runs / f"chunks-{model}-two" / "zero3").iterdir())  # removed as the ranks exit


def test_zero3_chunk_checkpoints_and_fsdp_checkpoints_resume_each_other(worker_runs):
    """Under ZeRO-3 over chunks each rank writes the tensors of the chunks it owns: the step-2
    checkpoint resumes under FSDP ZeRO-3 in memory and under chunks again, and FSDP's resumes under
    chunks, each continuing its saving run's steps 3-4 to 1e-6; evaluation (ranks gathering chunks
    for a forward one of them does not count) matches FSDP's."""
    runs = torch.load(worker_runs / "chunks-checkpoint-runs.pt")
    assert runs["chunks"]["losses"] == pytest.approx(runs["fsdp"]["losses"], rel=1e-6)
    assert runs["chunks"]["eval"] == pytest.approx(runs["fsdp"]["eval"], rel=1e-6)
    for saved in ("fsdp", "chunks"):
        for name in ("fsdp", "chunks"):
            resumed = runs[f"{name}<-{saved}"]
            assert resumed["losses"] == pytest.approx(runs[saved]["losses"][2:], rel=1e-6), (name, saved)
            for key, expected in runs[saved]["params"].items():
                assert relative_error(resumed["params"][key], expected) < 1e-6, (name, saved, key)


def test_ranks_that_train_different_parameters_reduce_them_alike(worker_runs):
    """Each micro batch trains one of two heads, so the two ranks' last micro batches complete
    different gradient chunks in a step, and a head trained on one rank only gets no gradient on the
    other: the chunks are reduced in one order on both ranks, every head any rank trained is updated
    on both, and the replicas match one process in memory."""
    one, two = torch.load(worker_runs / "routed-one.pt"), torch.load(worker_runs / "routed-two.pt")
    chunk_of = two["chunk_of"]
    assert chunk_of["head_a.weight"] != chunk_of["head_b.weight"]
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-5)
    expected = one["params"][0]
    for rank, params in enumerate(two["params"]):
        for name, value in expected.items():
            assert relative_error(params[name], value) < 1e-5, (rank, name)

"""Training with the model states in chunks on disk (Strategy(offload="chunks")) is training in
memory: the same losses and parameters, step for step, while the chunks go through files."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import default_collate

from helpers import chunk_budget, device_budget, lm_examples, tiny_gpt
from parity_models import GainedRegression
from trainers import Strategy, TrainConfig, Trainer
from trainers.memory.chunks.update import KINDS
from zoo.parity import relative_error


def config(**overrides) -> TrainConfig:
    return TrainConfig(**{"max_steps": 5, "global_batch_size": 8, "micro_batch_size": 4, "lr": 1e-3, "warmup_steps": 1,
                          "grad_clip": 0.5, "log_every": 1, "progress": False, **overrides})


def trained_in_memory_and_chunked(tmp_path, **strategy) -> tuple[list[dict], Trainer, list[dict]]:
    """A GPT of 1.6M parameters (26 MB of states, in chunks of 1.6 MB) trained for 5 steps of 2
    micro batches with dropout, in memory and with `Strategy(offload="chunks", **strategy)` and 8 MiB
    of host memory for the states beside the step's tensors: the history in memory, the chunked
    trainer and its history, once their losses and final parameters are checked to match to 1e-6."""
    build = lambda: tiny_gpt(n_embd=128, n_layer=4, vocab_size=512, block_size=32, dropout=0.1)  # noqa: E731
    data = lm_examples(64, length=32, vocab=512)
    plain = Trainer(build(), config(output_dir=str(tmp_path / "plain")))
    expected = plain.fit(data)
    chunked = Trainer(build(), config(output_dir=str(tmp_path / "chunked")),
                      Strategy(offload="chunks", offload_dir=str(tmp_path / "chunks"), memory_budget=chunk_budget(8 * 2**20),
                               **strategy))
    history = chunked.fit(data)
    assert [r["loss"] for r in history] == pytest.approx([r["loss"] for r in expected], rel=1e-6)
    params, reference = chunked.full_state_dict(), plain.full_state_dict()
    assert params.keys() == reference.keys()
    for name, value in reference.items():
        assert relative_error(params[name], value) < 1e-6, name
    return expected, chunked, history


@pytest.mark.timeout(300)
@pytest.mark.parametrize("swap, recompute", [(None, "none"), (16 * 2**10, "none"), (None, "blocks")],
                         ids=["activations-kept", "activations-swapped", "blocks-recomputed"])
def test_chunked_gpt_trains_as_in_memory_through_the_disk(tmp_path, swap, recompute):
    """The GPT with room for about a third of its states trains as in memory, clipped; also with
    the saved activations of 16 KiB and more swapped to disk and back, and with every block
    recomputed in backward (its parameters' chunks brought back there too)."""
    expected, chunked, history = trained_in_memory_and_chunked(tmp_path, swap_activations=swap, recompute=recompute)
    assert [r["grad_norm"] for r in history] == pytest.approx([r["grad_norm"] for r in expected], rel=1e-6)
    assert any(r["grad_norm"] > 0.5 for r in expected)  # clipping took part
    # Every step after the first (which reads every chunk it uses) still goes to the disk: the
    # states do not fit beside the activations.
    states = 16 * chunked.num_parameters()
    assert all(r["offload_read_bytes"] > 0 and r["offload_written_bytes"] > 0 for r in history[1:])
    assert chunked.chunks.store.resident_bytes() < states / 2
    if swap:  # each step's saved activations went to files, removed once backward was done with them
        assert all(r["swapped_activation_bytes"] > 2**20 for r in history)
        assert chunked.chunks.swap.bytes_read > 0 and not list((tmp_path / "chunks" / "rank00000" / "activations").iterdir())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("device_room", [6 * 2**20, 2**30], ids=["device-tight", "device-roomy"])
def test_chunked_gpt_with_a_device_tier_trains_as_in_memory(tmp_path, device_room):
    """Three tiers (the device tier a pool of host memory under its own budget, as on a GPU
    machine; `trainers.memory.chunks.device`): the same losses and parameters as training in memory.
    Tight (6 MiB on the device for 26 MB of states beside the step's tensors): chunks go up and
    down every step, mostly into the buffers of chunks that left, and the updates run partly on
    the device, partly in host memory. Roomy: once
    the first step has measured it, everything stays on the device and updates there, and after
    one step that brings it up, nothing moves between the tiers."""
    _, chunked, history = trained_in_memory_and_chunked(tmp_path, device_memory_budget=device_budget(device_room))
    chunks = chunked.chunks.layout.chunks
    assert all(r["device_updated_chunks"] + r["host_updated_chunks"] == chunks for r in history)
    assert history[0]["device_updated_chunks"] == 0  # the first step has no placement to follow: updates on the host
    device = chunked.chunks.device
    assert all(r["device_out_of_memory_retries"] == 0 for r in history)
    if device_room < 2**30:
        assert all(r["device_up_bytes"] > 0 and r["device_down_bytes"] > 0 for r in history[1:])
        assert all(0 < r["device_updated_chunks"] < chunks for r in history[1:])
        assert device.held_bytes() <= device_room
        # Chunks come up into the buffers of the chunks that left (the spares), not all into new ones.
        chunk_bytes = 4 * chunked.chunks.layout.sizes[0]
        assert all(r["device_allocated_chunks"] < r["device_up_bytes"] // chunk_bytes for r in history[1:])
    else:
        assert all(r["device_updated_chunks"] == chunks for r in history[1:])
        assert all(r[key] == 0 for r in history[2:] for key in
                   ("device_up_bytes", "device_down_bytes", "offload_read_bytes", "offload_written_bytes"))
        assert device.resident_bytes() == 3 * 4 * sum(chunked.chunks.layout.sizes)  # parameters, moments
        assert all(r["device_allocated_chunks"] == 0 for r in history[2:])


def out_of_memory_in_backward(module: torch.nn.Module, micro_batch: int) -> None:
    """Raise torch.OutOfMemoryError once, in the backward of the `micro_batch`-th (from 1) forward
    through `module`: a GPU's caching allocator failing there, which a CPU's cannot be made to."""
    forwards = itertools.count(1)

    def fail(grad: torch.Tensor) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 198.00 MiB (raised by the test)")

    def watch(_module, _args, output: torch.Tensor) -> None:
        if next(forwards) == micro_batch:
            output.register_hook(fail)
    module.register_forward_hook(watch)


@pytest.mark.timeout(300)
def test_a_step_that_runs_out_of_device_memory_runs_again_with_more_allocator_slack(tmp_path):
    """The device running out of memory in step 3's backward (its first micro batch): the step runs
    again from its first micro batch with a sixteenth of the device budget more left to the
    allocator, and training goes on as in memory (same losses and parameters). The first step, which
    has no placement to widen yet, raises the error instead."""
    build = lambda: tiny_gpt(n_embd=128, n_layer=4, vocab_size=512, block_size=32, dropout=0.1)  # noqa: E731
    data = lm_examples(64, length=32, vocab=512)
    plain = Trainer(build(), config(output_dir=str(tmp_path / "plain")))
    expected = plain.fit(data)
    budget = device_budget(64 * 2**20)  # room for a sixteenth more slack, on a GPU too

    def chunked(fails_at: int, name: str) -> Trainer:
        model = build()
        out_of_memory_in_backward(model.blocks[2], micro_batch=fails_at)
        return Trainer(model, config(output_dir=str(tmp_path / name)),
                       Strategy(offload="chunks", offload_dir=str(tmp_path / name / "chunks"),
                                memory_budget=chunk_budget(8 * 2**20), device_memory_budget=budget))

    trainer = chunked(fails_at=5, name="rerun")
    slack = trainer.chunks.allocator_slack
    history = trainer.fit(data)
    assert [r["device_step_reruns"] for r in history] == [0, 0, 1, 0, 0]
    assert trainer.chunks.allocator_slack == slack + budget // 16
    assert [r["loss"] for r in history] == pytest.approx([r["loss"] for r in expected], rel=1e-6)
    params = trainer.full_state_dict()
    for name, value in plain.full_state_dict().items():
        assert relative_error(params[name], value) < 1e-6, name
    with pytest.raises(torch.OutOfMemoryError, match="raised by the test"):
        chunked(fails_at=1, name="first").fit(data)


@pytest.mark.parametrize("device_room", [None, 4 * 2**20], ids=["host", "device-tier"])
def test_a_model_on_the_meta_device_is_initialised_chunk_by_chunk(tmp_path, device_room):
    with torch.device("meta"):
        model = tiny_gpt(n_embd=64, n_layer=3)
    trainer = Trainer(model, config(output_dir=str(tmp_path), max_steps=10, lr=1e-2),
                      Strategy(offload="chunks", offload_dir=str(tmp_path / "chunks"), memory_budget=chunk_budget(2**25),
                               device_memory_budget=device_budget(device_room)))
    assert len(trainer.chunks.layout.sizes) > 2 and not list(model.parameters())[0].is_meta
    weights = trainer.full_state_dict()
    matrices = torch.cat([w.flatten() for name, w in weights.items() if name.endswith("q.weight")])
    assert matrices.std().item() == pytest.approx(0.02, rel=0.05)  # GPT-2's N(0, 0.02)
    assert all(torch.equal(w, torch.ones_like(w)) for name, w in weights.items() if "norm" in name)
    history = trainer.fit(lm_examples(64))
    assert history[-1]["loss"] < history[0]["loss"] - 0.1


@pytest.mark.parametrize("device_room", [None, 4 * 2**20], ids=["host", "device-tier"])
def test_a_built_model_keeps_no_parameter_storage_of_its_own_once_chunked(tmp_path, device_room):
    """Once its states are copied into chunks, every trainable parameter holds the absent marker
    (one NaN broadcast, on the compute device) until a chunk binds it where the model computes.
    Under a device tier a parameter that kept its original host storage went into the first
    forward on the host, and autograd then refused its gradient from the GPU."""
    model = tiny_gpt(n_embd=64, n_layer=2)
    trainer = Trainer(model, config(output_dir=str(tmp_path)),
                      Strategy(offload="chunks", offload_dir=str(tmp_path / "chunks"), memory_budget=chunk_budget(2**25),
                               device_memory_budget=device_budget(device_room)))
    device = trainer.chunks.compute_device
    params = [p for p in model.parameters() if p.requires_grad]
    assert all(p.device == device and set(p.stride()) == {0} and torch.isnan(p.detach()).all() for p in params)


def test_0_dim_parameters_train_in_chunks_as_in_memory_and_close_removes_the_files(tmp_path):
    """A learned 0-dim gain and scale (GainedRegression) in chunks: the same losses and parameters as
    in memory; leaving the trainer's `with` block removes every chunk file."""
    generator = torch.Generator().manual_seed(5)
    data = [{"x": x, "y": x.sum().tanh()} for x in torch.randn(32, 4, generator=generator)]
    plain = Trainer(GainedRegression(), config(output_dir=str(tmp_path / "plain")))
    expected = plain.fit(data)
    with Trainer(GainedRegression(), config(output_dir=str(tmp_path / "chunked")),
                 Strategy(offload="chunks", offload_dir=str(tmp_path / "chunks"), memory_budget=chunk_budget(2**24))
                 ) as chunked:
        history = chunked.fit(data)
        assert list((tmp_path / "chunks").rglob("*.bin"))
        params = chunked.full_state_dict()
    assert not list((tmp_path / "chunks").rglob("*.bin"))
    assert [r["loss"] for r in history] == pytest.approx([r["loss"] for r in expected], rel=1e-6)
    for name, value in plain.full_state_dict().items():
        assert value.ndim or name in ("gain", "blocks.0.scale")
        assert relative_error(params[name], value) < 1e-6, name


def test_bad_settings_a_small_budget_a_blocked_directory_and_a_changed_chunk_file_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"Strategy.offload='chunks' needs Strategy.offload_dir \(where chunks go\) and "
                                         r"Strategy.memory_budget \(how much stays in memory\); got offload_dir=None, "
                                         r"memory_budget=None"):
        Strategy(offload="chunks")
    with pytest.raises(ValueError, match=r"Strategy.offload=.chunks. runs with zero=0 .* or zero=3 .*; got zero=1"):
        Strategy(offload="chunks", offload_dir="x", memory_budget="1GiB", zero=1)
    with pytest.raises(ValueError, match=r"Strategy.offload_dir is for offload='chunks'; got offload='params'"):
        Strategy(offload="params", offload_dir="x")
    with pytest.raises(ValueError, match=r"Strategy.swap_activations writes activations beside the chunks of "
                                         r"offload='chunks'; got offload='none'"):
        Strategy(swap_activations="1MiB")
    with pytest.raises(ValueError, match=r"Strategy.swap_activations"):
        Strategy(offload="chunks", offload_dir="x", memory_budget="1GiB", swap_activations="lots")
    small = Strategy(offload="chunks", offload_dir=str(tmp_path / "chunks"), memory_budget="64MiB")
    with pytest.raises(ValueError, match=r"memory_budget=67,108,864 bytes is below what this process holds now, "
                                         r"[\d,]+ bytes with GPT's parameters built in memory"):
        Trainer(tiny_gpt(), config(output_dir=str(tmp_path)), small)
    with torch.device("meta"):
        on_meta = tiny_gpt()
    with pytest.raises(ValueError, match=r"memory_budget must hold the process \([\d,]+ bytes now\) and one chunk of each "
                                         r"of param, grad, exp_avg, exp_avg_sq \([\d,]+ bytes\), [\d,]+ bytes in all; got "
                                         "67,108,864"):
        Trainer(on_meta, config(output_dir=str(tmp_path)), small)
    with pytest.raises(ValueError, match=r"Strategy.device_memory_budget sizes the device tier of offload='chunks'; "
                                         r"got offload='none'"):
        Strategy(device_memory_budget="1GiB")
    too_small = Strategy(offload="chunks", offload_dir=str(tmp_path / "chunks"), memory_budget=chunk_budget(2**25),
                         device_memory_budget=2**12)
    with pytest.raises(ValueError, match=r"device_memory_budget must hold the largest chunk's parameters and gradients "
                                         r"on the device \([\d,]+ bytes\); got 4,096"):
        Trainer(tiny_gpt(), config(output_dir=str(tmp_path)), too_small)
    few_chunks = Strategy(offload="chunks", offload_dir=str(tmp_path / "few"), memory_budget=chunk_budget(2**25),
                          device_memory_budget=2**21)
    trainer = Trainer(tiny_gpt(n_embd=128, n_layer=2, vocab_size=512, block_size=32), config(output_dir=str(tmp_path)),
                      few_chunks)
    with pytest.raises(MemoryError, match=r"device_memory_budget=2,097,152 bytes is smaller than the step's working "
                                          r"set on the device: at moment \d+"):
        trainer.fit(lm_examples(64, length=32, vocab=512))
    (tmp_path / "a file").write_text("")
    blocked = Strategy(offload="chunks", offload_dir=str(tmp_path / "a file"), memory_budget=chunk_budget(2**20))
    with pytest.raises(OSError, match=r"offload directory '.*a file/rank00000' cannot take chunk param 0"):
        Trainer(tiny_gpt(), config(output_dir=str(tmp_path)), blocked)
    trainer = Trainer(tiny_gpt(), config(output_dir=str(tmp_path)),
                      Strategy(offload="chunks", offload_dir=str(tmp_path / "chunks"), memory_budget=chunk_budget(2**20)))
    path = tmp_path / "chunks" / "rank00000" / "param00001.bin"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match=r"chunk file .*param00001.bin changed on disk since it was written"):
        trainer.fit(lm_examples(64))


@pytest.mark.timeout(300)
def test_a_full_offload_directory_stops_training_and_the_last_checkpoint_resumes(tmp_path):
    """From step 3 on every chunk file goes to /dev/full (a device the kernel always reports
    full): training stops with the OSError naming the directory, the chunk and ENOSPC, and the
    step-2 checkpoint resumes in memory to the uninterrupted run's steps 3-4 and parameters."""
    build = lambda: tiny_gpt(n_embd=128, n_layer=4, vocab_size=512, block_size=32)  # noqa: E731
    data = lm_examples(64, length=32, vocab=512)
    reference = Trainer(build(), config(output_dir=str(tmp_path / "memory"), max_steps=4))
    expected = reference.fit(data)
    chunked = Trainer(build(), config(output_dir=str(tmp_path / "chunked"), max_steps=4, checkpoint_every=2,
                                      checkpoint_dir=str(tmp_path / "chunked" / "checkpoints")),
                      Strategy(offload="chunks", offload_dir=str(tmp_path / "chunks"), memory_budget=chunk_budget(8 * 2**20)))
    keys = [(kind, index) for kind in KINDS for index in range(chunked.chunks.layout.chunks)]
    collated = itertools.count()

    def collate_filling_the_disk_at_step_3(examples: list[dict]) -> dict:
        if next(collated) == 2 * 2:  # steps 1 and 2 (2 micro batches each) are done, and checkpointed
            for key in keys:  # where each chunk file is written before it is renamed into place
                chunked.chunks.store.path(key).with_suffix(".partial").symlink_to("/dev/full")
        return default_collate(examples)

    with pytest.raises(OSError, match=r"offload directory '.*chunks/rank00000' cannot take chunk \w+ \d+ \([\d,]+ "
                                      r"bytes\): No space left on device"):
        chunked.fit(data, collate_fn=collate_filling_the_disk_at_step_3)
    assert [r["loss"] for r in chunked.history] == pytest.approx([r["loss"] for r in expected[:2]], rel=1e-6)
    assert all(r["offload_written_bytes"] > 0 for r in chunked.history)  # the states went through the directory
    resumed = Trainer(build(), config(output_dir=str(tmp_path / "resumed"), max_steps=4))
    assert resumed.resume(tmp_path / "chunked" / "checkpoints" / "step_00000002")
    history = resumed.fit(data)
    assert [r["loss"] for r in history] == pytest.approx([r["loss"] for r in expected[2:]], rel=1e-6)
    params = resumed.full_state_dict()
    for name, value in reference.full_state_dict().items():
        assert relative_error(params[name], value) < 1e-6, name


@pytest.mark.timeout(300)
def test_checkpoints_of_chunked_states_load_into_memory_and_back(tmp_path):
    """4 steps, saved after 2: in memory throughout; chunked, resumed in memory; in memory,
    resumed chunked; the same with a device tier that holds every chunk (the checkpoint brings
    down the device copies, the only true ones after an update on the device). Every route ends on
    the same losses and parameters."""
    build = lambda: tiny_gpt(n_embd=64, n_layer=3)  # noqa: E731
    data = lm_examples(64)

    def run(folder: str, strategy: Strategy | None, **overrides) -> Trainer:
        trainer = Trainer(build(), config(output_dir=str(tmp_path / folder), max_steps=4, checkpoint_every=2,
                                          checkpoint_dir=str(tmp_path / folder / "checkpoints"), **overrides), strategy)
        trainer.history = trainer.fit(data)
        return trainer

    def chunks(folder: str, device_room: int | None = None) -> Strategy:  # room for the states: checkpoints are tested
        return Strategy(offload="chunks", offload_dir=str(tmp_path / folder / "chunks"), memory_budget=chunk_budget(2**25),
                        device_memory_budget=device_budget(device_room))

    reference = run("memory", None)
    for folder, device_room in (("chunked", None), ("chunked-device", 2**26)):
        chunked = run(folder, chunks(folder, device_room))
        assert [r["loss"] for r in chunked.history] == pytest.approx([r["loss"] for r in reference.history], rel=1e-6)
    assert chunked.history[1]["device_updated_chunks"] == chunked.chunks.layout.chunks
    for source, strategy in (("chunked", None), ("chunked-device", None), ("memory", chunks("resumed")),
                             ("memory", chunks("resumed-device", 2**26))):
        resumed = Trainer(build(), config(output_dir=str(tmp_path / "resumed"), max_steps=4,
                                          checkpoint_dir=str(tmp_path / "resumed" / "checkpoints")), strategy)
        assert resumed.resume(tmp_path / source / "checkpoints" / "step_00000002")
        history = resumed.fit(data)
        assert [r["loss"] for r in history] == pytest.approx([r["loss"] for r in reference.history[2:]], rel=1e-6)
        params = resumed.full_state_dict()
        for name, value in reference.full_state_dict().items():
            assert relative_error(params[name], value) < 1e-6, (source, name)

"""Checkpoints: exact resume, atomic writes under a kill, clear errors."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from helpers import lm_examples, tiny_gpt
from trainers import Strategy, TrainConfig, Trainer


def config(tmp_path, **overrides) -> TrainConfig:
    base = dict(global_batch_size=8, micro_batch_size=4, max_steps=6, lr=1e-2, warmup_steps=1, log_every=1,
                progress=False, output_dir=str(tmp_path / "run"), checkpoint_dir=str(tmp_path / "ckpt"))
    return TrainConfig(**{**base, **overrides})


OFFLOADS, PRECISIONS = ("none", "optimizer", "params"), ("fp32", "bf16", "fp16")
EVERY_STRATEGY = [Strategy(zero=zero, offload=offload, precision=precision)
                  for zero in (0, 1, 2, 3) for offload in OFFLOADS for precision in PRECISIONS]
"""Every ZeRO stage x offload x precision: `python benchmarks/resume_matrix.py` resumes each."""
STRATEGIES = [s for s in EVERY_STRATEGY if PRECISIONS.index(s.precision) == (s.zero + OFFLOADS.index(s.offload)) % 3]
"""The suite's slice, 12 of the 36: every pair of a ZeRO stage, an offload and a precision at least once."""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: f"zero{s.zero}-{s.offload}-{s.precision}")
def test_resume_is_exact_bit_for_bit(tmp_path, strategy):
    resumes_exactly(tmp_path, strategy)


def resumes_exactly(tmp_path: Path, strategy: Strategy) -> None:
    """6 steps straight, and 3 resumed from the step-3 checkpoint of a model built from another seed:
    every parameter bitwise equal (AssertionError naming the first that is not)."""
    straight = Trainer(tiny_gpt(dropout=0.1), config(tmp_path, checkpoint_every=3), strategy)
    straight.fit(lm_examples(64))
    expected = straight.full_state_dict()

    resumed = Trainer(tiny_gpt(seed=7, dropout=0.1), config(tmp_path), strategy)
    assert resumed.resume(tmp_path / "ckpt" / "step_00000003")
    assert resumed.step == 3
    resumed.fit(lm_examples(64))
    actual = resumed.full_state_dict()
    # The last 3 steps moved the weights: equality is not between two copies of the checkpoint.
    saved = Trainer(tiny_gpt(seed=7), config(tmp_path), strategy)
    saved.resume(tmp_path / "ckpt" / "step_00000003")
    assert not torch.equal(saved.full_state_dict()["embeddings.word.weight"], expected["embeddings.word.weight"])
    for name in expected:
        assert torch.equal(actual[name], expected[name]), name


@pytest.mark.timeout(120)
def test_resume_flag_continues_from_latest(tmp_path):
    first = Trainer(tiny_gpt(), config(tmp_path, max_steps=2))
    first.fit(lm_examples(64))
    assert (tmp_path / "ckpt" / "latest").read_text() == "step_00000002"
    second = Trainer(tiny_gpt(), config(tmp_path, max_steps=4, resume=True))
    history = second.fit(lm_examples(64))
    assert [r["step"] for r in history] == [3, 4]


KILL_DURING_SAVE = """
import os, signal, sys
sys.path.append({tests!r})
from helpers import lm_examples, tiny_gpt
import trainers.state.checkpoint as checkpoint
from trainers import TrainConfig, Trainer

real_replace = os.replace
def replace(source, target):
    # Die at the commit point of the step-3 save: every shard is on disk, nothing renamed yet.
    if str(source).endswith(".step_00000003.partial"):
        os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(source, target)
checkpoint.os.replace = replace
config = TrainConfig(global_batch_size=8, micro_batch_size=8, max_steps=4, lr=1e-2, warmup_steps=1, checkpoint_every=1,
                     progress=False, log_every=1, checkpoint_dir={ckpt!r}, output_dir={run!r})
Trainer(tiny_gpt(), config).fit(lm_examples(64))
"""


@pytest.mark.timeout(180)
def test_kill_during_save_leaves_previous_checkpoint_as_latest(tmp_path, caplog):
    ckpt = tmp_path / "ckpt"
    script = KILL_DURING_SAVE.format(tests=str(Path(__file__).parents[1]), ckpt=str(ckpt), run=str(tmp_path / "run"))
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=150)
    assert result.returncode == -9, result.stderr[-2000:]
    assert (ckpt / "latest").read_text() == "step_00000002"
    assert (ckpt / ".step_00000003.partial").is_dir()
    assert not (ckpt / "step_00000003").exists()

    metrics = tmp_path / "run" / "metrics.jsonl"
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3]

    caplog.set_level(logging.INFO, logger="trainers")
    trainer = Trainer(tiny_gpt(seed=5), config(tmp_path, max_steps=4, micro_batch_size=8, resume=True))
    history = trainer.fit(lm_examples(64))
    assert [r["step"] for r in history] == [3, 4]
    assert f"resumed from {ckpt / 'step_00000002'} (step 2)" in caplog.text
    assert (ckpt / "latest").read_text() == "step_00000004"
    assert not (ckpt / ".step_00000003.partial").exists()
    # Step 3 ran twice (before the kill and after the resume); the metrics hold it once.
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3, 4]


def test_bad_strategy_and_batch_sizes_are_named():
    with pytest.raises(ValueError, match=r"Strategy.zero must be one of 0, 1, 2, 3; got 4"):
        Strategy(zero=4)
    with pytest.raises(ValueError, match=r"Strategy.offload .* got 'gpu'"):
        Strategy(offload="gpu")
    with pytest.raises(ValueError, match=r"global_batch_size must be divisible by micro_batch_size x data-parallel ranks \(3 x 1 = 3\); got 8"):
        Trainer(tiny_gpt(), TrainConfig(global_batch_size=8, micro_batch_size=3))


def test_unwritable_checkpoint_dir_is_named(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match="checkpoint_dir='.*a-file/ckpt' is not writable"):
        Trainer(tiny_gpt(), TrainConfig(checkpoint_dir=str(blocker / "ckpt")))


@pytest.mark.timeout(120)
def test_checkpoint_of_another_architecture_is_refused_and_kept(tmp_path):
    Trainer(tiny_gpt(), config(tmp_path, max_steps=1)).fit(lm_examples(64))
    folder = tmp_path / "ckpt" / "step_00000001"
    before = sorted((p.name, p.stat().st_size) for p in folder.iterdir())
    other = Trainer(tiny_gpt(n_layer=3), config(tmp_path, max_steps=1))
    with pytest.raises(ValueError, match="does not match this GPT: missing \\['blocks.2"):
        other.resume()
    assert sorted((p.name, p.stat().st_size) for p in folder.iterdir()) == before


@pytest.mark.timeout(120)
def test_corrupt_checkpoint_gives_a_clear_error(tmp_path):
    Trainer(tiny_gpt(), config(tmp_path, max_steps=1)).fit(lm_examples(64))
    folder = tmp_path / "ckpt" / "step_00000001"
    shard = next(folder.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(ValueError, match="no intact checkpoint to resume from: .* is corrupt or incomplete"):
        Trainer(tiny_gpt(), config(tmp_path, max_steps=1)).resume()
    shutil.rmtree(folder)
    with pytest.raises(ValueError, match="no intact checkpoint to resume from: .*step_00000001' is missing or incomplete"):
        Trainer(tiny_gpt(), config(tmp_path, max_steps=1)).resume()


@pytest.mark.timeout(120)
def test_only_a_checkpoint_that_fails_its_manifest_is_passed_over(tmp_path, monkeypatch, caplog):
    Trainer(tiny_gpt(), config(tmp_path, max_steps=2, checkpoint_every=1)).fit(lm_examples(64))
    newest = tmp_path / "ckpt" / "step_00000002"
    shard = next(newest.glob("*.distcp"))
    damaged = bytearray(shard.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # same size, one byte flipped: only the CRC-32 tells
    shard.write_bytes(bytes(damaged))
    resumed = Trainer(tiny_gpt(), config(tmp_path, max_steps=2))
    assert resumed.resume() and resumed.step == 1
    assert f"{shard.name} differs from what was saved (CRC-32); falling back to an older checkpoint" in caplog.text

    def failing_load(*args, **kwargs):
        raise OSError("the disk went away")

    import trainers.state.checkpoint as checkpoint

    monkeypatch.setattr(checkpoint.dcp, "load", failing_load)
    with pytest.raises(OSError, match="the disk went away"):  # intact: the error is raised, not taken for damage
        Trainer(tiny_gpt(), config(tmp_path, max_steps=2)).resume(tmp_path / "ckpt" / "step_00000001")


@pytest.mark.timeout(120)
def test_a_checkpoint_file_that_cannot_be_read_is_raised_not_passed_over(tmp_path, monkeypatch):
    """Permissions or a failing disk say nothing of the checkpoint: the error is raised (on every rank:
    rank 0 broadcasts it), never taken for damage that resumes an older step."""
    import trainers.state.checkpoint as checkpoint

    Trainer(tiny_gpt(), config(tmp_path, max_steps=2, checkpoint_every=1)).fit(lm_examples(64))
    read_text = Path.read_text

    def unreadable_state(path, *args, **kwargs):
        if path.name == checkpoint.STATE_FILE:
            raise PermissionError(13, "Permission denied", str(path))
        return read_text(path, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(Path, "read_text", unreadable_state)
        with pytest.raises(PermissionError, match="Permission denied"):
            Trainer(tiny_gpt(), config(tmp_path, max_steps=2)).resume()

    def failing_disk(path):
        raise OSError(5, "Input/output error", str(path))

    monkeypatch.setattr(checkpoint, "file_crc32", failing_disk)
    with pytest.raises(OSError, match="Input/output error"):
        Trainer(tiny_gpt(), config(tmp_path, max_steps=2)).resume()


@pytest.mark.timeout(120)
def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one(tmp_path, caplog):
    straight = Trainer(tiny_gpt(), config(tmp_path, max_steps=3, checkpoint_every=1))
    straight.fit(lm_examples(64))
    newest = tmp_path / "ckpt" / "step_00000003"
    shard = next(newest.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    resumed = Trainer(tiny_gpt(seed=9), config(tmp_path, max_steps=3))
    assert resumed.resume()
    assert resumed.step == 2
    assert "step_00000003' is corrupt or incomplete" in caplog.text and "falling back" in caplog.text
    resumed.fit(lm_examples(64))
    for name, value in straight.full_state_dict().items():
        assert torch.equal(resumed.full_state_dict()[name], value), name


@pytest.mark.timeout(120)
def test_only_the_newest_checkpoints_are_kept(tmp_path):
    Trainer(tiny_gpt(), config(tmp_path, max_steps=5, checkpoint_every=1, keep_checkpoints=2)).fit(lm_examples(64))
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["latest", "step_00000004", "step_00000005"]


@pytest.mark.timeout(120)
def test_resume_refuses_other_settings_and_logs_allowed_changes(tmp_path, caplog):
    Trainer(tiny_gpt(), config(tmp_path, max_steps=2)).fit(lm_examples(64))
    folder = tmp_path / "ckpt" / "step_00000002"
    before = sorted((p.name, p.stat().st_size) for p in folder.iterdir())
    changed = Trainer(tiny_gpt(seed=4), config(tmp_path, lr=2e-2, seed=3, global_batch_size=16), Strategy(precision="bf16"))
    with pytest.raises(ValueError, match=r"cannot resume from .* as an exact continuation; these settings changed: "
                                         r"config.global_batch_size: 8 -> 16; config.lr: 0.01 -> 0.02; config.seed: 0 -> 3; "
                                         r"strategy.precision: 'fp32' -> 'bf16'\. Restore them"):
        changed.resume()
    assert changed.step == 0 and sorted((p.name, p.stat().st_size) for p in folder.iterdir()) == before
    caplog.set_level(logging.INFO, logger="trainers")
    longer = Trainer(tiny_gpt(seed=4), config(tmp_path, max_steps=4, micro_batch_size=2), Strategy(zero=2))
    assert longer.resume() and longer.step == 2
    assert ("changed settings: config.max_steps: 2 -> 4; config.micro_batch_size: 4 -> 2; strategy.zero: 0 -> 2"
            in caplog.text)
    relaxed = Trainer(tiny_gpt(seed=4), config(tmp_path, lr=2e-2))
    assert relaxed.resume(strict=False) and "config.lr: 0.01 -> 0.02" in caplog.text


BAD_CONFIGS = [
    (dict(log_every=0), ValueError, "TrainConfig.log_every must be > 0; got 0"),
    (dict(micro_batch_size=0), ValueError, "TrainConfig.micro_batch_size must be > 0; got 0"),
    (dict(lr=-1.0), ValueError, "TrainConfig.lr must be > 0; got -1.0"),
    (dict(lr=float("nan")), ValueError, "TrainConfig.lr must be > 0; got nan"),
    (dict(eval_batches=0), ValueError, "TrainConfig.eval_batches must be > 0; got 0"),
    (dict(min_lr_ratio=1.5), ValueError, "TrainConfig.min_lr_ratio must be in \\[0, 1\\]; got 1.5"),
    (dict(betas=(0.9, 1.0)), ValueError, "TrainConfig.betas must be a pair in \\[0, 1\\); got \\(0.9, 1.0\\)"),
    (dict(keep_checkpoints=0), ValueError, "TrainConfig.keep_checkpoints must be > 0; got 0"),
    (dict(max_steps=2.5), TypeError, "TrainConfig.max_steps must be an int; got 2.5"),
    (dict(resume="yes"), TypeError, "TrainConfig.resume must be a bool; got 'yes'"),
    (dict(checkpoint_dir=3), TypeError, "TrainConfig.checkpoint_dir must be a str or None; got 3"),
]


@pytest.mark.parametrize("fields, error, message", BAD_CONFIGS, ids=[next(iter(c[0])) + str(i) for i, c in enumerate(BAD_CONFIGS)])
def test_every_train_config_field_is_checked_at_construction(fields, error, message):
    with pytest.raises(error, match=message):
        TrainConfig(**fields)


def test_an_empty_eval_set_is_refused(tmp_path):
    with pytest.raises(ValueError, match="eval_dataset is empty; pass None to train without evaluation"):
        Trainer(tiny_gpt(), config(tmp_path, max_steps=1)).fit(lm_examples(64), [])

"""Shared test fixtures: a tiny GPT and its data, and a torchrun launcher."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from nlp.gpt import GPT, GPTConfig

# No biases: the key bias gets an exactly-zero gradient (softmax ignores it), and AdamW turns the
# rounding noise on a zero gradient into full-size steps of random sign, which no comparison survives.
TINY = GPTConfig(vocab_size=48, block_size=16, n_layer=2, n_head=2, n_embd=32, bias=False)


def tiny_gpt(seed: int = 0, **overrides) -> GPT:
    """A 2-block GPT with seeded initialisation."""
    torch.manual_seed(seed)
    config = GPTConfig(**{**TINY.__dict__, **overrides})
    return GPT(config)


def lm_examples(count: int, seed: int = 1, length: int = 16, vocab: int = 48) -> list[dict[str, torch.Tensor]]:
    """Random causal-LM examples in Hugging Face's form (labels = input_ids) with a learnable pattern
    (each token is followed by token + 1)."""
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, vocab, (count, 1), generator=generator)
    streams = (starts + torch.arange(length)) % vocab
    return [{"input_ids": s.clone(), "labels": s.clone()} for s in streams]


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float64."""
    actual, expected = actual.double(), expected.double()
    return ((actual - expected).norm() / expected.norm().clamp(min=1e-30)).item()


def torchrun(nproc: int, *args: str, timeout: float = 300, script: str = "worker.py") -> subprocess.CompletedProcess:
    """Run tests/distributed/`script` under torchrun on gloo with OMP_NUM_THREADS=1; raise with
    its output when it fails."""
    worker = Path(__file__).parent / "distributed" / script
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(worker), *args]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"torchrun {' '.join(args)} failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}")
    return result

"""Shared test fixtures: a tiny GPT and its data, a torchrun launcher, and the `zoo` command line in process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
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


def shakespeare_gpt(n_layer: int = 16, n_embd: int = 32, block_size: int = 128, rows: int = 32,  # noqa: ANN201
                    dropout: float = 0.1):
    """(build, data, collate, rows): a GPT (by default narrow and deep: width 32, blocks of 128
    characters, dropout 0.1) on the first 20,000 characters of Shakespeare, `rows` blocks a micro
    batch: by default its activations far outweigh its weights."""
    from nlp.data import TokenBlocks
    from nlp.tokenizers import CharTokenizer
    from zoo.corpora import shakespeare_text

    text = shakespeare_text()[:20_000]
    tokenizer = CharTokenizer("".join(sorted(set(text))))
    data = TokenBlocks(torch.tensor(tokenizer.encode(text)), block_size)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=block_size, n_layer=n_layer, n_head=4, n_embd=n_embd,
                       dropout=dropout)
    return (lambda: GPT(config)), data, None, rows


CUDA_LAZY_LOADING = 256 << 20
"""Bytes of RSS a process on a GPU gains in its first training steps as CUDA loads kernels (lazily)."""


def _warm_cuda() -> None:
    """A linear layer's forward and backward on the GPU: CUDA's context and the cuBLAS / cuBLASLt
    workspaces, made at first use, exist before a budget is measured."""
    x = torch.ones(8, 8, device="cuda", requires_grad=True)
    torch.nn.functional.linear(x, x, x[0]).sum().backward()
    torch.cuda.synchronize()


def chunk_budget(room: int) -> int:
    """A process memory budget for Strategy(offload="chunks") that leaves about `room` bytes to
    chunks beside what this process holds now (about: a process's first training step grows it; on
    a GPU, CUDA's context and libraries, loaded at first use, are loaded first and the kernels a step
    loads later are given room)."""
    from trainers.memory.chunks.moments import CAPACITY_MARGIN
    from trainers.memory.resident import resident_set_bytes

    if torch.cuda.is_available():
        _warm_cuda()
        room += CUDA_LAZY_LOADING
    return int((resident_set_bytes() + room) / (1 - CAPACITY_MARGIN))


def device_budget(room: int | None) -> int | None:
    """A device memory budget for Strategy(offload="chunks") that leaves `room` bytes to the chunks
    and the step's device tensors: on a GPU beside what is allocated there now; off a GPU (the device
    tier a pool of host memory) `room` itself. None: None (no device budget). On a GPU the budget also
    holds the residency's allocator slack (`CUDA_ALLOCATOR_SLACK`)."""
    if room is None:
        return None
    if not torch.cuda.is_available():
        return room
    from trainers.memory.chunks.moments import CUDA_ALLOCATOR_SLACK

    _warm_cuda()
    return room + torch.cuda.memory_allocated() + CUDA_ALLOCATOR_SLACK


def torchrun(nproc: int, *args: str, timeout: float = 300, script: str = "worker.py") -> subprocess.CompletedProcess:
    """Run tests/distributed/`script` under torchrun on gloo with OMP_NUM_THREADS=1; raise with
    its output when it fails. One process runs without the launcher (about 2 s of its start-up),
    given the variables torchrun would set; its store listens on a port the system picks when it
    binds (MASTER_PORT=0), so no other test can take it first."""
    worker = Path(__file__).parent / "distributed" / script
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if nproc == 1:
        env |= dict(RANK="0", LOCAL_RANK="0", GROUP_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                    MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
        command = [sys.executable, str(worker), *args]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(worker),
                   *args]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"torchrun {' '.join(args)} failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}")
    return result


def run_commands(commands: dict[str, Callable[..., None]], argv: list[str]) -> None:
    """A worker's COMMAND ARGUMENT... from `argv`, several separated by "+" and run one after
    another: one launch and one process group, so one start-up (a 2-rank launch of a worker that
    only imports and joins: 7.7 s wall, 12 CPU-s on this project's 2-core machine)."""
    while argv:
        end = argv.index("+") if "+" in argv else len(argv)
        command, *arguments = argv[:end]
        commands[command](*arguments)
        argv = argv[end + 1 :]


def zoo_in_process(capsys: pytest.CaptureFixture, *args: str) -> subprocess.CompletedProcess:
    """`zoo ARGS` run by the command line's own `main` in this process, as a CompletedProcess (exit
    code, stdout, stderr): the console script's code path without a Python start-up per call."""
    from zoo.cli import main

    capsys.readouterr()  # what the test printed before is not the command's
    try:
        main(list(args))
        code = 0
    except SystemExit as stopped:
        code = stopped.code if isinstance(stopped.code, int) else 1
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["zoo", *args], code, out, err)

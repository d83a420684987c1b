"""A process that trains with chunked states stays within its memory budget: peak resident memory
measured in a fresh process whose model states are more than the room the budget leaves them.
The peak is the process's own high-water mark (VmHWM): getrusage's ru_maxrss keeps, across exec,
the peak of the process that started it (here the test runner's). A budget the process has already
crossed with a model built in memory when the trainer starts is refused, naming the smallest that
holds (a model built in memory under a budget it does not cross: test_chunked_checkpoint_memory.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RUN = """
import json, sys, torch
sys.path[:0] = [{root!r}, {tests!r}, {benchmarks!r}]
from helpers import lm_examples
from measure import status_bytes
from nlp.gpt import GPT, GPTConfig
from trainers import Strategy, TrainConfig, Trainer
from trainers.memory.resident import resident_set_bytes

budget = resident_set_bytes() + 160 * 2**20
with torch.device("meta"):
    model = GPT(GPTConfig(vocab_size=4096, block_size=64, n_layer=4, n_head=8, n_embd=512, bias=False))
trainer = Trainer(model, TrainConfig(max_steps=3, global_batch_size=4, micro_batch_size=2, progress=False,
                                     output_dir={out!r}),
                  Strategy(offload="chunks", offload_dir={out!r}, memory_budget=budget))
history = trainer.fit(lm_examples(16, length=64, vocab=4096))
print(json.dumps({{"budget": budget, "peak": status_bytes("VmHWM"),
                  "states": 16 * trainer.num_parameters(), "read": [r["offload_read_bytes"] for r in history],
                  "losses": [r["loss"] for r in history]}}))
"""


@pytest.mark.timeout(300)
def test_peak_resident_memory_stays_within_the_budget(tmp_path):
    root = Path(__file__).resolve().parents[2]
    code = RUN.format(root=str(root), tests=str(root / "tests"), benchmarks=str(root / "benchmarks"), out=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["states"] > 200 * 2**20  # 14.6M parameters: more than the budget's 160 MiB of room
    assert result["peak"] <= result["budget"], (result["peak"] - result["budget"]) / 2**20
    assert all(read > 0 for read in result["read"])



CROSSED = """
import sys
sys.path[:0] = [{root!r}, {tests!r}]
import torch
from torch import nn
from trainers import Strategy, TrainConfig, Trainer
from trainers.memory.resident import resident_set_bytes

bare = resident_set_bytes()
model = nn.Sequential(*(nn.Linear(512, 512) for _ in range(13)))  # 3.4M parameters: 13.7 MB, in memory
budget = bare + 16 * sum(p.numel() for p in model.parameters()) // 5
try:
    Trainer(model, TrainConfig(max_steps=1, progress=False, output_dir={out!r}),
            Strategy(offload="chunks", offload_dir={out!r}, memory_budget=budget))
except ValueError as error:
    print(budget, error)
"""


def test_a_budget_the_model_built_in_memory_already_crosses_is_refused_by_name(tmp_path):
    """3.4M parameters built in memory (13.7 MB) under the bare process plus a fifth of their model
    states (11 MB): refused before anything moves, naming the smallest budget that holds."""
    root = Path(__file__).resolve().parents[2]
    code = CROSSED.format(root=str(root), tests=str(root / "tests"), out=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    budget, refusal = done.stdout.strip().splitlines()[-1].split(" ", 1)
    assert refusal.startswith(f"memory_budget={int(budget):,} bytes is below what this process holds now"), refusal
    smallest = int(refusal.split("the smallest budget that holds while they move is ")[1].split()[0].replace(",", ""))
    assert smallest > int(budget) + 11 * 2**20 // 5  # the model, whole, and a chunk

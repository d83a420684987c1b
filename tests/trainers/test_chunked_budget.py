"""A process that trains with chunked states stays within its memory budget: peak resident memory
measured in a fresh process whose model states are more than the room the budget leaves them.
The peak is the process's own high-water mark (VmHWM): getrusage's ru_maxrss keeps, across exec,
the peak of the process that started it (here the test runner's), and resident memory sampled every
10 ms, by phase. A model built in memory holds the budget while it moves into its chunks, through
the steps, the checkpoint's save and, in another process, its load and the resumed step; a budget
the process has already crossed when the trainer starts is refused, naming the smallest that holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RUN = """
import json, sys, torch
sys.path[:0] = [{root!r}, {tests!r}]
from helpers import lm_examples
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
peak = int(next(line for line in open("/proc/self/status") if line.startswith("VmHWM")).split()[1]) * 1024
print(json.dumps({{"budget": budget, "peak": peak,
                  "states": 16 * trainer.num_parameters(), "read": [r["offload_read_bytes"] for r in history],
                  "losses": [r["loss"] for r in history]}}))
"""


@pytest.mark.timeout(300)
def test_peak_resident_memory_stays_within_the_budget(tmp_path):
    root = Path(__file__).resolve().parents[2]
    code = RUN.format(root=str(root), tests=str(root / "tests"), out=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["states"] > 200 * 2**20  # 14.6M parameters: more than the budget's 160 MiB of room
    assert result["peak"] <= result["budget"], (result["peak"] - result["budget"]) / 2**20
    assert all(read > 0 for read in result["read"])


BUILT_IN_MEMORY = """
import json, os, sys, threading, time
sys.path[:0] = [{root!r}, {tests!r}]
import torch
import torch.nn.functional as F
from torch import nn
from helpers import lm_examples
from trainers import Strategy, TrainConfig, Trainer
from trainers.memory.resident import resident_set_bytes
from zoo.plan import ModelPlan


class Mixer(nn.Module):
    \"\"\"A model written here: residual feed-forward blocks over embedded tokens, each predicting the next.\"\"\"

    def __init__(self, vocab, width, hidden, blocks):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, hidden), nn.GELU(),
                                                  nn.Linear(hidden, width)) for _ in range(blocks))
        self.head = nn.Linear(width, vocab)

    def parallel_plan(self):
        return ModelPlan(blocks=("blocks.*",))

    def forward(self, input_ids, labels):
        hidden = self.embed(input_ids)
        for block in self.blocks:
            hidden = hidden + block(hidden)
        return {{"loss": F.cross_entropy(self.head(hidden)[:, :-1].flatten(0, 1), labels[:, 1:].flatten())}}


phase, peaks = ["bare"], {{}}
def sample():
    while True:
        peaks[phase[0]] = max(peaks.get(phase[0], 0), resident_set_bytes())
        time.sleep(0.01)
threading.Thread(target=sample, daemon=True).start()
time.sleep(0.05)
bare = resident_set_bytes()
phase[0] = "build"
torch.manual_seed(0)
model = Mixer(4096, {width}, 2 * {width}, {blocks})
states = 16 * sum(p.numel() for p in model.parameters())
budget = bare + int(states * {room_of_states})
phase[0] = "train"
config = TrainConfig(max_steps={steps}, global_batch_size=2, micro_batch_size=2, progress=False, measure_memory=False,
                     output_dir={out!r}, checkpoint_dir={out!r} + "/checkpoints", resume={resume})
try:
    trainer = Trainer(model, config, Strategy(offload="chunks", offload_dir={out!r} + "/chunks", memory_budget=budget))
except ValueError as error:
    print(json.dumps({{"refused": str(error), "budget": budget}}))
    sys.exit(0)
history = trainer.fit(lm_examples(8, length=64, vocab=4096))
trainer.close()
phase[0] = "end"
time.sleep(0.05)
hwm = int(next(line for line in open("/proc/self/status") if line.startswith("VmHWM")).split()[1]) * 1024
print(json.dumps({{"budget": budget, "states": states, "hwm": hwm, "peaks": peaks, "steps": [r["step"] for r in history]}}))
"""


def built_in_memory(tmp_path, width: int, blocks: int, room_of_states: float, steps: int, resume: bool) -> dict:
    """The result of training a model of `blocks` residual feed-forward blocks `width` wide, built in
    memory, in a fresh process under `offload="chunks"` with a budget of the bare process plus
    `room_of_states` of its model states (to `steps`, from the checkpoint under `tmp_path` with `resume`)."""
    root = Path(__file__).resolve().parents[2]
    code = BUILT_IN_MEMORY.format(root=str(root), tests=str(root / "tests"), out=str(tmp_path), width=width,
                                  blocks=blocks, room_of_states=room_of_states, steps=steps, resume=resume)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(600)
def test_a_model_built_in_memory_trains_saves_and_resumes_within_the_budget(tmp_path):
    """About 100M parameters (1.6 GB of model states), built in memory, under a budget of the bare
    process plus its model states / 2.6: two steps and the checkpoint, then in another process the
    checkpoint's load and a third step, each process's peak (sampled and VmHWM) within its budget."""
    trained = built_in_memory(tmp_path, 1024, 22, 1 / 2.6, steps=2, resume=False)
    resumed = built_in_memory(tmp_path, 1024, 22, 1 / 2.6, steps=3, resume=True)
    assert trained["states"] > 1.6e9
    assert trained["steps"] == [2] and resumed["steps"] == [3]  # the second process went on from step 2
    for result in (trained, resumed):
        assert max(result["hwm"], *result["peaks"].values()) <= result["budget"], (
            (result["hwm"] - result["budget"]) / 2**20, result["peaks"])


def test_a_budget_the_model_built_in_memory_already_crosses_is_refused_by_name(tmp_path):
    """3.4M parameters built in memory (13 MB) under the bare process plus a fifth of their model
    states (11 MB): refused before anything moves, naming the smallest budget that holds."""
    result = built_in_memory(tmp_path, 256, 12, 1 / 5, steps=1, resume=False)
    assert result["refused"].startswith(f"memory_budget={result['budget']:,} bytes is below what this process holds "
                                        "now"), result
    smallest = int(result["refused"].split("the smallest budget that holds while they move is ")[1].split()[0]
                   .replace(",", ""))
    assert smallest > result["budget"]

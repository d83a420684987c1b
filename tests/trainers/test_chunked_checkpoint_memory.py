"""A model whose states are larger than the memory it is given trains, saves and resumes a checkpoint
with its states in chunks, each in a fresh process whose peak resident memory stays within the budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

RUN = textwrap.dedent("""
    import json, os, resource, sys
    import torch
    from torch import nn
    from trainers import Strategy, TrainConfig, Trainer

    def resident():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    class Deep(nn.Module):
        # 24 residual layers of 2048 x 2048: 100.7M parameters, 1.61 GB of fp32 states with AdamW
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layers = nn.ModuleList(nn.Linear(2048, 2048) for _ in range(24))

        def forward(self, x, y):
            for layer in self.layers:
                x = x + torch.tanh(layer(x)) * 0.1
            return {"loss": (x.sum(-1) - y).square().mean()}

    folder, steps, resume = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "resume"
    model = Deep()  # built whole, on the CPU: copied into chunks by the trainer
    built = resident()
    generator = torch.Generator().manual_seed(1)
    data = [{"x": torch.randn(2048, generator=generator), "y": torch.randn((), generator=generator)} for _ in range(8)]
    config = TrainConfig(global_batch_size=4, micro_batch_size=2, max_steps=steps, lr=1e-4, warmup_steps=1, log_every=1,
                         progress=False, output_dir=f"{folder}/run", checkpoint_dir=f"{folder}/checkpoints",
                         resume=resume, measure_memory=False)
    strategy = Strategy(offload="chunks", offload_dir=f"{folder}/chunks", memory_budget=built + 512 * 2**20)
    history = Trainer(model, config, strategy).fit(data)
    print(json.dumps({"built": built, "budget": strategy.memory_budget,
                      "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "states": 16 * sum(p.numel() for p in model.parameters()),
                      "losses": {record["step"]: record["loss"] for record in history}}))
""")


def run(folder: Path, steps: int, resume: bool) -> dict:
    result = subprocess.run([sys.executable, "-c", RUN, str(folder), str(steps), "resume" if resume else "fresh"],
                            capture_output=True, text=True, timeout=400, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.sequential
@pytest.mark.timeout(900)
def test_a_model_of_100m_parameters_trains_saves_and_resumes_within_its_budget(tmp_path):
    """2 steps, a checkpoint, then a fresh process resumes it for a third step: the peak resident
    memory of each process grows above the model it built by at most 1/2.5 of the states' bytes (the
    budget is 512 MiB above it), checkpoint included; the resumed step continues the run exactly."""
    saving = run(tmp_path / "run", 2, resume=False)
    resumed = run(tmp_path / "run", 3, resume=True)
    straight = run(tmp_path / "straight", 3, resume=False)
    for outcome in (saving, resumed, straight):
        assert outcome["states"] > 1.6e9
        assert outcome["peak"] <= outcome["budget"]
        assert outcome["peak"] - outcome["built"] <= outcome["states"] / 2.5, outcome
    assert list(resumed["losses"]) == ["3"]
    assert resumed["losses"]["3"] == pytest.approx(straight["losses"]["3"], rel=1e-6)

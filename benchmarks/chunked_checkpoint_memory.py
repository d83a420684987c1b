"""Peak resident memory of a process that trains a 100.7M-parameter model (1.61 GB of fp32 states
with AdamW) with its states in chunks under a budget 512 MiB above the built model, and saves a
checkpoint every 2 steps and after its last (or resumes the newest one first).

    python benchmarks/chunked_checkpoint_memory.py FOLDER STEPS fresh|resume

prints one JSON line: the resident bytes once the model was built, the budget, the process's peak,
the state bytes and each step's loss. tests/trainers/test_chunked_checkpoint_memory.py runs it.
"""

import json
import os
import resource
import sys

import torch
from torch import nn

from trainers import Strategy, TrainConfig, Trainer


def resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Deep(nn.Module):
    """24 residual layers of 2048 x 2048: 100.7M parameters."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(2048, 2048) for _ in range(24))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        for layer in self.layers:
            x = x + torch.tanh(layer(x)) * 0.1
        return {"loss": (x.mean(-1) - y).square().mean()}


def main(folder: str, steps: int, resume: bool) -> None:
    model = Deep()  # built whole, on the CPU: copied into chunks by the trainer
    built = resident()
    generator = torch.Generator().manual_seed(1)
    data = [{"x": torch.randn(2048, generator=generator), "y": torch.randn((), generator=generator)} for _ in range(8)]
    config = TrainConfig(global_batch_size=4, micro_batch_size=2, max_steps=steps, lr=1e-4, warmup_steps=1, log_every=1,
                         progress=False, output_dir=f"{folder}/run", checkpoint_dir=f"{folder}/checkpoints",
                         checkpoint_every=2, resume=resume, measure_memory=False)
    strategy = Strategy(offload="chunks", offload_dir=f"{folder}/chunks", memory_budget=built + 512 * 2**20)
    history = Trainer(model, config, strategy).fit(data)
    print(json.dumps({"built": built, "budget": strategy.memory_budget,
                      "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "states": 16 * sum(p.numel() for p in model.parameters()),
                      "losses": {record["step"]: record["loss"] for record in history}}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "resume")

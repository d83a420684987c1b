"""Peak resident memory of a process that builds a 100.7M-parameter model in memory (1.61 GB of fp32
states with AdamW) and trains it with its states in chunks under a budget of the bare process (before
the model was built) plus the states' bytes / 2.6, saving a checkpoint every 2 steps and after its
last (or resuming the newest one first).

    python benchmarks/chunked_checkpoint_memory.py FOLDER STEPS fresh|resume

prints one JSON line: the resident bytes of the bare process and once the model was built, the
budget, the process's peak (its high-water mark, VmHWM, and the resident memory sampled every 10 ms,
whichever is larger), the state bytes and each step's loss.
tests/trainers/test_chunked_checkpoint_memory.py runs it.
"""

import json
import sys
import threading
import time

import torch
from torch import nn

from measure import status_bytes
from trainers import Strategy, TrainConfig, Trainer
from trainers.memory.resident import resident_set_bytes

ROOM_OF_STATES = 1 / 2.6
"""The budget above the bare process, as a share of the model states' bytes."""


class Sampler:
    """The largest resident memory seen by a thread reading it every `period` seconds."""

    def __init__(self, period: float = 0.01) -> None:
        self.peak = resident_set_bytes()
        threading.Thread(target=self._run, args=(period,), daemon=True).start()

    def _run(self, period: float) -> None:
        while True:
            self.peak = max(self.peak, resident_set_bytes())
            time.sleep(period)


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
    sampler = Sampler()
    bare = resident_set_bytes()
    model = Deep()  # built whole, on the CPU: copied into chunks by the trainer
    built = resident_set_bytes()
    states = 16 * sum(p.numel() for p in model.parameters())
    generator = torch.Generator().manual_seed(1)
    data = [{"x": torch.randn(2048, generator=generator), "y": torch.randn((), generator=generator)} for _ in range(8)]
    config = TrainConfig(global_batch_size=4, micro_batch_size=2, max_steps=steps, lr=1e-4, warmup_steps=1, log_every=1,
                         progress=False, output_dir=f"{folder}/run", checkpoint_dir=f"{folder}/checkpoints",
                         checkpoint_every=2, resume=resume, measure_memory=False)
    strategy = Strategy(offload="chunks", offload_dir=f"{folder}/chunks", memory_budget=bare + int(states * ROOM_OF_STATES))
    trainer = Trainer(model, config, strategy)
    history = trainer.fit(data)
    trainer.close()
    time.sleep(0.05)
    print(json.dumps({"bare": bare, "built": built, "budget": strategy.memory_budget,
                      "peak": max(status_bytes("VmHWM"), sampler.peak), "states": states,
                      "losses": {record["step"]: record["loss"] for record in history}}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "resume")

"""A training step's record, and where records go: a JSONL file (always), TensorBoard (when
installed), a progress bar, the "trainers" logger."""

from __future__ import annotations

import json
import logging
import os
import resource
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm


METRICS_FILE = "metrics.jsonl"
log = logging.getLogger("trainers")


def step_record(step: int, loss_sum: torch.Tensor, accumulation: int, lr: float, grad_norm: float, taken: bool,
                units: tuple[str, int] | None, loss_scale: float | None, device: torch.device) -> dict[str, Any]:
    """The record of optimizer step `step` (1-based) whose `accumulation` micro batches' losses summed to
    `loss_sum` on this rank (averaged over the ranks: collective); `units`: (the model's input_ids
    unit, how many all ranks' batches held)."""
    dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG)
    record = {"step": step, "loss": loss_sum.item() / accumulation, "lr": lr, "grad_norm": grad_norm,
              "skipped": not taken, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if units is not None:
        record[units[0]] = units[1]
    if loss_scale is not None:
        record["loss_scale"] = loss_scale
    if device.type == "cuda":
        record["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
    return record


def keep_records_up_to(path: Path, step: int) -> None:
    """Drop the records of steps after `step` from the JSONL file at `path` (if any), atomically: a run
    resumed at `step` writes those steps again, and a fresh run (step 0) starts an empty file."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines(keepends=True)
            if line.strip() and json.loads(line).get("step", 0) <= step]
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text("".join(kept))
    os.replace(staging, path)


class MetricsSink:
    """Rank 0's writer of one JSON object per record to `output_dir/metrics.jsonl`, which holds the
    records of steps 1 .. start_step from before and then this run's. Other ranks construct it
    inactive, so callers need no rank checks."""

    def __init__(self, output_dir: str, *, active: bool, total_steps: int, start_step: int, progress: bool) -> None:
        self.active = active
        self.file = None
        self.board = None
        self.bar = None
        if not active:
            return
        path = Path(output_dir)
        path.mkdir(parents=True, exist_ok=True)
        keep_records_up_to(path / METRICS_FILE, start_step)
        self.file = (path / METRICS_FILE).open("a")
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # TensorBoard is optional.
            SummaryWriter = None
        if SummaryWriter is not None:
            self.board = SummaryWriter(str(path / "tensorboard"))
        if progress:
            self.bar = tqdm(total=total_steps, initial=start_step, desc="train", dynamic_ncols=True)

    def write(self, record: dict[str, Any]) -> None:
        """Append `record` (which has a "step") to the JSONL file and TensorBoard."""
        if not self.active:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.board is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "step":
                    self.board.add_scalar(key, value, record["step"])

    def routing_logs(self) -> AbstractContextManager:
        """While the progress bar shows, log lines are written above it instead of through it."""
        return logging_redirect_tqdm() if self.bar is not None else nullcontext()

    def advance(self, record: dict[str, Any], unit: str, total_steps: int, logged: bool) -> None:
        """Move the progress bar one step, showing `record`'s loss, learning rate, rate (in the
        model's input_ids `unit` where it counts them), memory and, once counted, MFU; with `logged`, also write the
        record (`write`) and log it."""
        rate = (f"{record[f'{unit}_per_second']:,.0f} {unit}/s" if f"{unit}_per_second" in record
                else f"{record['examples_per_second']:,.1f} examples/s")
        memory = f"{record.get('cuda_max_allocated_bytes', record['peak_rss_bytes']) / 2**20:,.0f} MiB"
        if "mfu" in record:
            memory += f", MFU {100 * record['mfu']:.1f}%"
        if logged:
            self.write(record)
            if self.active:
                log.info("step %d/%d loss %.4f%s lr %.2e grad norm %.3g, %s, %s", record["step"], total_steps,
                         record["loss"], f" eval loss {record['eval_loss']:.4f}" if "eval_loss" in record else "",
                         record["lr"], record["grad_norm"], rate, memory)
        if self.bar is not None:
            self.bar.set_postfix({"loss": f"{record['loss']:.4f}", "lr": f"{record['lr']:.2e}", "rate": rate,
                                  "mem": memory}, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        """Flush and close everything."""
        for handle in (self.bar, self.board, self.file):
            if handle is not None:
                handle.close()

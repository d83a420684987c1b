"""Where training records go: a JSONL file (always), TensorBoard (when installed), a progress bar."""

from __future__ import annotations

import json
import os
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm


METRICS_FILE = "metrics.jsonl"


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

    def advance(self, postfix: dict[str, str]) -> None:
        """Move the progress bar one step and show `postfix`."""
        if self.bar is not None:
            self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        """Flush and close everything."""
        for handle in (self.bar, self.board, self.file):
            if handle is not None:
                handle.close()

"""Where training records go: a JSONL file (always), TensorBoard (when installed), a progress bar."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tqdm import tqdm


class MetricsSink:
    """Rank 0's writer of one JSON object per record to `output_dir/metrics.jsonl`. Other ranks
    construct it inactive, so callers need no rank checks."""

    def __init__(self, output_dir: str, *, active: bool, total_steps: int, start_step: int, progress: bool) -> None:
        self.active = active
        self.file = None
        self.board = None
        self.bar = None
        if not active:
            return
        path = Path(output_dir)
        path.mkdir(parents=True, exist_ok=True)
        self.file = (path / "metrics.jsonl").open("a")
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

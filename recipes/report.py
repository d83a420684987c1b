"""Text tables that recipes print and put into model cards."""

from __future__ import annotations

from typing import Any

from trainers import Trainer, estimate_memory

_COLUMNS = ("parameters", "gradients", "optimizer", "other", "activation_peak", "peak")


def format_memory_report(reports: list[dict[str, Any]], estimate: dict[str, float]) -> str:
    """A markdown table: one row per rank of measured bytes (trainers' memory report), and a row
    with the ZeRO-paper estimate of the model states."""
    header = "| rank | " + " | ".join(_COLUMNS) + " |"
    rows = [header, "|" + "---|" * (len(_COLUMNS) + 1)]
    for report in reports:
        rows.append(f"| {report['rank']} | " + " | ".join(f"{report[c]:,}" for c in _COLUMNS) + " |")
    rows.append("| ZeRO paper | " + " | ".join(
        f"{int(estimate[c]):,}" if c in estimate else "" for c in _COLUMNS) + " |")
    return "\n".join(rows)


def trainer_memory_report(trainer: Trainer) -> str:
    """`format_memory_report` of what `trainer` measured, beside the ZeRO-paper estimate for its
    strategy and world size."""
    return format_memory_report(trainer.memory_report(),
                                estimate_memory(trainer.model, trainer.strategy, trainer.env.world_size))

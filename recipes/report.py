"""Text tables that recipes print and put into model cards."""

from __future__ import annotations

from typing import Any

from trainers import Strategy, Trainer, zero_model_states

_COLUMNS = ("parameters", "gradients", "optimizer", "other", "activation_peak", "peak")
MIB = 2**20


def accounting_note(strategy: Strategy) -> str:
    """How the measured columns and the ZeRO paper's row count the same model states under `strategy`."""
    notes = ["MiB = 2^20 bytes. Measured rows: tensor storage per rank at rest (parameters, gradients, "
             "optimizer, other) and at the step's peak. ZeRO paper row: model states only, by its formula."]
    if strategy.precision != "fp32":
        notes.append(f"Under {strategy.precision} the paper counts 2 bytes a parameter for the parameters and "
                     "for the gradients and 12 for the optimizer (fp32 master copy and two moments); here the fp32 "
                     "parameters are the master (4 bytes), gradients are reduced and kept in fp32 (4) and the "
                     "optimizer holds the moments (8): the same 16 bytes a parameter, split differently; the "
                     f"{strategy.precision} copies are transient (in the activation peak).")
    if strategy.offload == "chunks":
        notes.append("With offload='chunks' the model states live in chunks that move between memory and files "
                     f"under {strategy.offload_dir!r}, as many in memory as memory_budget leaves room for: no rank row "
                     "is measured here; each step's record gives the bytes read from and written to the files.")
    if strategy.offload == "optimizer":
        notes.append("With offload='optimizer' the fp32 CPU master copy (4 bytes a parameter) is under 'other'; "
                     "the paper's fp32 formula has no master copy.")
    return " ".join(notes)


def format_memory_report(reports: list[dict[str, Any]], estimate: dict[str, float], strategy: Strategy) -> str:
    """A markdown table in MiB: one row per rank of what was measured (trainers' memory report) and a
    row with the ZeRO-paper estimate of the model states, then the note on how the two count."""
    header = "| rank | " + " | ".join(f"{column} MiB" for column in _COLUMNS) + " |"
    rows = [header, "|" + "---|" * (len(_COLUMNS) + 1)]
    for report in reports:
        rows.append(f"| {report['rank']} | " + " | ".join(f"{report[c] / MIB:,.2f}" for c in _COLUMNS) + " |")
    rows.append("| ZeRO paper | " + " | ".join(
        f"{estimate[c] / MIB:,.2f}" if c in estimate else "" for c in _COLUMNS) + " |")
    return "\n".join(rows) + "\n\n" + accounting_note(strategy)


def trainer_memory_report(trainer: Trainer) -> str:
    """`format_memory_report` of what `trainer` measured, beside the ZeRO-paper estimate for its
    strategy and world size."""
    return format_memory_report(trainer.memory_report(),
                                zero_model_states(trainer.model, trainer.strategy, trainer.env.world_size),
                                trainer.strategy)

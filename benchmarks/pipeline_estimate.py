"""The memory estimator against measured pipelined training steps: every zoo model family at size M
of `benchmarks/memory_estimate.py`, pipelined over 2 gloo ranks under GPipe, 1F1B and zero-bubble,
recompute none and blocks; each pipeline rank's estimate against its measured peak.

    python benchmarks/pipeline_estimate.py [--out benchmarks/results/pipeline_estimate.jsonl]
                                           [--families gpt bert vit conformer fold]

Each step runs 4 micro batches of `memory_estimate.MICRO` examples through the pipeline (each
micro batch the same example repeated, which is what the estimate is given); the stages split
the blocks evenly (`Strategy.pp_split`), the same in the estimate and in the measured run. The
measured figure is each rank's memory report of the second step (the project's tracker: live
tensor bytes). Prints the table of BENCHMARKS.md (MiB; estimate / measured per rank).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure import finish_worker, launch_ranks, ranks_device  # noqa: E402
from memory_estimate import MICRO, WIDTHS, build, example  # noqa: E402

FAMILIES = ("gpt", "bert", "vit", "conformer", "fold")
SIZE = "M"
SCHEDULES = ("gpipe", "1f1b", "zero_bubble")
RECOMPUTE = ("none", "blocks")
PP = 2


def strategy(schedule: str, recompute: str):  # noqa: ANN201
    from trainers import Strategy

    blocks = WIDTHS[SIZE][0]
    return Strategy(pp=PP, pp_schedule=schedule, recompute=recompute, pp_split=(blocks // PP,) * PP)


def trainer_config():  # noqa: ANN201
    from trainers import TrainConfig

    return TrainConfig(global_batch_size=4 * MICRO, micro_batch_size=MICRO, max_steps=2, lr=1e-3, warmup_steps=1,
                       log_every=100, progress=False, output_dir="/tmp/memzoo-pipeline-estimate-bench")


def worker(out: str, families: list[str]) -> None:
    from trainers import Trainer

    rows = []
    for family in families:
        item, collate = example(family)
        for schedule in SCHEDULES:
            for recompute in RECOMPUTE:
                trainer = Trainer(build(family, SIZE), trainer_config(), strategy(schedule, recompute))
                trainer.fit([item] * (8 * MICRO), collate_fn=collate)
                for report in trainer.memory_report():
                    rows.append({"family": family, "schedule": schedule, "recompute": recompute,
                                 "rank": report["rank"], "measured_peak": report["peak"]})
    finish_worker(out, rows)


def estimates(families: list[str]) -> list[dict]:
    from trainers.estimate.trace import estimate_layouts

    rows = []
    for family in families:
        item, collate = example(family)
        cases = [(schedule, recompute) for schedule in SCHEDULES for recompute in RECOMPUTE]
        layouts = [(strategy(schedule, recompute), PP, trainer_config()) for schedule, recompute in cases]
        for (schedule, recompute), estimate in zip(cases, estimate_layouts(functools.partial(build, family, SIZE),
                                                                           collate([item] * MICRO), layouts)):
            for rank in estimate.ranks:
                rows.append({"family": family, "schedule": schedule, "recompute": recompute, "rank": rank.rank,
                             "estimated_peak": rank.peak, "estimate_seconds": estimate.seconds})
    return rows


def table(rows: list[dict]) -> str:
    mib = 2**20
    lines = ["| model | schedule | recompute | rank | estimated peak MiB | measured peak MiB | estimate / measured |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['family']} | {r['schedule']} | {r['recompute']} | {r['rank']} | "
                     f"{r['estimated_peak'] / mib:.2f} | {r['measured_peak'] / mib:.2f} | "
                     f"{r['estimated_peak'] / r['measured_peak']:.3f} |")
    ratios = [r["estimated_peak"] / r["measured_peak"] for r in rows]
    lines.append(f"\n{len(rows)} rank cases: estimate / measured from {min(ratios):.3f} to {max(ratios):.3f}; "
                 f"largest error {max(abs(x - 1) for x in ratios) * 100:.1f}%")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/pipeline_estimate.jsonl")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.out, args.families)
        return
    started = time.time()
    measured = launch_ranks(__file__, [PP], str(Path(args.out).with_suffix(".measured.jsonl")),
                            ["--families", *args.families])
    by_case = {(r["family"], r["schedule"], r["recompute"], r["rank"]): r for r in measured}
    rows = [{**by_case[(e["family"], e["schedule"], e["recompute"], e["rank"])], **e} for e in estimates(args.families)]
    with open(args.out, "w") as sink:
        sink.writelines(json.dumps(row) + "\n" for row in rows)
    print(f"device: {ranks_device()}; torch {torch.__version__}; {time.time() - started:.0f} s\n")
    print(table(rows))


if __name__ == "__main__":
    main()

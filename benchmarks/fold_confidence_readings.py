"""Other readings of the realised fold's confidence than `protein.confidence.distogram_lddt` at its
default temperature, scored by their Pearson r with the true per-residue lDDT-Cα on validation
chains (never trained on) folded from the sequence alone: are the last hundredths of issue 29's
r >= 0.5 in the distogram we have, read differently?

- per-separation temperatures: one temperature for the pairs 1-2, 3-5, 6-11, 12-23 and 24 or more
  residues apart, each chosen in turn (two rounds) on one half of the chains and scored on the other;
- smoothing the confidence along the chain (a Gaussian of the given full width at half maximum);
- P(D < 15 Å), the weight of each pair, read at another temperature than the preserved fraction;
- the distogram averaged over passes with the Evoformer's dropout on (Monte Carlo dropout);
- a least-squares mix of the confidence with the expected neighbour counts, log length and
  Kyte-Doolittle hydrophobicity over windows of 1, 5, 9 and 15 residues, fitted on one half;
- for scale, not a confidence: the true number of neighbours within 15 Å, which no model reads.

Rows fitted on data ("fitted") are fitted on the even-numbered chains and scored on the odd ones,
and the other way round; the r of the pooled out-of-half predictions is given.

    python benchmarks/fold_confidence_readings.py [MODEL] [--chains 30] [--threads 2]
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from protein.confidence import INCLUSION_RADIUS, TEMPERATURE, pair_terms  # noqa: E402
from protein.evaluation import pearson  # noqa: E402
from protein.evoformer import EvoformerBlock  # noqa: E402
from protein.folding import fold  # noqa: E402
from protein.metrics import lddt  # noqa: E402
from protein.residues import KYTE_DOOLITTLE  # noqa: E402
from validation_folds import model_and_chains  # noqa: E402

SEPARATIONS = ((1, 2), (3, 5), (6, 11), (12, 23), (24, None))
"""Classes of sequence separation |i - j| with a temperature each."""
DROPOUT_PASSES = 4
"""Forward passes averaged by the Monte Carlo dropout reading."""
TEMPERATURES = (0.4, 0.5, 0.6, 0.7, 0.85, 1.0, 1.3)


class Chain:
    """One folded chain: its distogram logits (L, L, bins), realised Cα (L, 3), true lDDT-Cα (L,),
    and per temperature and separation class the sums over j of P(preserved) and P(D < 15 Å) (L,)."""

    def __init__(self, sequence: str, logits: torch.Tensor, ca: torch.Tensor, true_ca: torch.Tensor) -> None:
        self.sequence, self.logits, self.ca = sequence, logits, ca
        self.true = lddt(ca, true_ca, per_residue=True).float()
        self.true_neighbours = (torch.cdist(true_ca, true_ca) < INCLUSION_RADIUS).sum(-1).float() - 1
        self.preserved, self.near = self._sums(logits)

    def _sums(self, logits: torch.Tensor) -> tuple[dict, dict]:
        length = len(self.sequence)
        distances = torch.cdist(self.ca.double(), self.ca.double())
        separation = (torch.arange(length)[:, None] - torch.arange(length)[None]).abs()
        classes = [(separation >= low) & (separation <= (high or length)) for low, high in SEPARATIONS]
        preserved, near = {}, {}
        for temperature in TEMPERATURES:
            kept, close = pair_terms((logits.double() / temperature).softmax(-1), distances)
            for c, members in enumerate(classes):
                preserved[temperature, c] = (kept * members).sum(-1)
                near[temperature, c] = (close * members).sum(-1)
        return preserved, near

    def confidence(self, temperatures: tuple[float, ...], near_temperature: float | None = None) -> torch.Tensor:
        """(L,) expected lDDT with one temperature per separation class; near_temperature: the pairs'
        weights P(D < 15) read at that temperature instead (each class's preserved fraction kept)."""
        numerator = denominator = 0.0
        for c, temperature in enumerate(temperatures):
            weight = self.near[near_temperature or temperature, c]
            numerator = numerator + weight * self.preserved[temperature, c] / self.near[temperature, c].clamp_min(1e-12)
            denominator = denominator + weight
        return (numerator / denominator.clamp_min(1e-12)).float()

    def features(self) -> torch.Tensor:
        """(L, 8): the default confidence, expected neighbours at 0.7 and 1.0, log length, hydrophobicity
        averaged over windows of 1, 5, 9 and 15 residues."""
        default = self.confidence((TEMPERATURE,) * len(SEPARATIONS))
        neighbours = [sum(self.near[t, c] for c in range(len(SEPARATIONS))).float() for t in (0.7, 1.0)]
        length = torch.full_like(default, math.log(len(self.sequence)))
        hydrophobicity = torch.tensor([KYTE_DOOLITTLE.get(a, 0.0) for a in self.sequence])
        windows = [smoothed(hydrophobicity, width, box=True) for width in (1, 5, 9, 15)]
        return torch.stack([default, *neighbours, length, *windows], -1)


def smoothed(x: torch.Tensor, width: float, box: bool = False) -> torch.Tensor:
    """(L,) averaged along the chain over a box of `width` residues, or a Gaussian of that full width
    at half maximum; the ends averaged over what exists."""
    if width <= 1:
        return x
    if box:
        kernel = torch.ones(int(width))
    else:
        sigma = width / 2.3548
        offsets = torch.arange(-math.ceil(3 * sigma), math.ceil(3 * sigma) + 1, dtype=torch.float32)
        kernel = torch.exp(-offsets**2 / (2 * sigma**2))
    pad = (len(kernel) // 2, len(kernel) - 1 - len(kernel) // 2)
    total = torch.nn.functional.conv1d(torch.nn.functional.pad(x[None, None].float(), pad), kernel[None, None])
    count = torch.nn.functional.conv1d(torch.nn.functional.pad(torch.ones_like(x)[None, None].float(), pad),
                                       kernel[None, None])
    return (total / count)[0, 0]


def scored(chains: list[Chain], confidences: list[torch.Tensor]) -> tuple[float, float]:
    """Pearson r over all residues, and its median per chain."""
    pooled = pearson(torch.cat(confidences), torch.cat([c.true for c in chains]))
    return pooled, statistics.median(pearson(x, c.true) for x, c in zip(confidences, chains, strict=True))


def halves(chains: list[Chain]) -> tuple[list[int], list[int]]:
    return list(range(0, len(chains), 2)), list(range(1, len(chains), 2))


def cross_fitted(chains: list[Chain], fit: Callable[[list[int]], Callable[[Chain], torch.Tensor]]) -> list[torch.Tensor]:
    """Each chain's confidence from the reading `fit` chose on the other half of the chains."""
    even, odd = halves(chains)
    out: list[torch.Tensor] = [torch.empty(0)] * len(chains)
    for fitted_on, scored_on in ((even, odd), (odd, even)):
        reading = fit(fitted_on)
        for index in scored_on:
            out[index] = reading(chains[index])
    return out


def separation_temperatures(chains: list[Chain]) -> Callable[[list[int]], Callable[[Chain], torch.Tensor]]:
    def fit(indices: list[int]) -> Callable[[Chain], torch.Tensor]:
        picked = [chains[i] for i in indices]
        temperatures = [TEMPERATURE] * len(SEPARATIONS)
        for _ in range(2):
            for c in range(len(SEPARATIONS)):
                temperatures[c] = max(TEMPERATURES, key=lambda t: scored(
                    picked, [x.confidence(tuple(temperatures[:c] + [t] + temperatures[c + 1 :])) for x in picked])[0])
        print(f"  separation temperatures fitted on {len(indices)} chains: {temperatures}")
        return lambda chain: chain.confidence(tuple(temperatures))
    return fit


def least_squares_mix(chains: list[Chain]) -> Callable[[list[int]], Callable[[Chain], torch.Tensor]]:
    def fit(indices: list[int]) -> Callable[[Chain], torch.Tensor]:
        design = torch.cat([torch.cat([chains[i].features(), torch.ones(len(chains[i].true), 1)], -1) for i in indices])
        target = torch.cat([chains[i].true for i in indices])
        weights = torch.linalg.lstsq(design.double(), target.double()[:, None]).solution.float()
        return lambda chain: (torch.cat([chain.features(), torch.ones(len(chain.true), 1)], -1) @ weights)[:, 0]
    return fit


def dropout_distogram(model: torch.nn.Module, sequence: str, distograms: dict[str, torch.Tensor]) -> torch.Tensor:
    """(L, L, bins) log of the distogram probabilities averaged over DROPOUT_PASSES forward passes with
    the Evoformer blocks' dropout on (everything else in eval mode); `distograms["last"]` is where the
    model's forward hook leaves its logits."""
    blocks = [m for m in model.modules() if isinstance(m, EvoformerBlock)]
    hooks = [block.register_forward_pre_hook(lambda m, _inputs: setattr(m, "training", True)) for block in blocks]
    probabilities = []
    try:
        for k in range(DROPOUT_PASSES):
            torch.manual_seed(k)
            fold(model, sequence, realisation=None)
            probabilities.append(distograms["last"].float().softmax(-1))
    finally:
        for hook in hooks:
            hook.remove()
        model.eval()
    return torch.stack(probabilities).mean(0).clamp_min(1e-12).log()


def main() -> None:
    model, validation, args = model_and_chains(__doc__, 30)
    distograms: dict[str, torch.Tensor] = {}
    model.register_forward_hook(lambda _m, _i, out: distograms.__setitem__("last", out["distogram_logits"][0]))
    started = time.perf_counter()
    chains, dropout_chains = [], []
    for chain in validation:
        prediction = fold(model, chain.sequence)
        ca, true_ca = prediction.backbone[:, 1], chain.coordinates[:, 1]
        chains.append(Chain(chain.sequence, distograms["last"], ca, true_ca))
        dropout_chains.append(Chain(chain.sequence, dropout_distogram(model, chain.sequence, distograms), ca, true_ca))
    print(f"{args.model}: {len(chains)} validation chains ({statistics.fmean(len(c.sequence) for c in chains):.0f} "
          f"residues on average) folded, realised and read in {time.perf_counter() - started:.0f} s "
          f"({DROPOUT_PASSES} dropout passes each)\n")
    default = (TEMPERATURE,) * len(SEPARATIONS)
    rows = [("distogram's expected lDDT, temperature 0.7 (the default)", [c.confidence(default) for c in chains]),
            ("per-separation temperatures (fitted)", cross_fitted(chains, separation_temperatures(chains)))]
    rows += [(f"the default smoothed along the chain, Gaussian of {w} residues",
              [smoothed(c.confidence(default), w) for c in chains]) for w in (3, 5, 9)]
    rows += [(f"pair weights P(D < 15 Å) at temperature {t}", [c.confidence(default, t) for c in chains])
             for t in (1.0, 1.3)]
    rows += [(f"distogram averaged over {DROPOUT_PASSES} passes with dropout", [c.confidence(default) for c in dropout_chains]),
             ("least-squares mix with neighbours, length, hydrophobicity (fitted)",
              cross_fitted(chains, least_squares_mix(chains))),
             ("(not a confidence) minus the true neighbour count within 15 Å", [-c.true_neighbours for c in chains])]
    print("| reading | Pearson r, all residues | median r per chain |\n|---|---|---|")
    for name, confidences in rows:
        pooled, median = scored(chains, confidences)
        print(f"| {name} | {pooled:.3f} | {median:.3f} |")


if __name__ == "__main__":
    main()

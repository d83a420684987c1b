"""A float64 brute-force transducer loss: the log-sum over every alignment, enumerated one by one.

Only for tiny lattices (the count of alignments is C(T+U-1, U) regular, C(T, U) modified)."""

from __future__ import annotations

import itertools
import math

import torch


def alignments(frames: int, symbols: int, topology: str):
    """Each alignment as a list of arcs (t, u, is_label) from (0, 0) to the end."""
    if topology == "regular":
        # T + U arcs; the last is the final blank, the other T + U - 1 hold the U labels somewhere.
        for places in itertools.combinations(range(frames + symbols - 1), symbols):
            t = u = 0
            arcs = []
            for step in range(frames + symbols):
                is_label = step in places
                arcs.append((t, u, is_label))
                u, t = (u + 1, t) if is_label else (u, t + 1)
            yield arcs
    else:
        for places in itertools.combinations(range(frames), symbols):
            arcs, u = [], 0
            for t in range(frames):
                arcs.append((t, u, t in places))
                u += t in places
            yield arcs


def brute_force_nll(log_probs: torch.Tensor, targets: list[int], blank: int, topology: str = "regular",
                    allowed=None, delay_penalty: float = 0.0) -> torch.Tensor:
    """-log p(y | x) for one sample, differentiable. log_probs: (T, U+1, V) float64 log-probabilities;
    `allowed(t, u)` restricts the paths to the nodes it accepts (a pruned lattice)."""
    frames, symbols = log_probs.shape[0], len(targets)
    scores = []
    for arcs in alignments(frames, symbols, topology):
        if allowed is not None and not all(allowed(t, u) for t, u, _ in arcs):
            continue
        score = log_probs.new_zeros(())
        for t, u, is_label in arcs:
            if is_label:
                score = score + log_probs[t, u, targets[u]] + delay_penalty * ((frames - 1) / 2 - t)
            else:
                score = score + log_probs[t, u, blank]
        scores.append(score)
    if not scores:
        return log_probs.new_tensor(math.inf)
    return -torch.logsumexp(torch.stack(scores), 0)

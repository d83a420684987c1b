"""Transducer (RNN-T) losses that fit in memory.

- `rnnt_loss`: the full loss on (B, T, U+1, V) logits, gradient in closed form inside the forward pass.
- `simple_rnnt_loss`, `prune_ranges`, `prune_decoder`, `pruned_rnnt_loss`, `pruned_transducer_losses`:
  pruned RNN-T (the additive-joiner loss chooses a window of S columns per frame; the joiner and the
  loss run on (B, T, S, V) only).
- `samplewise_rnnt_loss`: a group of samples' joiner output alive at a time, alone or with `Pruning`.
The lattice itself (log-likelihood and arc occupancies) is `occupancies`.
"""

from asr.losses.lattice import Occupancies, occupancies
from asr.losses.pruned import prune_decoder, prune_ranges, pruned_rnnt_loss, pruned_transducer_losses
from asr.losses.rnnt import LossOptions, rnnt_loss
from asr.losses.samplewise import Pruning, samplewise_rnnt_loss
from asr.losses.simple import lattice_loss, simple_rnnt_loss

__all__ = ["LossOptions", "Occupancies", "Pruning", "lattice_loss", "occupancies", "prune_decoder", "prune_ranges",
           "pruned_rnnt_loss", "pruned_transducer_losses", "rnnt_loss", "samplewise_rnnt_loss", "simple_rnnt_loss"]

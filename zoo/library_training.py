"""What a model of another library does at inference that training must not: transformers' key/value
cache. A transformers model whose config has `use_cache` on builds a cache in every forward, training
ones included, and each attention appends its keys and values to it: a block recomputed in backward
would append them a second time and attend over both copies, and the cache holds every block's keys
and values until the forward returns. `for_training` turns it off, as transformers' own gradient
checkpointing does."""

from __future__ import annotations

from torch import nn


def for_training(model: nn.Module) -> list[str]:
    """Turn off, in place, what `model`'s library does at inference only; one line per change, for
    the caller to log (empty when nothing changed)."""
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", None) is not True:
        return []
    config.use_cache = False
    return [f"{type(model).__name__} trains with config.use_cache=False: transformers' key/value cache would hold "
            "every block's keys and values through the forward, and a recomputed block's twice"]

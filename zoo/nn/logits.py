"""When a model with labels forms its logits.

Hugging Face's models return "loss" and "logits" together. The vocabulary-sized logits are the
largest activation of a language model, and a caller that needs only the loss (the trainer, in
training and in evaluation) says so by running the model inside `loss_only()`; the model then takes
its fused path (`linear_cross_entropy`), which never forms them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_LOSS_ONLY: ContextVar[bool] = ContextVar("memzoo_loss_only", default=False)


@contextmanager
def loss_only() -> Iterator[None]:
    """Models called inside need to return only their loss (see `skip_logits`)."""
    token = _LOSS_ONLY.set(True)
    try:
        yield
    finally:
        _LOSS_ONLY.reset(token)


def skip_logits(requested: bool | None, training: bool, has_labels: bool) -> bool:
    """Whether a forward returns the loss alone: `requested` when given; otherwise when it has labels
    and the module is training or runs inside `loss_only()`. ValueError for a loss with no labels."""
    skip = (has_labels and (training or _LOSS_ONLY.get())) if requested is None else requested
    if skip and not has_labels:
        raise ValueError("skip_logits=True returns only the loss, which needs labels; got labels=None")
    return skip

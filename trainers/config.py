"""`TrainConfig`: what to optimise and for how long; independent of how it is spread over ranks."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields

from zoo.adapters import LoRA


@dataclass
class TrainConfig:
    """Training hyper-parameters and bookkeeping. Results do not depend on the number of ranks:
    gradient accumulation is derived as global_batch_size / (micro_batch_size x world size)."""

    global_batch_size: int = 32
    """Examples per optimizer step, summed over all ranks and accumulation steps."""

    micro_batch_size: int = 8
    """Examples per forward/backward on one rank."""

    max_steps: int = 100
    """Optimizer steps to run (counting from step 0, also when resuming)."""

    lr: float = 3e-4
    """Peak learning rate of AdamW, reached at the end of warm-up."""

    min_lr_ratio: float = 0.1
    """Learning rate at the end of the cosine decay, as a fraction of `lr`."""

    warmup_steps: int = 10
    """Steps of linear warm-up from 0 to `lr`."""

    weight_decay: float = 0.1
    """AdamW decoupled weight decay, applied to matrices (tensors of 2 or more dimensions) only."""

    lr_scales: dict[str, float] = field(default_factory=dict)
    """Learning-rate multipliers by parameter-name prefix, e.g. {"encoder.": 0.1} to fine-tune a
    pretrained encoder more gently than a new head: a parameter's learning rate is the schedule's
    times the scale of the longest prefix its name starts with (1 where none does). On the command
    line `--train.lr_scales encoder.=0.1,joiner.=2`."""

    anchor_decay: dict[str, float] = field(default_factory=dict)
    """Decay toward reference weights by parameter-name prefix (L2-SP, Li et al. 2018, decoupled as
    AdamW decouples weight decay): after each update a parameter whose name starts with a prefix
    moves lr x its lr_scale x the longest prefix's value of the way back to its anchor, e.g.
    {"encoder.": 5.0} to keep a fine-tuned pretrained encoder near what it knew. The anchors are
    `Trainer(anchor=...)`'s tensors, else the parameters as the trainer found them. On the command
    line `--train.anchor_decay encoder.=5`."""

    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW (beta1, beta2)."""

    eps: float = 1e-8
    """AdamW epsilon."""

    grad_clip: float = 1.0
    """Clip the global gradient norm (computed over all shards) to this value; 0 disables."""

    max_skipped_steps: int = 16
    """Steps in a row that may be skipped because their gradient norm is not finite (each skip is
    logged) before training stops with an error. Under fp16 each skip halves the loss scale, so the
    default lets the starting scale of 2^16 fall to 1."""

    seed: int = 0
    """Seed of data order, augmentation and dropout: each micro batch reseeds torch's generator from
    (seed, step, its position in the global batch), so results do not depend on the number of ranks."""

    log_every: int = 10
    """Log loss, lr, throughput and memory every this many steps."""

    eval_every: int = 0
    """Evaluate every this many steps (0: only after the last step, when an eval set is given)."""

    eval_batches: int = 8
    """Micro batches in one evaluation (its first eval_batches x micro_batch_size examples, shared
    out over the ranks)."""

    checkpoint_every: int = 0
    """Save a checkpoint every this many steps (0: only after the last step, when a dir is set)."""

    checkpoint_dir: str | None = None
    """Directory of checkpoints (`step_00000100/` folders and a `latest` pointer); None: no saving.
    A path-like value is kept as its str."""

    keep_checkpoints: int = 3
    """Newest checkpoints kept in `checkpoint_dir`; older ones are deleted after each save."""

    resume: bool = False
    """Continue from `checkpoint_dir/latest` when it exists."""

    output_dir: str = "runs/default"
    """Where `metrics.jsonl` (and TensorBoard events, when installed) are written."""

    progress: bool = True
    """Show a progress bar on rank 0."""

    adapter: LoRA | None = None
    """Fine-tune through low-rank adapters (`zoo.adapters.LoRA`) instead of the whole model: the
    trainer attaches them to the model it is given (in place) and freezes every other parameter,
    which then gets no gradient and no optimizer state; `Trainer.save_adapter` writes them in
    PEFT's format. None: every parameter with requires_grad trains."""

    measure_memory: bool = True
    """Measure one step of each rank with the live-tensor tracker (`Trainer.memory_report()`, the
    recipes' memory tables). On CPU the tracker roughly doubles that step's time; a run that never
    reads the report (a parity check of a few steps) may turn it off. A memory budget measures its
    held steps whatever this says."""

    def __post_init__(self) -> None:
        for name in ("checkpoint_dir", "output_dir"):  # paths are kept as str: the config is saved as JSON
            if isinstance(getattr(self, name), os.PathLike):
                setattr(self, name, os.fspath(getattr(self, name)))
        for field in fields(self):
            value = getattr(self, field.name)
            kind = _KINDS[field.name]
            if not _is_kind(value, kind):
                raise TypeError(f"TrainConfig.{field.name} must be {_KIND_NAMES[kind]}; got {value!r}")
        for name, (accepts, expected) in _RULES.items():
            value = getattr(self, name)
            values = value if isinstance(value, tuple) else (value,)
            if not all(math.isfinite(v) and accepts(v) for v in values):
                raise ValueError(f"TrainConfig.{name} must be {expected}; got {value!r}")
        for prefix, scale in self.lr_scales.items():
            if not prefix or not math.isfinite(scale) or scale <= 0:
                raise ValueError(f"TrainConfig.lr_scales must map non-empty parameter-name prefixes to finite "
                                 f"scales > 0 (freeze a part with requires_grad=False instead of a scale of 0); "
                                 f"got {self.lr_scales!r}")
        for prefix, strength in self.anchor_decay.items():
            if not prefix or not math.isfinite(strength) or strength <= 0:
                raise ValueError(f"TrainConfig.anchor_decay must map non-empty parameter-name prefixes to finite "
                                 f"decays > 0; got {self.anchor_decay!r}")

    def lr_scale(self, name: str) -> float:
        """The learning-rate multiplier of the parameter called `name` (`lr_scales`' longest prefix of it)."""
        return _longest_prefix_value(self.lr_scales, name, 1.0)

    def anchor_strength(self, name: str) -> float:
        """The decay toward its anchor of the parameter called `name` (`anchor_decay`'s longest
        prefix of it; 0 where none is)."""
        return _longest_prefix_value(self.anchor_decay, name, 0.0)


def _longest_prefix_value(values: dict[str, float], name: str, default: float) -> float:
    prefix = max((p for p in values if name.startswith(p)), key=len, default=None)
    return default if prefix is None else float(values[prefix])


_KINDS = {"global_batch_size": int, "micro_batch_size": int, "max_steps": int, "lr": float, "min_lr_ratio": float,
          "warmup_steps": int, "weight_decay": float, "lr_scales": "scales", "anchor_decay": "scales", "betas": "pair", "eps": float,
          "grad_clip": float, "max_skipped_steps": int, "seed": int, "log_every": int, "eval_every": int, "eval_batches": int, "checkpoint_every": int,
          "checkpoint_dir": "path", "keep_checkpoints": int, "resume": bool, "output_dir": str, "progress": bool,
          "measure_memory": bool, "adapter": "adapter"}
_KIND_NAMES = {int: "an int", float: "a number", bool: "a bool", str: "a str", "pair": "a pair of numbers",
               "path": "a str or None", "scales": "a dict of str prefixes to numbers",
               "adapter": "a zoo.adapters.LoRA or None"}
_POSITIVE = (lambda v: v > 0, "> 0")
_NON_NEGATIVE = (lambda v: v >= 0, ">= 0")
_RULES = {
    "global_batch_size": _POSITIVE, "micro_batch_size": _POSITIVE, "max_steps": _POSITIVE, "lr": _POSITIVE,
    "min_lr_ratio": (lambda v: 0 <= v <= 1, "in [0, 1]"), "warmup_steps": _NON_NEGATIVE,
    "weight_decay": _NON_NEGATIVE, "betas": (lambda v: 0 <= v < 1, "a pair in [0, 1)"), "eps": _POSITIVE,
    "grad_clip": _NON_NEGATIVE, "max_skipped_steps": _POSITIVE, "seed": _NON_NEGATIVE, "log_every": _POSITIVE, "eval_every": _NON_NEGATIVE,
    "eval_batches": _POSITIVE, "checkpoint_every": _NON_NEGATIVE, "keep_checkpoints": _POSITIVE,
}
"""Each numeric field's (test, what it must be); every value must also be finite."""


def _is_kind(value, kind) -> bool:
    """Whether `value` is of the field kind `kind` (bools are not ints here, ints are numbers)."""
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    if kind == "path":
        return value is None or isinstance(value, str)
    if kind == "adapter":
        return value is None or isinstance(value, LoRA)
    if kind == "scales":
        return isinstance(value, dict) and all(isinstance(k, str) and _is_kind(v, float) for k, v in value.items())
    return isinstance(value, tuple) and len(value) == 2 and all(_is_kind(v, float) for v in value)

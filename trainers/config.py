"""`TrainConfig`: what to optimise and for how long; independent of how it is spread over ranks."""

from __future__ import annotations

from dataclasses import dataclass


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

    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW (beta1, beta2)."""

    eps: float = 1e-8
    """AdamW epsilon."""

    grad_clip: float = 1.0
    """Clip the global gradient norm (computed over all shards) to this value; 0 disables."""

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
    """Directory of checkpoints (`step_00000100/` folders and a `latest` pointer); None: no saving."""

    resume: bool = False
    """Continue from `checkpoint_dir/latest` when it exists."""

    output_dir: str = "runs/default"
    """Where `metrics.jsonl` (and TensorBoard events, when installed) are written."""

    progress: bool = True
    """Show a progress bar on rank 0."""

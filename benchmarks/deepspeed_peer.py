"""The same GPT under DeepSpeed ZeRO, measured with the same instruments, for trainer_memory.py.

Only imported where `deepspeed` imports (on CPU: DS_ACCELERATOR=cpu, gloo). DeepSpeed keeps its
model states in flat partitions that no tracker installed after initialisation sees, so both
frameworks are compared by a census of live tensor storages at rest (`live_tensor_bytes`), taken
after the last step and minus the census before the model was built.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import deepspeed
import torch
from torch import nn

from trainers.memory.measure import live_tensor_bytes

OFFLOAD_KEYS = {"none": {}, "optimizer": {"offload_optimizer": {"device": "cpu"}},
                "params": {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}}


def supported(zero: int, offload: str) -> bool:
    """DeepSpeed offloads the optimizer from stage 1 on and parameters at stage 3 only."""
    return offload == "none" or (offload == "optimizer" and zero >= 1) or (offload == "params" and zero == 3)


def run(build_model: Callable[[], nn.Module], batches: list[dict[str, torch.Tensor]], zero: int, offload: str,
        lr: float = 3e-4) -> dict[str, float]:
    """Train one micro batch per step on each batch; return census bytes at rest and step time."""
    before = sum(live_tensor_bytes().values())
    model = build_model()
    hidden = max(p.shape[-1] for p in model.parameters())
    # Bucket sizes as the Hugging Face integration's "auto" sets them; DeepSpeed's own defaults
    # (5e8-element reduce buckets) would add gigabytes of buffers to a model this small.
    buckets = {"reduce_bucket_size": hidden * hidden, "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
               "stage3_param_persistence_threshold": 10 * hidden}
    config = {
        "train_micro_batch_size_per_gpu": batches[0]["input_ids"].shape[0],
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": zero, **buckets, **OFFLOAD_KEYS[offload]},
        "zero_force_ds_cpu_optimizer": False,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.1, "torch_adam": True}},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    seconds = []
    for batch in batches:
        started = time.perf_counter()
        engine.backward(engine(**batch)["loss"])
        engine.step()
        seconds.append(time.perf_counter() - started)
    at_rest = sum(live_tensor_bytes().values()) - before
    engine.destroy()
    return {"census_bytes": at_rest, "step_seconds": statistics.median(seconds[2:] or seconds)}

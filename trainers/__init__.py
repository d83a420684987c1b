"""memzoo's training core: one `Strategy` (ZeRO 0-3, CPU offload, bf16/fp16, recompute) applied
to any model by the `Trainer`, on torch.distributed (FSDP2, DTensor, distributed checkpoint).

`trainers` imports no domain package: models declare their plan (`zoo.plan.ModelPlan`) and the
trainer applies it. The house, top down (arrows point down: nothing imports `trainer`, and the
estimator steps through `step` and `parallelize` as the trainer does):

    config, strategy   the specs
    trainer            fit / evaluate / save / resume
    step               a step's micro-batch loop, shared by the trainer and the estimator
    parallelize        the one ordered application: pipeline split, tensor parallelism, recompute,
                       FSDP2 on "dp", materialise
    parallel/  pipeline/  memory/  estimate/  state/  loop/  commands/
"""

from trainers.config import TrainConfig
from trainers.estimate.devices import DeviceSpec
from trainers.estimate.trace import MemoryEstimate, estimate_layouts, estimate_memory
from trainers.estimate.zero import zero_model_states
from trainers.estimate.planner import Plan, SearchSpace, plan
from trainers.strategy import Strategy
from trainers.trainer import Trainer
from zoo.adapters import LoRA

__all__ = ["Trainer", "TrainConfig", "Strategy", "LoRA", "estimate_memory", "estimate_layouts", "MemoryEstimate",
           "zero_model_states", "plan", "Plan", "SearchSpace", "DeviceSpec"]

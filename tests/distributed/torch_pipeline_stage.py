"""torch.distributed.pipelining's own stage and schedule on 2 ranks: two steps of GPipe over a
linear split in two stages, the second step's carries of another sequence length (as the padded
batches of another length a trainer meets). torch's `PipelineStage` fixes its carries' shapes at
the first micro batch it runs, so the second step's transfer does not fit what the receiver
allocated: the run fails. `tests/distributed/test_pipeline.py` runs this to show why the pipeline
runtime (`trainers.pipeline.runtime`) does not stand on these classes.

    torchrun --nproc_per_node 2 tests/distributed/torch_pipeline_stage.py
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    stage = PipelineStage(nn.Linear(8, 8), rank, 2, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, target: (out - target).square().mean())
    for length in (5, 7):
        if rank == 0:
            schedule.step(torch.randn(4, length, 8))
        else:
            losses: list[torch.Tensor] = []
            schedule.step(target=torch.randn(4, length, 8), losses=losses)
        print(f"rank {rank}: a step of length {length} ran", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

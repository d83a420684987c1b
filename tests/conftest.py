"""Without a GPU, Triton kernels run in Triton's CPU interpreter. The switch must be set before
anything imports triton (torch may import it early), so it is set here, first."""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

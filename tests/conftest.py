"""Without a GPU, Triton kernels run in Triton's CPU interpreter. The switch must be set before
anything imports triton (torch may import it early), so it is set here, first."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(autouse=True)
def _default_chunk_bytes():
    """A trainer holding a memory budget sets the fused layers' process-wide chunk size; each
    test starts from the default."""
    yield
    from zoo.nn import chunk_memory

    chunk_memory.set_chunk_bytes(None)

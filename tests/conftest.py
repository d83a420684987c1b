"""Without a GPU, Triton kernels run in Triton's CPU interpreter. The switch must be set before
anything imports triton (torch may import it early), so it is set here, first.

Tests that start several training ranks at once (torchrun, or the planner timing a 4-rank gloo
link) are marked `ranks`: `make test` runs the others two at a time (one per core; each runs on
one thread) and these alone, since sharing the cores with another test would slow their
collectives several times over. Every test under tests/distributed is marked here; elsewhere the
test says so itself."""

import os
from pathlib import Path

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if Path(item.path).parent.name == "distributed":
            item.add_marker(pytest.mark.ranks)

"""Without a GPU, Triton kernels run in Triton's CPU interpreter. The switch must be set before
anything imports triton (torch may import it early), so it is set here, first.

Tests that start several training ranks at once (torchrun, or the planner timing a 4-rank gloo
link) are marked `ranks`: every test under tests/distributed here, elsewhere the test itself.
`make test` runs them one after another in one pytest session (two at once would share the cores
between four ranks and slow their collectives several times over), and every other test in a
second session beside it, on one thread: the ranks keep about 1.3 cores busy on average (one rank
waits on the other, or on a planner's single trace), and the second session fills the rest.

Tests marked `sequential` join the first session to even out the two (each reports its 25 slowest
tests): single-process tests that spend most of their time in one process of one thread, the
estimating process their memory-budget search starts or a command they run."""

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

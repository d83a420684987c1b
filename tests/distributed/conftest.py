"""One launch of worker.py per world size for every module of this folder that reads its results.

A module lists what it needs as WORKER_RUNS: (ranks, command, argument, ...) tuples, "{out}" in an
argument standing for the session's folder. `worker_runs` runs the lists of every collected module in
one launch per world size, 4 ranks first, then 2, then 1 (a checkpoint saved on more ranks is
resumed on fewer), each module's commands in its order, and returns the folder. A launch per module
and world size cost a start-up each: a 2-rank launch that only imports and joins takes 7.7 s of
wall time (12 CPU-s) on the project's 2-core machine, and there were 21 of them.

When one command fails, the launch fails and every test reading that launch fails with its output.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import torchrun

LAUNCH_TIMEOUT = 1200
"""Seconds one world size's launch may take (all of its commands)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests reading `worker_runs` may be the first to ask for it: each gets time for every launch."""
    for item in items:
        if "worker_runs" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(3 * LAUNCH_TIMEOUT))


@pytest.fixture(scope="session")
def worker_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("worker")
    modules = list(dict.fromkeys(item.module for item in request.session.items
                                 if getattr(item, "module", None) is not None and hasattr(item.module, "WORKER_RUNS")))
    by_world: dict[int, list[str]] = {}
    for module in modules:
        for ranks, *command in module.WORKER_RUNS:
            by_world.setdefault(ranks, []).extend(["+", *(argument.format(out=folder) for argument in command)])
    for ranks in sorted(by_world, reverse=True):
        torchrun(ranks, *by_world[ranks][1:], timeout=LAUNCH_TIMEOUT)
    return folder

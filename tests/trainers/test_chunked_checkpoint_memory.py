"""A model built in memory whose states are larger than the memory it is given trains, saves and
resumes a checkpoint with its states in chunks, each in a fresh process whose peak resident memory
stays within the budget (benchmarks/chunked_checkpoint_memory.py, which prints the figures)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "chunked_checkpoint_memory.py"


def run(folder: Path, steps: int, resume: bool) -> dict:
    result = subprocess.run([sys.executable, str(SCRIPT), str(folder), str(steps), "resume" if resume else "fresh"],
                            capture_output=True, text=True, timeout=400, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.sequential
@pytest.mark.timeout(900)
def test_a_model_of_100m_parameters_trains_saves_and_resumes_within_its_budget(tmp_path):
    """Built in memory, 2 steps and their checkpoint, then a fresh process builds it again and resumes
    the checkpoint for a third step: the peak resident memory of each process (VmHWM, and sampled
    every 10 ms) stays within the bare process plus the states' bytes / 2.6, moving the built model
    into its chunks and the checkpoint's save and load included. (That a resumed chunked run continues
    exactly: tests/distributed/test_chunked_ranks.py.)"""
    trained = run(tmp_path, 2, resume=False)
    resumed = run(tmp_path, 3, resume=True)
    for outcome in (trained, resumed):
        assert outcome["states"] > 1.6e9
        assert outcome["budget"] - outcome["bare"] == int(outcome["states"] / 2.6)
        assert outcome["built"] - outcome["bare"] > outcome["states"] / 4.5  # the parameters, in memory
        assert outcome["peak"] <= outcome["budget"], (outcome["peak"] - outcome["budget"]) / 2**20
    assert list(trained["losses"]) == ["1", "2"] and list(resumed["losses"]) == ["3"]
    assert 0 < resumed["losses"]["3"] < 2 * trained["losses"]["2"]

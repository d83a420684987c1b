"""A model whose states are larger than the memory it is given trains, saves and resumes a checkpoint
with its states in chunks, each in a fresh process whose peak resident memory stays within the budget
(benchmarks/chunked_checkpoint_memory.py, which prints the figures)."""

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
    """3 steps with a checkpoint after steps 2 and 3, then a fresh process resumes the one of step 2
    for the third step: the peak resident memory of each process grows above the model it built by
    at most 1/2.5 of the states' bytes (the budget is 512 MiB above it), checkpoints included; the
    resumed step continues the run exactly."""
    straight = run(tmp_path, 3, resume=False)
    (tmp_path / "checkpoints" / "latest").write_text("step_00000002")  # as if the run had stopped after step 2
    resumed = run(tmp_path, 3, resume=True)
    for outcome in (straight, resumed):
        assert outcome["states"] > 1.6e9
        assert outcome["peak"] <= outcome["budget"]
        assert outcome["peak"] - outcome["built"] <= outcome["states"] / 2.5, outcome
    assert list(resumed["losses"]) == ["3"]
    assert resumed["losses"]["3"] == pytest.approx(straight["losses"]["3"], rel=1e-6)

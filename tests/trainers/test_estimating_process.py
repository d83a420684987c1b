"""The estimating process: fresh for every call, with the caller's environment at the call."""

from __future__ import annotations

import os

import pytest

from trainers.estimate.process import run_fresh


def test_each_call_runs_in_its_own_process_with_the_callers_environment(monkeypatch):
    monkeypatch.setenv("MEMZOO_KERNELS", "torch")
    first = run_fresh(os.getpid)
    assert run_fresh(os.getenv, "MEMZOO_KERNELS") == "torch"
    monkeypatch.setenv("MEMZOO_KERNELS", "triton")  # after the fork server started
    assert run_fresh(os.getenv, "MEMZOO_KERNELS") == "triton"
    second = run_fresh(os.getpid)
    assert len({first, second, os.getpid()}) == 3


def test_an_exception_in_the_estimating_process_is_raised_in_the_caller():
    with pytest.raises(ValueError, match="invalid literal"):
        run_fresh(int, "not a number")

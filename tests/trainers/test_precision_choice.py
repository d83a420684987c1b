"""`Strategy(precision="auto")` picks bf16 only where the device computes it natively; an explicit
bf16 on a CPU without it is kept and warned about (`trainers.speed.precision`)."""

from __future__ import annotations

import logging

import pytest

from trainers import Strategy
from trainers.speed import precision


@pytest.fixture
def cpu(monkeypatch):
    """Training on the CPU, whose bf16 support the test sets."""
    monkeypatch.setattr(precision, "use_cuda", lambda: False)
    precision._once.cache_clear()

    def native(value: bool) -> None:
        monkeypatch.setattr(precision, "cpu_bf16_native", lambda: value)

    yield native
    precision._once.cache_clear()


@pytest.mark.parametrize("native", [False, True])
def test_auto_is_bf16_where_native_and_fp32_elsewhere_and_says_which(cpu, caplog, native):
    cpu(native)
    with caplog.at_level(logging.DEBUG, logger="trainers.speed.precision"):
        chosen = Strategy(zero=3, precision="auto").precision
    assert chosen == ("bf16" if native else "fp32")
    assert f"precision='auto': {chosen} on this CPU" in caplog.text
    assert ("no native bf16" in caplog.text) == (not native)
    assert {r.levelno for r in caplog.records} == {logging.DEBUG if native else logging.WARNING}


def test_explicit_bf16_stays_and_is_warned_about_where_slow(cpu, caplog):
    cpu(False)
    with caplog.at_level(logging.INFO, logger="trainers.speed.precision"):
        assert Strategy(precision="bf16").precision == "bf16"
        assert Strategy(precision="bf16", zero=3).precision == "bf16"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "has no native bf16" in warnings[0].message
    cpu(True)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trainers.speed.precision"):
        assert Strategy(precision="bf16").precision == "bf16" and Strategy(precision="fp32").precision == "fp32"
    assert caplog.text == ""

"""Signals at random moments of a real soup: SIGINT, SIGTERM and SIGHUP exit 2 with one line and
leave nothing; after SIGKILL the next run removes the stale staging folder and says so."""

import random
import signal
import subprocess
import time

import pytest

from tests.hostile.support import (
    assert_refused,
    big_experts,
    fingerprint,
    litter,
    run,
    surgery_command,
)
from tests.support.checks import assert_valid_output


def interrupted_soup(experts, out, signum: int, delay: float) -> subprocess.CompletedProcess:
    """Start `surgery soup EXPERTS OUT`, send `signum` after `delay` seconds, wait for the end."""
    args = [*surgery_command(), "soup", "-q", *map(str, experts), str(out)]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


def check_after(result, out, signum: int) -> str:
    """Whatever the moment: a complete OUT (the run had finished), or a clean refusal."""
    if result.returncode in (0, -signum) and out.exists():
        # Done before the signal, or killed by it after publishing (during the interpreter's
        # shutdown Python restores default handlers): OUT is complete either way.
        assert_valid_output(out)
        return "finished"
    if signum == signal.SIGKILL:
        assert result.returncode == -signal.SIGKILL
        if out.exists():  # killed after the rename that published it: OUT is complete
            assert_valid_output(out)
        return "killed"
    assert_refused(result, out, message=f"interrupted by {signal.Signals(signum).name}")
    return "interrupted"


def signal_runs(tmp_path, experts, moments: list[tuple[int, float]]) -> list[str]:
    before = fingerprint(*experts)
    outcomes = []
    for i, (signum, delay) in enumerate(moments):
        out = tmp_path / f"out{i}"
        outcomes.append(check_after(interrupted_soup(experts, out, signum, delay), out, signum))
        if outcomes[-1] == "killed" and litter(tmp_path):
            stale = litter(tmp_path)
            result = run("soup", "-q", *experts, tmp_path / f"again{i}")
            assert result.returncode == 0, result.stderr
            assert all(f"note: removed {tmp_path / name}" in result.stderr for name in stale)
            assert not litter(tmp_path)
    assert fingerprint(*experts) == before
    print(
        "signal outcomes:",
        list(zip([signal.Signals(s).name for s, _ in moments], outcomes, strict=True)),
    )
    return outcomes


def test_signals_quick(tmp_path):
    experts = big_experts(tmp_path / "experts", 3, 24)
    rng = random.Random(11)
    moments = [(signal.SIGINT, 0.2), (signal.SIGTERM, rng.uniform(2, 5))]
    moments += [(signal.SIGKILL, rng.uniform(1.5, 3))]
    outcomes = signal_runs(tmp_path, experts, moments)
    assert outcomes[0] == "interrupted"  # during the imports: one line, no traceback


@pytest.mark.slow
def test_signals_at_random_moments_of_a_large_soup(tmp_path):
    experts = big_experts(tmp_path / "experts", 3, 128)  # about 400 MB of inputs
    # The moments span one whole run as this machine runs it today (a fixed span went stale
    # when the soup got faster: every signal then came after the end).
    started = time.perf_counter()
    result = run("soup", "-q", *experts, tmp_path / "timed")
    assert result.returncode == 0, result.stderr
    span = time.perf_counter() - started
    rng = random.Random(2024)
    signals = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL]
    moments = [(rng.choice(signals), rng.uniform(0.05, span)) for _ in range(12)]
    outcomes = signal_runs(tmp_path, experts, moments)
    assert "interrupted" in outcomes

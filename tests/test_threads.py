"""The thread rule: free cores from a faked affinity, load and registry; overrides; the registry
of live surgery processes; the busy sample against a real busy process."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from surgery.core import threads
from surgery.core.errors import SurgeryError
from surgery.core.threads import Registry, choose_threads, share


@pytest.mark.parametrize(
    ("usable", "busy", "claims", "expected"),
    [
        (2, 0.0, [], 2),  # idle machine: every core
        (2, 0.9, [], 1),  # one core busy with another program
        (2, 2.0, [], 1),  # both busy: still one thread
        (8, 3.4, [], 5),
        (2, 0.4, [], 2),  # a little background noise is not a busy core
        (2, 2.0, [2], 1),  # a second search worker beside one that took both cores
        (2, 1.0, [1], 1),  # the first worker, re-choosing between trials: one each
        (4, 1.0, [1], 2),  # two workers share the three free cores and the one held: 2 each
        (16, 0.0, [4, 4, 4], 4),  # cores held by others are shared, never taken over
    ],
)
def test_the_rule_takes_free_cores_and_shares_them(usable, busy, claims, expected):
    assert share(usable, busy, claims) == expected
    plan = choose_threads(environ={}, usable=usable, busy=busy, claims=claims)
    assert (plan.threads, plan.source, plan.others) == (expected, "rule", len(claims))


def test_two_workers_on_two_cores_get_one_thread_each(tmp_path):
    # Worker A starts alone on an idle 2-core machine, then B starts while A computes on both
    # cores, then A chooses again between trials: one thread each.
    registry = Registry(tmp_path)
    worker_a, worker_b = 1_000_001, 1_000_002  # ids of no live process: registered by hand
    alive = {worker_a, worker_b}
    original = threads._alive
    threads._alive = lambda pid: pid in alive
    try:
        first = choose_threads(environ={}, usable=2, busy=0.0, claims=registry.claims(worker_a))
        registry.register(first.threads, worker_a)
        second = choose_threads(environ={}, usable=2, busy=2.0, claims=registry.claims(worker_b))
        registry.register(second.threads, worker_b)
        again = choose_threads(environ={}, usable=2, busy=1.0, claims=registry.claims(worker_a))
        alive.discard(worker_b)  # B exits: A alone again takes both cores
        alone = choose_threads(environ={}, usable=2, busy=0.0, claims=registry.claims(worker_a))
    finally:
        threads._alive = original
    assert (first.threads, second.threads, again.threads, alone.threads) == (2, 1, 1, 2)
    assert not (tmp_path / str(worker_b)).exists()  # a dead process's record is dropped


def test_option_and_environment_win_over_the_rule():
    by_option = choose_threads(3, environ={"SURGERY_THREADS": "1"}, usable=2, busy=2.0)
    assert (by_option.threads, by_option.source) == (3, "--threads")
    by_env = choose_threads(environ={"SURGERY_THREADS": "1"}, usable=8, busy=0.0, claims=[])
    assert (by_env.threads, by_env.source) == (1, "SURGERY_THREADS")
    assert by_option.note() is None and by_env.note() is None


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_environment_value_is_one_line(value):
    with pytest.raises(SurgeryError, match="SURGERY_THREADS"):
        choose_threads(environ={"SURGERY_THREADS": value}, usable=2, busy=0.0, claims=[])


def test_the_note_says_how_many_and_why():
    plan = choose_threads(environ={}, usable=2, busy=1.0, claims=[])
    note = plan.note()
    assert note is not None and "\n" not in note
    assert "1 thread" in note and "1 of 2 cores busy" in note and "--threads" in note
    assert choose_threads(environ={}, usable=2, busy=0.0, claims=[]).note() is None


def test_a_busy_process_is_seen_busy():
    # A real busy loop on this machine: the sample sees at least half a core more than before.
    quiet = threads.busy_cores(0.3)
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        loaded = threads.busy_cores(0.3)
    finally:
        loop.kill()
        loop.wait()
    assert loaded >= min(quiet + 0.5, threads.usable_cores() - 0.5)


def test_use_threads_applies_and_registers(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(threads.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(threads, "_current", None)  # restored after: other tests see no plan
    monkeypatch.setenv("SURGERY_THREADS", "1")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    plan = threads.use_threads()
    assert plan.threads == 1 and threads.current_threads() == 1
    assert threads.os.environ["OMP_NUM_THREADS"] == "1"
    folder = next(tmp_path.glob("surgery-threads-*"))
    assert (folder / str(threads.os.getpid())).read_text() == "1"
    assert capsys.readouterr().err == ""  # chosen by the user: nothing to explain

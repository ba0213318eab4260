"""The thread rule: free cores from a faked affinity, load and registry; overrides; the registry
of live surgery processes; the busy sample against a real busy process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import cli
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


def test_use_threads_applies_and_registers(monkeypatch, tmp_path, capsys, torch_threads):
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


# --- The commands: --threads, the environment, what is recorded, outputs across thread counts.

DATA = Path(__file__).parent / "data" / "eval"
TASKS = (
    f"belebele:{DATA}/belebele.jsonl:shots=1",
    f"piqa:{DATA}/piqa.jsonl",
    f"ppl:{DATA}/held_out.txt",
    f"flores:{DATA}/flores:src=eng_Latn,tgt=ind_Latn,max_new_tokens=4",
)


@pytest.fixture
def torch_threads():
    """Restore torch's threads and the rule's choice after a command changed them in-process."""
    import torch

    before = torch.get_num_threads()
    saved = threads._current
    yield
    torch.set_num_threads(before)
    threads._current = saved


def _eval(model, out: Path, *extra: str, env: dict | None = None):
    argv = ["eval", str(model), *(a for t in TASKS for a in ("-t", t))]
    argv += ["--limit", "3", "-o", str(out), "-q", *extra]
    return CliRunner().invoke(cli, argv, env=env)


def test_threads_option_and_environment_choose_and_are_recorded(
    families, tmp_path, torch_threads, monkeypatch
):
    import torch

    llama = families("llama")
    monkeypatch.setenv("SURGERY_THREADS", "2")
    by_env = _eval(llama["base"], tmp_path / "env.json")
    assert by_env.exit_code == 0, by_env.output
    assert json.loads((tmp_path / "env.json").read_text())["config"]["threads"] == 2
    by_option = _eval(llama["base"], tmp_path / "one.json", "--threads", "1")
    assert by_option.exit_code == 0, by_option.output
    assert torch.get_num_threads() == 1
    assert json.loads((tmp_path / "one.json").read_text())["config"]["threads"] == 1
    bad = _eval(llama["base"], tmp_path / "bad.json", env={"SURGERY_THREADS": "none"})
    assert bad.exit_code == 2 and "SURGERY_THREADS 'none'" in bad.output
    assert not (tmp_path / "bad.json").exists()


def _metrics(path: Path) -> dict:
    return json.loads(path.read_text())["metrics"]


def test_scores_are_equal_across_one_and_two_threads(families, tmp_path, torch_threads):
    llama = families("llama")
    for n in (1, 2):
        result = _eval(llama["trained"], tmp_path / f"{n}.json", "--threads", str(n))
        assert result.exit_code == 0, result.output
    _assert_same_scores(_metrics(tmp_path / "1.json"), _metrics(tmp_path / "2.json"))


def _assert_same_scores(one: dict, two: dict) -> None:
    """Accuracies, chrF and counts equal; perplexities equal up to float rounding."""
    assert one.keys() == two.keys()
    for name, value in one.items():
        if "ppl" in name or "nll" in name or "bits" in name:
            assert two[name] == pytest.approx(value, rel=1e-5), name
        else:
            assert two[name] == value, name


def test_merges_are_byte_identical_across_thread_counts(families, tmp_path, torch_threads):
    llama = families("llama")
    outputs = []
    for n in (1, 2):
        out = tmp_path / f"soup-{n}"
        argv = ["soup", *map(str, llama["experts"]), str(out), "--dtype", "bf16", "-q"]
        result = CliRunner().invoke(cli, [*argv, "--threads", str(n)])
        assert result.exit_code == 0, result.output
        recipe = json.loads((out / "surgery_recipe.json").read_text())
        assert recipe["threads"] == n
        outputs.append({p.name: p.read_bytes() for p in out.glob("*.safetensors")})
    assert outputs[0] == outputs[1] and outputs[0]


def test_a_busy_machine_changes_only_the_threads_recorded(
    families, tmp_path, torch_threads, monkeypatch
):
    llama = families("llama")
    monkeypatch.delenv("SURGERY_THREADS")  # the rule, as a user's shell has it
    idle = _eval(llama["base"], tmp_path / "idle.json", "--threads", "1")
    assert idle.exit_code == 0, idle.output
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        busy = _eval(llama["base"], tmp_path / "busy.json")
    finally:
        loop.kill()
        loop.wait()
    assert busy.exit_code == 0, busy.output
    config = json.loads((tmp_path / "busy.json").read_text())["config"]
    assert config["threads"] == threads.current_threads()
    if config["threads"] < threads.usable_cores():  # the rule gave up a core: one line says why
        assert [line for line in busy.output.splitlines() if line.startswith("note: using")]
    _assert_same_scores(_metrics(tmp_path / "idle.json"), _metrics(tmp_path / "busy.json"))


def test_a_worker_rechooses_only_what_the_rule_chose(monkeypatch, tmp_path, torch_threads):
    monkeypatch.setattr(threads.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(threads, "_current", None)
    assert threads.rebalance_threads() is None  # no plan: a Python caller's own threads
    monkeypatch.setenv("SURGERY_THREADS", "1")
    threads.use_threads()
    assert threads.rebalance_threads() is None  # the user chose: kept
    monkeypatch.delenv("SURGERY_THREADS")
    threads.use_threads()
    again = threads.rebalance_threads()
    assert again is not None and again.source == "rule"

"""An interrupted or failed final save of `surgery train` leaves no OUT (subprocesses).

The save is caught in the act without any hook in the product: the model is big enough that
writing it takes a while, the test polls for the engine's hidden staging folder to hold a shard,
freezes the process with SIGSTOP (so the moment cannot pass), checks the staging folder is still
there (the final rename has not happened), and only then sends the signal under test.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import tiny_models
from tests.support.train_helpers import train_command, write_corpus

ROOT = Path(__file__).resolve().parents[1]
# Attempts at catching the save before the test gives up (each trains one step).
ATTEMPTS = 3


@pytest.fixture(scope="module")
def big_base(tmp_path_factory) -> Path:
    """About 150 MB of bfloat16 weights in 3 shards, mostly a large vocabulary's embeddings,
    which --freeze-embeddings keeps out of the optimizer (cheap to train, slow enough to save)."""
    return tiny_models.random_llama(
        tmp_path_factory.mktemp("big") / "base",
        hidden=512,
        layers=4,
        vocab=65536,
        heads=2,
        kv_heads=1,
        positions=64,
        shard_size="20MB",
    )


def _command(base: Path, out: Path, corpus: Path) -> list[str]:
    options = ["--max-steps", "1", "--block-size", "8", "--batch-size", "1"]
    options += ["--freeze-embeddings", "--no-drift", "-q"]
    return [sys.executable, *train_command(base, out, corpus, options)]


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _stagings(out: Path) -> list[Path]:
    return [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.partial-")]


def _holds_a_shard(folder: Path) -> bool:
    try:
        return any(name.endswith(".safetensors") for name in os.listdir(folder))
    except FileNotFoundError:
        return False


def _wait_until_stopped(pid: int) -> None:
    """SIGSTOP is delivered asynchronously: wait until the kernel reports the process stopped."""
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "TtZX":
        time.sleep(0.0001)


def _stop_during_save(command: list[str], out: Path) -> subprocess.Popen | None:
    """Run `command` and freeze it while its staging folder holds a shard; None if the save
    finished before it could be caught."""
    process = subprocess.Popen(
        command, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    while process.poll() is None:
        staging = _stagings(out)
        if staging and _holds_a_shard(staging[0]):
            process.send_signal(signal.SIGSTOP)
            _wait_until_stopped(process.pid)
            if staging[0].is_dir():  # not yet renamed to OUT: frozen inside the save
                return process
            process.send_signal(signal.SIGCONT)
        time.sleep(0.0005)
    return None


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_during_final_save_leaves_no_out(big_base, tmp_path, signum):
    corpus = write_corpus(tmp_path / "sk.jsonl", docs=20)
    out = tmp_path / "work" / "out"
    out.parent.mkdir()
    before = _snapshot(big_base)
    for _ in range(ATTEMPTS):
        process = _stop_during_save(_command(big_base, out, corpus), out)
        if process is not None:
            break
        assert (out / "model.safetensors.index.json").is_file()  # finished: try again
        subprocess.run(["rm", "-rf", str(out)], check=True)
    else:
        pytest.fail(f"the save finished each of {ATTEMPTS} times before it could be stopped")
    assert not out.exists()
    process.send_signal(signum)
    process.send_signal(signal.SIGCONT)
    code = process.wait(timeout=120)

    assert not out.exists()
    if signum == signal.SIGKILL:
        # No chance to clean up: the hidden staging folder with a partial checkpoint remains
        # (removing stale ones is the next run's business), but nothing is at OUT.
        assert code == -signal.SIGKILL
        assert len(_stagings(out)) == 1
    else:
        # SIGTERM ends the command as Ctrl-C does (one line, exit 2): the staging folder is
        # removed too.
        assert code == 2
        assert not _stagings(out)
    assert _snapshot(big_base) == before


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_failed_final_save_leaves_nothing(families, tmp_path):
    """A write that fails halfway (a file-size limit below one shard: EFBIG, as on a full disk)
    removes the staging folder; OUT never appears."""
    corpus = write_corpus(tmp_path / "sk.jsonl", docs=20)
    base, out = families("llama")["base"], tmp_path / "work" / "out"
    out.parent.mkdir()
    shard = max(p.stat().st_size for p in base.glob("*.safetensors"))

    def limit_file_size() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an error from write(), not a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (shard // 2, shard // 2))

    command = _command(base, out, corpus)
    command.remove("--freeze-embeddings")
    result = subprocess.run(
        command, env=_env(), preexec_fn=limit_file_size, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2
    assert "error: cannot write" in result.stderr and "file too large" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert list(out.parent.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("saved", [False, True], ids=["before-a-checkpoint", "after-checkpoint-1"])
def test_ctrl_c_while_training_leaves_no_empty_checkpoints_folder(families, tmp_path, saved):
    """Ctrl-C during training: no OUT (not even the Trainer's empty OUT/checkpoints, which made
    the same command refuse to run), or, once a resumable checkpoint is saved, OUT/checkpoints
    with it and a line saying --resume continues."""
    corpus = write_corpus(tmp_path / "sk.jsonl", docs=20)
    base, out = families("llama")["base"], tmp_path / "work" / "out"
    out.parent.mkdir()
    command = _command(base, out, corpus)
    command[command.index("--max-steps") + 1] = "1000000"  # still training when interrupted
    command += ["--save-steps", "1", "--save-total-limit", "1"] if saved else []
    process = subprocess.Popen(
        command, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    ready = out / "checkpoints" / "checkpoint-1" if saved else out / "checkpoints"
    while not ready.is_dir() and process.poll() is None:
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    stderr = process.communicate(timeout=120)[1]

    assert process.returncode == 2, stderr[-2000:]
    assert "error: interrupted by SIGINT" in stderr and "Traceback" not in stderr
    if saved:
        assert sorted(p.name for p in out.iterdir()) == ["checkpoints"]
        assert "continue with --resume" in stderr
    else:
        assert not out.exists(), list(out.rglob("*"))
        assert list(out.parent.iterdir()) == []

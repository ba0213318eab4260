"""bench/gpu_check.py: end to end on CPU (so it cannot rot), and on CUDA when there is one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"
CHECKS = (
    "1 bf16 autocast",
    "2 FSDP2",
    "3 --dry-run plan",
    "4 sweep blended in memory",
    "5 eval ppl + MC, fp32",
    "5 eval ppl + MC, bf16",
)


def _run(*options: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    if "--cpu" in options:
        # One thread: tiny matrices gain nothing from more, and a shared machine loses to spinning.
        env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [sys.executable, str(SCRIPT), *options],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def _rows(stdout: str) -> dict[str, list[str]]:
    """The table's rows by check: [check, result, figures, tolerance, seconds, verdict]."""
    rows = {}
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.split(" | ")]
        if len(cells) == 6 and cells[0][:1].isdigit():
            rows[cells[0]] = cells
    return rows


def _row(rows: dict[str, list[str]], check: str) -> list[str]:
    (match,) = [cells for name, cells in rows.items() if name.startswith(check)]
    return match


@pytest.mark.slow
def test_cpu_run_prints_every_check_and_passes():
    """`--cpu` runs every check at tiny sizes (about 45 s on 2 cores): all pass, and the memory
    row says it is not comparable on CPU instead of judging."""
    result = _run("--cpu")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = _rows(result.stdout)
    assert len(rows) == len(CHECKS)
    for check in CHECKS:
        cells = _row(rows, check)
        if check.startswith("3"):
            assert cells[-1] == "n/a" and "CPU: not comparable" in cells[1], cells
        else:
            assert cells[-1] == "PASS", cells
    assert "sharded=True, world 1" in _row(rows, "2 FSDP2")[1]


def test_without_cuda_the_plain_command_refuses_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    result = _run()
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: no CUDA device; run with --cpu for the CPU version"
    ]


@pytest.fixture(scope="module")
def cuda_run() -> subprocess.CompletedProcess:
    return _run()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("check", CHECKS)
def test_cuda_check_passes(cuda_run, check):
    """The same checks on one CUDA device, each row judged (the memory row included)."""
    assert cuda_run.returncode in (0, 1), cuda_run.stderr[-3000:]
    assert _row(_rows(cuda_run.stdout), check)[-1] == "PASS"

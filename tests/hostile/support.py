"""Helpers of the hostile suite: run the real `surgery` command, fingerprint inputs, and check
that a refusal left nothing behind."""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]


def surgery_command() -> list[str]:
    """The installed console script, else `python cli.py` (both install the signal handlers)."""
    script = Path(sys.executable).parent / "surgery"
    return [str(script)] if script.exists() else [sys.executable, str(ROOT / "cli.py")]


def invoke(*args):
    """Run `surgery ARGS` in this process (click's runner: quicker than a subprocess)."""
    from click.testing import CliRunner

    from cli import cli

    return CliRunner().invoke(cli, [str(a) for a in args])


def run(*args, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """Run `surgery ARGS` in a subprocess (never hangs the suite: a timeout fails the test)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    return subprocess.run(
        [*surgery_command(), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
        **kwargs,
    )


def fingerprint(*folders: Path) -> dict[str, str]:
    """sha256 of every regular file under `folders` (links and FIFOs named, never opened)."""
    prints = {}
    for folder in folders:
        for path in sorted(Path(folder).rglob("*")):
            if path.is_symlink():
                prints[str(path)] = "-> " + os.readlink(path)
            elif path.is_file():
                prints[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                prints[str(path)] = "dir" if path.is_dir() else "special"
    return prints


def assert_refused(result, out: Path, *, message: str = "", code: int = 2) -> None:
    """Exit `code`, exactly one line on stderr (no traceback), nothing at OUT, no hidden litter."""
    returncode = getattr(result, "returncode", getattr(result, "exit_code", None))
    assert returncode == code, (returncode, result.stderr[-2000:])
    # What a terminal shows: a progress bar erased with carriage returns is not a line.
    lines = [line.rsplit("\r", 1)[-1] for line in result.stderr.split("\n")]
    lines = [line for line in lines if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    assert message in lines[0], lines[0]
    assert not os.path.lexists(out)
    assert not litter(out.parent), litter(out.parent)


def litter(folder: Path) -> list[str]:
    """Hidden staging or swap folders a run left beside its output."""
    if not folder.exists():
        return []
    return sorted(p.name for p in folder.iterdir() if ".partial-" in p.name or ".old-" in p.name)


def copy_family(paths: dict, work: Path) -> tuple[Path, Path]:
    """Private copies of a family's base and trained checkpoints that a test may damage."""
    for name in ("base", "trained"):
        shutil.copytree(paths[name], work / name)
    return work / "base", work / "trained"


def raw_shard(path: Path, header: bytes, data: bytes) -> Path:
    """A safetensors file with exactly this header text and data."""
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def big_experts(root: Path, count: int, megabytes: int) -> list[Path]:
    """`count` bf16 checkpoints of about `megabytes` MB each (a Llama-like name layout)."""
    experts = []
    rows = max(1, megabytes * 2**20 // (2 * 2048 * 8))
    for i in range(count):
        generator = torch.Generator().manual_seed(i)
        state = {
            f"model.layers.{layer}.mlp.weight": torch.randn(rows, 2048, generator=generator).to(
                torch.bfloat16
            )
            for layer in range(8)
        }
        folder = root / f"expert{i}"
        folder.mkdir(parents=True)
        save_file(state, folder / "model.safetensors")
        experts.append(folder)
    return experts

"""README's "Your own model" quick start, run as written on a tiny 30-layer Llama.

The commands (the suite file included) are read from README; the test only supplies what a
user brings: the base, the training text and the held-out texts. The run must show what the
quick start promises: a change from the base whose 95% interval excludes 0.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tiny_models import random_llama

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## Your own model"


def _section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(HEADING)
    end = text.find("\n## ", start + len(HEADING))
    return text[start : end if end != -1 else len(text)]


def _block(section: str, language: str) -> str:
    (block,) = re.findall(rf"```{language}\n(.*?)```", section, re.DOTALL)
    return block


def _text(words: list[str], lines: int, seed: int) -> str:
    """Sentences of a made-up language: the same few words, so a few hundred steps learn it."""
    import random

    rng = random.Random(seed)
    sentences = (" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(lines))
    return "\n\n".join(sentences) + "\n"  # .txt documents are separated by blank lines


@pytest.mark.slow  # about 2 minutes of CPU: 300 training steps and three suite runs
def test_the_own_model_quick_start_runs_as_written_and_shows_a_change(tmp_path):
    commands = _block(_section(), "bash")
    # What the user brings: the base (BASE's line names a 30-layer Hub model; here a tiny local
    # one of the same depth), training text and held-out text, 40 documents each.
    commands, swapped = re.subn(r"^BASE=\S+", "BASE=my-base", commands, flags=re.MULTILINE)
    assert swapped == 1, commands
    # A 32-token context: training packs 32-token blocks (min(1024, context)), which keeps
    # 300 steps of a 30-layer model quick on a CPU.
    random_llama(tmp_path / "my-base", hidden=16, layers=30, heads=2, kv_heads=1, positions=32)
    slovak = ["dobry", "den", "mesto", "voda", "kniha", "ulica", "stol", "okno"]
    english = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran"]
    (tmp_path / "text").mkdir()
    (tmp_path / "text/mine.txt").write_text(_text(slovak, 400, 0), encoding="utf-8")
    (tmp_path / "heldout").mkdir()
    (tmp_path / "heldout/slk_Latn.txt").write_text(_text(slovak, 40, 1), encoding="utf-8")
    (tmp_path / "heldout/eng_Latn.txt").write_text(_text(english, 40, 2), encoding="utf-8")

    bin_dir = str(Path(shutil.which("surgery") or Path(sys.executable).parent / "surgery").parent)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",  # tiny matrices: more threads only spin on a shared machine
        "HF_HUB_OFFLINE": "1",
    }
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", commands],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]

    rows = json.loads((tmp_path / "report/comparison.json").read_text())["rows"]
    mine = [
        row
        for row in rows
        if (row["model"], row["task"], row["metric"], row["lang"])
        == ("mine", "ppl", "ppl", "slk_Latn")
    ]
    assert len(mine) == 1, sorted({(r["model"], r["task"], r["lang"]) for r in rows})
    (row,) = mine
    assert row["n"] == 40, row
    assert row["delta"] < 0 and row["ci_high"] < 0, row  # learned: perplexity down, beyond noise
    assert (tmp_path / "report/report.md").is_file()

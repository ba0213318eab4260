"""The recipe, model card and training record of runs with every strategy, pinned to golden files.

Two tiny runs cover every strategy: one with --freeze (and the embeddings), --l2sp (half form),
--ema, the --mix-until curriculum, --early-stopping and drift groups; one with --lora beside
--freeze, the curriculum and early stopping (LoRA excludes L2-SP and EMA). The held-out scores
are scripted, so early stopping chooses the same step on every machine. Paths, the version and
the shards' hashes (float rounding differs between CPUs) are replaced before comparing; the rest
must match byte for byte: a change to train/ that alters what a run records fails here.

A new option changes every record (the configuration is recorded whole): rewrite the golden
files with `UPDATE_GOLDEN=1 pytest tests/test_train_record.py` and review their diff.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from surgery import __version__
from tests.support.train_helpers import tiny_config, write_corpus
from train.api import train

GOLDEN = Path(__file__).parent / "data" / "train_record"

RUNS = {
    "full": dict(
        freeze="0",
        freeze_embeddings=True,
        l2sp="1:3=0.05,*=0.001",
        l2sp_form="half",
        ema=0.9,
        ema_every=2,
        mix_until=["en=0.5"],
        eval_every=2,
        eval_tasks=["probe"],
        early_stopping="probe/acc",
        patience=2,
        drift_groups="0:2,2:4",
        max_steps=8,
    ),
    "lora": dict(
        lora="r=4,alpha=8,targets=q_proj+v_proj",
        freeze="0",
        mix_until=["en=0.5"],
        eval_every=2,
        eval_tasks=["probe"],
        early_stopping="probe/acc:max",
        patience=3,
        max_steps=6,
    ),
}


def scripted_scores():
    """The held-out scorer: the next scripted value at each call."""
    values = iter([0.1, 0.3, 0.2, 0.25, 0.2, 0.1])

    def score(model, tokenizer):
        return {"probe/acc": next(values)}

    return score


def _normalized(text: str, base: Path, tmp_path: Path) -> str:
    text = text.replace(str(base), "BASE").replace(str(tmp_path), "TMP")
    text = text.replace(__version__, "VERSION")
    text = re.sub(r'"threads": \d+', '"threads": "THREADS"', text)  # the machine's cores
    return re.sub(r"\b[0-9a-f]{64}\b", "SHA256", text)


def _record(folder: Path) -> str:
    """surgery_train.json without its log history (timings), keys in the order written."""
    record = json.loads((folder / "surgery_train.json").read_text())
    record.pop("log_history")
    return json.dumps(record, indent=2) + "\n"


@pytest.mark.parametrize("name", list(RUNS))
def test_recipe_card_and_record_match_golden_files(families, tmp_path, name):
    data = tmp_path / "data"
    sk = write_corpus(data / "sk.jsonl", docs=80)
    en = write_corpus(data / "en.txt", docs=40, seed=1)
    sources = [f"sk={sk}:0.8", f"en={en}:0.2"]
    base = families("llama")["base"]
    config = tiny_config(base, tmp_path / name, sources, **RUNS[name])
    out = train(config, score=scripted_scores())
    produced = {
        "recipe.json": (out / "surgery_recipe.json").read_text(),
        "card.md": (out / "README.md").read_text(),
        "record.json": _record(out),
    }
    for suffix, text in produced.items():
        golden = GOLDEN / f"{name}.{suffix}"
        if os.environ.get("UPDATE_GOLDEN"):
            golden.write_text(_normalized(text, base, tmp_path))
        assert _normalized(text, base, tmp_path) == golden.read_text(), golden.name

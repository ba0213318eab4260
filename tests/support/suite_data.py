"""The data files of a small suite, made from tests/data/eval: Belebele, Global-PIQA, FLORES and
MADLAD for each language, every text marked by its language so that no two languages' items
are alike."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "eval"


def read_jsonl(path: Path) -> list[dict]:
    """A JSON-lines file's rows."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """Write rows as JSON lines, making the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def write_suite_data(root: Path, langs: Sequence[str], madlad: str = "madlad/{lang2}") -> None:
    """Under root: ``belebele/<lang>.jsonl``, ``global_piqa/<lang>.jsonl``,
    ``flores_plus/devtest/<lang>.devtest`` (with English) and one MADLAD file per language in
    the folder `madlad` names (``{lang2}``: its MADLAD code, else its first three letters)."""
    from eval.study.languages import MADLAD_CODES

    english = (DATA / "flores/devtest/eng_Latn.devtest").read_text(encoding="utf-8").splitlines()
    (root / "flores_plus/devtest").mkdir(parents=True)
    (root / "flores_plus/devtest/eng_Latn.devtest").write_text("\n".join(english) + "\n")
    for n, lang in enumerate(langs):
        belebele = [
            {**row, "flores_passage": f"{row['flores_passage']} ({lang})"}
            for row in read_jsonl(DATA / "belebele.jsonl")
        ]
        write_jsonl(root / f"belebele/{lang}.jsonl", belebele)
        piqa = [
            {**row, "prompt": f"{lang}: {row['prompt']}"} for row in read_jsonl(DATA / "piqa.jsonl")
        ]
        write_jsonl(root / f"global_piqa/{lang}.jsonl", piqa)
        lines = [f"{line[: 8 + n]} {lang}" for line in english]
        (root / f"flores_plus/devtest/{lang}.devtest").write_text("\n".join(lines) + "\n")
        lang2 = MADLAD_CODES.get(lang, lang[:3])
        docs = [{"text": f"{lang} document {i}: the river runs to the sea."} for i in range(3)]
        folder = madlad.format(lang2=lang2)
        write_jsonl(root / f"{folder}/{lang2}_clean_0000.jsonl", docs)

"""Dataset repositories in their published layouts, built from tiny rows, as snapshot folders.

- Belebele (facebook/belebele): ``data/{lang}.jsonl``, one config per language, split ``test``.
- FLORES+ (openlanguagedata/flores_plus): ``dev/{lang}.parquet`` and ``devtest/{lang}.parquet``
  with FLORES+'s columns (``id``, ``iso_639_3``, ``iso_15924``, ``glottocode``, ``text``, ...),
  one config per language.
- Global-PIQA (mrlbenchmarks/global-piqa-nonparallel): lowercase configs (regional variants
  such as ``spa_latn_mexi``), Parquet as `datasets` writes it: ``{config}/test-00000-of-00001``.
- MADLAD-400 (allenai/MADLAD-400): ``data/{lang2}/{lang2}_clean_0000.jsonl.gz`` (no configs in
  its card: it was published with a loading script).

Each card names its configs in YAML front matter, as the Hub's cards do.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml


def write_card(root: Path, configs: dict[str, dict[str, str]]) -> None:
    """README.md whose front matter names each config's files per split."""
    entries = [
        {"config_name": name, "data_files": [{"split": s, "path": p} for s, p in splits.items()]}
        for name, splits in configs.items()
    ]
    front = yaml.safe_dump({"configs": entries}, sort_keys=False)
    (root / "README.md").write_text(f"---\n{front}---\n# test dataset\n", encoding="utf-8")


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def belebele(root: Path, rows: dict[str, list[dict]]) -> Path:
    """Belebele's layout: lang -> rows (Belebele's fields)."""
    for lang, lines in rows.items():
        path = root / "data" / f"{lang}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    write_card(root, {lang: {"test": f"data/{lang}.jsonl"} for lang in rows})
    return root


def flores_rows(lang: str, sentences: list[str]) -> list[dict[str, Any]]:
    """FLORES+ rows: its columns, the id an integer from 0."""
    code, script = lang.split("_")
    return [
        {
            "id": i,
            "iso_639_3": code,
            "iso_15924": script,
            "glottocode": "none0000",
            "text": text,
            "url": f"https://example.org/{i}",
            "domain": "wikinews",
            "topic": "test",
            "has_image": 0,
            "has_hyperlink": 0,
            "last_updated": "2.0",
        }
        for i, text in enumerate(sentences)
    ]


def flores(root: Path, splits: dict[str, dict[str, list[str]]]) -> Path:
    """FLORES+'s layout: split -> lang -> sentences."""
    configs: dict[str, dict[str, str]] = {}
    for split, languages in splits.items():
        for lang, sentences in languages.items():
            write_parquet(root / split / f"{lang}.parquet", flores_rows(lang, sentences))
            configs.setdefault(lang, {})[split] = f"{split}/{lang}.parquet"
    write_card(root, configs)
    return root


def global_piqa(root: Path, rows: dict[str, list[dict]]) -> Path:
    """Global-PIQA's layout: config -> rows (prompt, solution0, solution1, label)."""
    for config, lines in rows.items():
        write_parquet(root / config / "test-00000-of-00001.parquet", lines)
    write_card(root, {config: {"test": f"{config}/test-*"} for config in rows})
    return root


def madlad(root: Path, documents: dict[str, list[str]]) -> Path:
    """MADLAD-400's layout: lang2 -> documents (``text``), gzipped JSON lines."""
    for lang2, texts in documents.items():
        path = root / "data" / lang2 / f"{lang2}_clean_0000.jsonl.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    return root


def jsonl_rows(path: Path) -> list[dict]:
    """The rows of a JSON-lines file."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


DATA = Path(__file__).parents[1] / "data" / "eval"


def paper_datasets(
    root: Path, languages: dict[str, list[str]]
) -> dict[str, tuple[Path, str | None]]:
    """The datasets `eval/study/suites/paper.yml` reads, in their published layouts, with tiny
    rows for some languages only (FLORES-200 codes, by the suite's task: ppl, belebele, piqa,
    flores): dataset id -> (folder, the revision the suite pins, or None).

    Belebele and Global-PIQA rows come from the test data (Global-PIQA under each language's
    config, or the suite's regional variants), FLORES+ has dev and devtest for them and English,
    MADLAD-400 as many short documents as the suite skips and takes.
    """
    from eval.study.suite import PAPER_SUITE, derived, load_suite
    from surgery.hub.datasets import parse_dataset_ref

    suite = load_suite(PAPER_SUITE)
    tasks = {task.key: task for task in suite.tasks}
    refs = {}
    for key in ("ppl", "belebele", "piqa", "flores"):
        ref = parse_dataset_ref(tasks[key].path.format_map(derived(suite.variables["eng_Latn"])))
        refs[key] = ref
    belebele_rows = jsonl_rows(DATA / "belebele.jsonl")
    piqa_rows = jsonl_rows(DATA / "piqa.jsonl")
    configs = {
        name: piqa_rows
        for lang in languages["piqa"]
        for name in tasks["piqa"].configs.get(lang, (lang.lower(),))
    }
    english = (DATA / "flores/devtest/eng_Latn.devtest").read_text(encoding="utf-8").splitlines()
    sentences = {lang: [f"{lang} {s}" for s in english] for lang in languages["flores"]}
    sentences["eng_Latn"] = english
    options = tasks["ppl"].options
    count = int(options["skip"]) + int(options["take"])
    documents = {
        suite.variables[lang]["lang2"]: [f"{lang} document {i}: the cat sat." for i in range(count)]
        for lang in languages["ppl"]
    }
    folders = {
        "belebele": belebele(
            root / "belebele", dict.fromkeys(languages["belebele"], belebele_rows)
        ),
        "piqa": global_piqa(root / "piqa", configs),
        "flores": flores(
            root / "flores",
            {
                "dev": {k: [f"dev {s}" for s in v] for k, v in sentences.items()},
                "devtest": sentences,
            },
        ),
        "ppl": madlad(root / "madlad", documents),
    }
    return {refs[key].repo: (folders[key], refs[key].revision) for key in folders}

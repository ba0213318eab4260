"""Results folders as `surgery eval --suite` writes them (through eval.study.results, the
format's writer), with synthetic per-item outcomes instead of a model's.

Used by tests/test_compare.py (small studies) and bench/bench_compare.py (the study's size).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eval.study.results import (
    DataRef,
    ModelInfo,
    SuiteResults,
    UnitResult,
    suite_sha256,
    write_samples,
)
from eval.study.results import (
    write_results as write_results_json,
)

FAMILIES = {
    "slavic": {"held_in": ["ces_Latn"], "held_out": ["hsb_Latn"]},
    "germanic": {"held_in": ["deu_Latn"], "held_out": ["ltz_Latn"]},
}
TASKS = {
    "ppl": {"kind": "ppl", "path": "madlad/{lang2}/", "n": 30},
    "belebele": {"kind": "belebele", "path": "belebele/{lang}.jsonl", "shots": 2, "n": 40},
    "piqa": {"kind": "piqa", "path": "global_piqa/{lang}.jsonl", "shots": 2, "n": 30},
    "flores": {
        "kind": "flores",
        "dir": "flores_plus/",
        "directions": ["eng_Latn-{lang}", "{lang}-eng_Latn"],
        "shots": 2,
        "n": 25,
    },
}
WORDS = [f"w{i}{chr(97 + i % 26)}{'xyz'[i % 3]}" for i in range(400)]


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Study:
    """A synthetic study: families, tasks (with item counts), seeds and per-model skill."""

    families: dict[str, dict[str, list[str]]] = field(default_factory=lambda: dict(FAMILIES))
    tasks: dict[str, dict[str, Any]] = field(default_factory=lambda: json.loads(json.dumps(TASKS)))
    fewshot_seeds: list[int | None] = field(default_factory=lambda: [None])
    others: list[str] = field(default_factory=list)  # languages in no family

    def suite(self) -> dict[str, Any]:
        """The suite as the runner normalizes it: kind, path, options (and FLORES' directions)."""
        tasks = {}
        for key, spec in self.tasks.items():
            plain = ("kind", "n", "path", "dir", "directions")
            entry = {
                "kind": spec["kind"],
                "path": spec.get("path") or spec.get("dir"),
                "options": {k: v for k, v in spec.items() if k not in plain},
            }
            if "directions" in spec:
                entry["directions"] = spec["directions"]
            tasks[key] = entry
        others = {"others": self.others} if self.others else {}
        return {"families": self.families, "languages": {}, "tasks": tasks, **others}

    def places(self) -> list[tuple[str, str | None, str | None]]:
        """`(lang, family, split)` of every language, those in no family last (as the runner)."""
        in_families = [
            (lang, family, split)
            for family, splits in self.families.items()
            for split, langs in splits.items()
            for lang in langs
        ]
        return in_families + [(lang, None, None) for lang in self.others]


def _lines(kind: str, key: str, n: int, seed: int | None, skill: float, rng) -> list[dict]:
    """n items of one unit; `skill` shifts accuracy, log-likelihood and translation quality.

    Each item has its own difficulty (the same for every model), so different models' outcomes
    are correlated item by item as real models' are; `rng` (the model's) adds noise.
    """
    lines = []
    for i in range(n):
        doc = f"{key}#{i}"
        item = np.random.default_rng(int(sha256(doc)[:12], 16))
        line: dict[str, Any] = {"doc_id": str(i), "prompt_sha256": sha256(f"{doc}|seed={seed}")}
        if kind == "ppl":
            tokens = int(item.integers(20, 200))
            rate = 1.5 + item.random() - 0.3 * skill + 0.1 * rng.random()
            line.update(
                loglikelihood=-tokens * rate,
                tokens=tokens,
                words=tokens * 2 // 3 + 1,
                bytes=tokens * 4,
            )
        elif kind == "flores":
            reference = [WORDS[j] for j in item.integers(0, len(WORDS), 12)]
            keep = item.random(12) + 0.2 * rng.random(12) < 0.5 + 0.3 * skill
            noise = rng.integers(0, len(WORDS), 12)
            words = [w if k else WORDS[j] for w, k, j in zip(reference, keep, noise, strict=True)]
            line.update(hypothesis=" ".join(words), reference=" ".join(reference))
        else:
            difficulty, p = item.random(2), 0.45 + 0.3 * skill
            outcomes = (difficulty + 0.3 * rng.random(2) < p + 0.15).astype(int).tolist()
            line.update(acc=outcomes[0], acc_norm=outcomes[1], gold=0)
        lines.append(line)
    return lines


def write_results(
    folder: Path,
    study: Study,
    name: str,
    skill: float | dict[str, float] = 0.0,
    *,
    seed: int = 0,
    settings: dict[str, Any] | None = None,
    complete: bool = True,
) -> Path:
    """Write one model's results folder through eval.study.results (the format's writer).

    Args:
        skill: the model's skill, or per language (missing languages: 0).
        seed: the outcomes' random seed (different models: different seeds).
    """
    rng = np.random.default_rng(seed)
    folder = Path(folder)
    units = []
    for task, spec in study.tasks.items():
        variants = spec.get("directions") or [None]
        seeds = study.fewshot_seeds if spec.get("shots") else [None]
        for lang, family, split in study.places():
            level = skill.get(lang, 0.0) if isinstance(skill, dict) else skill
            for variant in variants:
                for fewshot_seed in seeds:
                    where = (task, spec["kind"], variant, lang, family, split)
                    units.append(_unit(folder, *where, fewshot_seed, spec["n"], level, rng))
    suite = study.suite()
    results = SuiteResults(
        model=ModelInfo(path=str(folder), name=name),
        suite=suite,
        suite_sha256=suite_sha256(suite),
        settings={
            "seed": 0,
            "limit": None,
            "batch_size": 8,
            "max_length": 2048,
            "device": "cpu",
            "eval_dtype": "float32",
            "fewshot_seeds": study.fewshot_seeds,
            **(settings or {}),
        },
        units=tuple(units),
        missing=(),
        complete=complete,
    )
    write_results_json(folder, results)
    return folder


def _unit(folder, task, kind, variant, lang, family, split, fewshot_seed, n, skill, rng):
    # As the runner names units: <task>/<lang>[/<direction>][/seed=N].
    uid = "/".join([task, lang] + ([variant.format(lang=lang)] if variant else []))
    if fewshot_seed is not None:
        uid += f"/seed={fewshot_seed}"
    lines = _lines(kind, f"{task}|{variant}|{lang}", n, fewshot_seed, skill, rng)
    samples = write_samples(folder, uid, lines)
    if kind == "ppl":
        metrics = {"ppl": 0.0, "n": n}
    elif kind == "flores":
        metrics = {"chrf": 0.0, "n": n}
    else:
        metrics = {"acc": float(np.mean([x["acc"] for x in lines])), "n": n}
    data = DataRef(path=f"{task}/{lang}", sha256=sha256(f"data|{task}|{variant}|{lang}"))
    return UnitResult(
        uid, task, kind, variant, lang, family, split, fewshot_seed, metrics, samples, data
    )


def read_lines(folder: Path, unit_id: str) -> list[dict]:
    """One unit's samples lines, found through results.json."""
    results = json.loads((Path(folder) / "results.json").read_text(encoding="utf-8"))
    unit = next(u for u in results["units"] if u["id"] == unit_id)
    text = (Path(folder) / unit["samples"]).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]

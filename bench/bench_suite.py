"""Benchmark: one `surgery eval --suite` against one `surgery eval -t` per (task, language).

One model, a suite of 10 languages in four families x (perplexity, Belebele, Global-PIQA,
FLORES in both directions): 50 units. Scored two ways, each process measured by
bench/measure.py (wall time, peak RssAnon of its process tree):

- suite: `surgery eval MODEL --suite SUITE -o DIR` once (one model load for all 50 units);
- per unit: `surgery eval MODEL -t TASK -o FILE` once per unit (50 processes, 50 loads); its
  wall time is the sum over the processes, its peak memory the largest of any one of them.

Then the scores of the two ways are compared unit by unit (every metric: accuracies, standard
errors, perplexities, chrF) and the largest absolute difference is printed.

The data files are written by the bench: per language a seeded word list (English words with a
suffix of the language), Belebele-format passages with a question and four answers, Global-PIQA
goals with two solutions, FLORES-style aligned sentences (eng_Latn and each language) and
MADLAD-style documents. The model is a seeded random bf16 Llama (hidden 384, 6 layers by
default) with a byte-level BPE tokenizer trained on that text, or a local model folder
(`--model PATH`, e.g. bench/fetch_smollm2.py's SmolLM2-135M). FLORES generates at most
`--max-new-tokens` tokens per sentence (a random model rarely stops on its own).

Run by hand (on an idle machine; `--items default` takes several minutes, most of them in the
50 processes of the per-unit way):
    python bench/bench_suite.py [--items default] [--hidden 384] [--layers 6] [--batch-size 8]
    python bench/bench_suite.py --model PATH            # a real local model instead
    python bench/bench_suite.py --items small --hidden 64 --layers 2   (a quick check)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from bench.bench_prefix import WORDS  # noqa: E402
from bench.measure import Measurement, measure  # noqa: E402

# Four families, ten languages: (FLORES-200 code, MADLAD-400 code, the suffix of its words).
FAMILIES = {
    "slavic": {"held_in": ["ces_Latn", "pol_Latn"], "held_out": ["slk_Latn"]},
    "germanic": {"held_in": ["deu_Latn", "nld_Latn"], "held_out": ["swe_Latn"]},
    "romance": {"held_in": ["fra_Latn", "spa_Latn"], "held_out": ["ita_Latn"]},
    "austronesian": {"held_in": ["ind_Latn"], "held_out": []},
}
LANGS = [lang for family in FAMILIES.values() for split in family.values() for lang in split]
SUFFIXES = dict(
    zip(LANGS, ("ek", "ow", "ik", "en", "je", "ar", "eau", "os", "ia", "an"), strict=True)
)
# Items per unit: Belebele and PIQA items, FLORES sentences per direction, perplexity documents.
SIZES = {
    "small": {"belebele": 4, "piqa": 4, "flores": 3, "ppl": 3},
    "default": {"belebele": 40, "piqa": 40, "flores": 20, "ppl": 20},
}
SHOTS = 2


def _words(lang: str | None) -> list[str]:
    """The word list of a language: English (None) or English with the language's suffix."""
    return WORDS if lang is None else [word + SUFFIXES[lang] for word in WORDS]


def _sentence(rng: random.Random, words: list[str], low: int = 6, high: int = 12) -> str:
    return " ".join(rng.choice(words) for _ in range(rng.randint(low, high))).capitalize() + "."


def _translate(sentence: str, lang: str) -> str:
    """The aligned FLORES sentence of `lang`: every word of the English one with its suffix."""
    return " ".join(word.rstrip(".") + SUFFIXES[lang] for word in sentence.split()) + "."


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def write_data(root: Path, sizes: dict[str, int]) -> list[str]:
    """Every language's four data files under `root` (seeded); returns all text written, for
    the random model's tokenizer."""
    from eval.study.languages import MADLAD_CODES

    rng = random.Random(0)
    texts = []
    english = [_sentence(rng, WORDS) for _ in range(sizes["flores"])]
    (root / "flores_plus/devtest").mkdir(parents=True)
    (root / "flores_plus/devtest/eng_Latn.devtest").write_text("\n".join(english) + "\n")
    texts += english
    for lang in LANGS:
        words = _words(lang)
        lines = [_translate(sentence, lang) for sentence in english]
        (root / f"flores_plus/devtest/{lang}.devtest").write_text("\n".join(lines) + "\n")
        belebele = [
            {
                "link": f"synthetic/{lang}/{n}",
                "question_number": 1,
                "flores_passage": " ".join(_sentence(rng, words) for _ in range(3)),
                "question": _sentence(rng, words, 5, 8)[:-1] + "?",
                **{f"mc_answer{k}": _sentence(rng, words, 2, 5) for k in range(1, 5)},
                "correct_answer_num": str(rng.randint(1, 4)),
            }
            for n in range(sizes["belebele"])
        ]
        piqa = [
            {
                "prompt": _sentence(rng, words, 5, 9)[:-1] + ",",
                "solution0": _sentence(rng, words, 3, 7),
                "solution1": _sentence(rng, words, 3, 7),
                "label": rng.randint(0, 1),
            }
            for _ in range(sizes["piqa"])
        ]
        docs = [
            {"text": " ".join(_sentence(rng, words) for _ in range(6))} for _ in range(sizes["ppl"])
        ]
        _write_jsonl(root / f"belebele/{lang}.jsonl", belebele)
        _write_jsonl(root / f"global_piqa/{lang}.jsonl", piqa)
        code = MADLAD_CODES[lang]
        _write_jsonl(root / f"madlad/data/{code}/{code}_clean_0000.jsonl", docs)
        texts += lines + [d["text"] for d in docs]
        texts += [" ".join(str(v) for v in row.values()) for row in belebele + piqa]
    return texts


def write_suite(path: Path, max_new_tokens: int) -> None:
    """The suite file over `FAMILIES`, its data under `data/` beside it."""
    import yaml

    flores_directions = ["eng_Latn-{lang}", "{lang}-eng_Latn"]
    suite = {
        "families": FAMILIES,
        "tasks": {
            "ppl": {"path": "madlad/data/{lang2}/"},
            "belebele": {"path": "belebele/{lang}.jsonl", "shots": SHOTS},
            "piqa": {"path": "global_piqa/{lang}.jsonl", "shots": SHOTS},
            "flores": {
                "dir": "flores_plus/",
                "directions": flores_directions,
                "shots": SHOTS,
                "max_new_tokens": max_new_tokens,
            },
        },
        "root": "data/",
    }
    path.write_text(yaml.safe_dump(suite, sort_keys=False), encoding="utf-8")


def build_model(folder: Path, texts: list[str], hidden: int, layers: int) -> Path:
    """A seeded random bf16 Llama with a tokenizer trained on the bench's text."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from demo.pipeline import train_tokenizer

    tokenizer = train_tokenizer(texts, vocab=2048)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def unit_task(unit, data: Path, max_new_tokens: int) -> tuple[str, str]:
    """The plain task string that scores one suite unit alone, and the prefix of its metrics."""
    from eval.study.languages import MADLAD_CODES

    name = unit.id.replace("/", ".")
    if unit.kind == "ppl":
        path = data / "madlad/data" / MADLAD_CODES[unit.lang]
        return f"ppl:{path}:lang={unit.lang},name={name}", f"{name}/{unit.lang}/"
    if unit.kind == "flores":
        src, tgt = unit.id.split("/")[-1].split("-")
        options = f"src={src},tgt={tgt},shots={SHOTS},max_new_tokens={max_new_tokens}"
        return f"flores:{data / 'flores_plus'}:{options},name={name}", f"{name}/"
    folder = {"belebele": "belebele", "piqa": "global_piqa"}[unit.kind]
    return f"{unit.kind}:{data / folder / unit.lang}.jsonl:shots={SHOTS},name={name}", f"{name}/"


def _surgery(*args: object) -> list[str]:
    return [sys.executable, "-m", "cli", *map(str, args)]


def _run(command: list[str], inputs: list[str]) -> Measurement:
    run = measure(command, inputs=inputs)
    if run.returncode != 0:
        sys.exit(f"failed with exit code {run.returncode}: {' '.join(command)}")
    return run


def _largest_difference(suite: dict, plain: dict) -> tuple[float, str]:
    """The largest |suite - plain| over the suite unit's metrics (results.json writes NaN as
    null; NaN on both sides agrees)."""
    worst, where = 0.0, ""
    for key, value in suite.items():
        ours, theirs = (math.nan if v is None else v for v in (value, plain[key]))
        if math.isnan(ours) and math.isnan(theirs):
            continue
        difference = abs(ours - theirs)
        if not difference <= worst:  # NaN against a number counts as the largest
            worst, where = difference, key
    return worst, where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", choices=SIZES, default="default", help=f"{SIZES}")
    parser.add_argument("--model", type=Path, help="a local model folder instead of a random one")
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32, help="FLORES generation")
    args = parser.parse_args()
    from eval.study.results import read_results

    sizes = SIZES[args.items]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        texts = write_data(root / "data", sizes)
        write_suite(root / "suite.yml", args.max_new_tokens)
        if args.model:
            model, about = args.model, f"{args.model}"
        else:
            model = build_model(root / "model", texts, args.hidden, args.layers)
            about = f"random bf16 Llama, hidden {args.hidden}, {args.layers} layers"
        inputs = [str(model), str(root / "data")]
        common = ["--batch-size", args.batch_size, "-q"]
        suite_run = _run(
            _surgery("eval", model, "--suite", root / "suite.yml", "-o", root / "out", *common),
            inputs,
        )
        units = read_results(root / "out").units
        runs, worst = [], (0.0, "")
        for unit in units:
            task, prefix = unit_task(unit, root / "data", args.max_new_tokens)
            out = root / "plain" / f"{unit.id.replace('/', '.')}.json"
            runs.append(_run(_surgery("eval", model, "-t", task, "-o", out, *common), inputs))
            metrics = json.loads(out.read_text())["metrics"]
            plain = {k.removeprefix(prefix): v for k, v in metrics.items() if k.startswith(prefix)}
            difference, metric = _largest_difference(unit.metrics, plain)
            if not difference <= worst[0]:
                worst = (difference, f"{unit.id} {metric}")
    per_unit = Measurement(sum(r.seconds for r in runs), max(r.peak_anon for r in runs), 0)
    print(
        f"{about}; {len(LANGS)} languages x 4 tasks = {len(units)} units (FLORES both "
        f"directions); per unit {sizes['belebele']} Belebele and {sizes['piqa']} PIQA items "
        f"({SHOTS}-shot), {sizes['flores']} FLORES sentences ({SHOTS}-shot, at most "
        f"{args.max_new_tokens} new tokens), {sizes['ppl']} documents; batch {args.batch_size}"
    )
    print(f"{'way':<38} {'processes':>9} {'wall s':>8} {'peak RssAnon MB':>16}")
    for label, count, run in (
        ("suite: surgery eval --suite", 1, suite_run),
        ("per unit: surgery eval -t (sum, max)", len(runs), per_unit),
    ):
        print(f"{label:<38} {count:>9} {run.seconds:>8.1f} {run.peak_anon / 2**20:>16.0f}")
    print(
        f"{'per unit / suite':<38} {'':>9} {per_unit.seconds / suite_run.seconds:>7.2f}x "
        f"{per_unit.peak_anon / suite_run.peak_anon:>15.2f}x"
    )
    print(f"scores of the two ways, max |diff| over {len(units)} units: {worst[0]:.1e} {worst[1]}")


if __name__ == "__main__":
    main()

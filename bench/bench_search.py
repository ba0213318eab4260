"""Benchmark: trials per minute of `surgery search` against the script a user writes today.

Builds a random Llama (bf16 on disk), a perturbed copy and a suite (perplexity on a held-in
language and on one in `others:`), then, side by side in one run:

- `surgery search BASE TRAINED --suite S --out DIR --trials N` (one process: both checkpoints
  loaded once, every trial blended in memory and scored on the search half; the report half
  scored at the end, counted in its time);
- for each of the same N profiles, `surgery interpolate --alpha PROFILE BASE TRAINED OUT` then
  `surgery eval OUT --suite S -o RESULTS --half search` (a checkpoint written, loaded and scored
  per trial, two processes each).

Prints each one's wall time and trials per minute, the ratio, and the machine's load (uptime).

Run by hand:  python bench/bench_search.py [--hidden 256] [--layers 8] [--trials 12]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1]))
from tests.support import tiny_models

SUITE = """\
families:
  slavic: {held_in: [ces_Latn]}
others: [eng_Latn]
tasks:
  ppl: {path: "ppl/{lang}/"}
root: .
"""
SURGERY = [
    sys.executable,
    "-c",
    "import sys; from cli import main; sys.argv[0] = 'surgery'; main()",
]


def build(root: Path, hidden: int, layers: int, docs: int) -> tuple[Path, Path, Path]:
    """BASE, TRAINED (BASE plus noise) and the suite with `docs` documents per language."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tiny_models.vocab_size(),
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    base = tiny_models.save(model, root / "base", "50MB")
    trained = tiny_models.save(tiny_models.perturb(model, 1, 0.02), root / "trained", "50MB")
    for lang in ("ces_Latn", "eng_Latn"):
        folder = root / "ppl" / lang
        folder.mkdir(parents=True)
        text = " ".join(tiny_models._CORPUS)
        rows = [{"text": f"{lang} {i}: {text}"} for i in range(docs)]
        (folder / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "suite.yml").write_text(SUITE)
    return base, trained, root / "suite.yml"


def run(argv: list[str]) -> float:
    """Wall seconds of one `surgery` command (it must succeed)."""
    start = time.perf_counter()
    subprocess.run([*SURGERY, *map(str, argv)], check=True, cwd=Path(__file__).parents[1])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--docs", type=int, default=32, help="documents per language")
    parser.add_argument("--trials", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base, trained, suite = build(root, args.hidden, args.layers, args.docs)
        out = root / "search"
        # TPE: docs/search.md's figures were measured with it (and its proposals cost nothing).
        flags = ["--trials", args.trials, "--resamples", "200", "--sampler", "tpe", "-q"]
        search = run(["search", base, trained, "--suite", suite, "--out", out, *flags])
        profiles = [p["profile"] for p in _trials(out)]
        scripted = 0.0
        for n, profile in enumerate(profiles):
            point = root / f"point-{n}"
            scripted += run(["interpolate", "--alpha", profile, base, trained, point, "-q"])
            scored = root / f"scored-{n}"
            scripted += run(
                ["eval", point, "--suite", suite, "-o", scored, "--half", "search", "-q"]
            )
    load = os.getloadavg()
    count = len(profiles)
    print(
        f"{count} trials, Llama hidden {args.hidden}, {args.layers} layers, "
        f"{args.docs} perplexity documents per language (half searched)"
    )
    print(f"  surgery search               {search:7.1f} s  {count / search * 60:6.1f} trials/min")
    print(
        f"  interpolate + eval per trial {scripted:7.1f} s  {count / scripted * 60:6.1f} trials/min"
    )
    cpus = os.cpu_count()
    print(f"  ratio {scripted / search:.1f}x; load average {load[0]:.2f} (uptime), {cpus} CPUs")


def _trials(out: Path) -> list[dict]:
    """Every complete trial's profile, from the search's storage."""
    from eval.search import storage as st

    optuna = st.require_optuna()
    study = optuna.load_study(study_name=st.STUDY, storage=st.open_storage(out, None))
    return [{"profile": t.user_attrs["profile"]} for t in st.finished(study)]


if __name__ == "__main__":
    main()

"""Benchmark: an 11-point interpolation sweep with eval, in memory against write-and-reload.

Builds a random Llama (bf16 on disk) and a perturbed copy, then runs
`surgery.diagnostics.sweep.run_sweep`
over alpha 0:1:0.1 scoring perplexity on a text file, once blending weights in memory (BASE and
TRAINED loaded once) and once writing, loading and scoring a checkpoint per point. Prints both
times, the ratio, and whether the scores agree exactly.

Run by hand:  python bench/bench_sweep.py [--hidden 512] [--layers 8]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1]))
from tests.support import tiny_models


def build(root: Path, hidden: int, layers: int) -> tuple[Path, Path]:
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
    # TRAINED = BASE plus small noise, so every alpha scores differently.
    trained = tiny_models.save(
        tiny_models.perturb(model, seed=1, scale=0.01), root / "trained", "50MB"
    )
    return base, trained


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    args = parser.parse_args()
    from eval.scorer import TaskScorer
    from surgery.diagnostics.sweep import parse_alpha_grid, run_sweep

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base, trained = build(root, args.hidden, args.layers)
        text = root / "text.txt"
        text.write_text("\n\n".join(" ".join(tiny_models._CORPUS) for _ in range(4)))
        alphas = parse_alpha_grid("0:1:0.1")
        timings, results = {}, {}
        for mode, in_memory in (("in memory", True), ("write and reload", False)):
            start = time.perf_counter()
            results[mode] = run_sweep(
                base,
                trained,
                root / mode.replace(" ", "-"),
                alphas,
                scorer=TaskScorer.of([f"ppl:{text}"]),
                save=False,
                in_memory=in_memory,
                quiet=True,
            )
            timings[mode] = time.perf_counter() - start
    print(f"11-point sweep, Llama hidden {args.hidden}, {args.layers} layers, ppl eval")
    for mode, seconds in timings.items():
        print(f"  {mode:17s} {seconds:6.1f} s")
    ratio = timings["write and reload"] / timings["in memory"]
    print(
        f"  in memory is {ratio:.2f}x faster; identical scores: "
        f"{results['in memory'] == results['write and reload']}"
    )


if __name__ == "__main__":
    main()

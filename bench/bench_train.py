"""Time per training step: plain, with L2-SP, with EMA, on one small Llama; ratios to plain.

Usage: python bench/bench_train.py [--rounds 3] [--steps 20] [--hidden 256] [--layers 8]

The model is built from a config (no download), saved as a bf16 checkpoint, and trained with the
wrapper's Python API. Per-step wall time is measured by a callback between optimizer steps,
skipping the first steps (allocation, first tokenization). Variants run interleaved for several
rounds (plain, l2sp, ema, plain, ...) so that load from other processes hits them alike; the
median over all rounds is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback  # noqa: E402

from tests.support import tiny_models  # noqa: E402
from train.api import train  # noqa: E402
from train.config import TrainConfig  # noqa: E402

VARIANTS = {
    "plain": {},
    "l2sp": {"l2sp": "1:-1=0.05,*=0.001"},
    "ema": {"ema": 0.92, "ema_every": 1},
}


class StepTimer(TrainerCallback):
    """Wall time between consecutive optimizer steps."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_step_end(self, args, state, control, **kwargs) -> None:
        self.times.append(time.perf_counter())

    def gaps(self, skip: int) -> list[float]:
        """Seconds per step after the first `skip` steps."""
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)][skip:]


def build_base(folder: Path, hidden: int, layers: int) -> Path:
    """A random bf16 Llama of the given size, saved with the tiny tokenizer."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tiny_models.vocab_size(),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return tiny_models.save(LlamaForCausalLM(config).to(torch.bfloat16), folder, "10MB")


def write_data(path: Path, docs: int = 2000) -> Path:
    words = [
        "the",
        "cat",
        "sat",
        "on",
        "the",
        "mat",
        "a",
        "dog",
        "ran",
        "in",
        "the",
        "park",
        "hello",
        "world",
    ]
    lines = (" ".join(words[(i + j) % len(words)] for j in range(60)) for i in range(docs))
    path.write_text("\n\n".join(lines), encoding="utf-8")
    return path


def main() -> None:
    """Run every variant once and print seconds per step and the ratio to plain."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--skip", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = build_base(root / "base", args.hidden, args.layers)
        data = write_data(root / "data.txt")
        samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for round_ in range(args.rounds):
            for name, options in VARIANTS.items():
                timer = StepTimer()
                config = TrainConfig(
                    base=str(base),
                    output=root / f"{name}{round_}",
                    data=[str(data)],
                    max_steps=args.steps,
                    block_size=args.block,
                    batch_size=args.batch,
                    learning_rate=1e-4,
                    logging_steps=10**6,
                    progress=False,
                    drift=False,
                    **options,
                )
                train(config, callbacks=[timer])
                samples[name] += timer.gaps(args.skip)
        results = {name: statistics.median(gaps) for name, gaps in samples.items()}
    plain = results["plain"]
    print(f"{'variant':8} {'ms/step':>9} {'ratio':>6}")
    for name, seconds in results.items():
        print(f"{name:8} {seconds * 1000:9.1f} {seconds / plain:6.2f}")
    params = args.hidden, args.layers, args.block, args.batch, torch.get_num_threads()
    print(
        json.dumps(
            {
                "hidden_layers_block_batch_threads": params,
                "ms_per_step": {k: round(v * 1000, 2) for k, v in results.items()},
                "ratio_to_plain": {k: round(v / plain, 3) for k, v in results.items()},
            }
        )
    )


if __name__ == "__main__":
    main()

"""Benchmark: multiple-choice scoring with a shared context against one forward per choice.

A random Llama (hidden 256, 4 layers, vocab 32000 by default; float32 on CPU) scores two
synthetic workloads of token ids:

- belebele-like: 2-shot passages, ~400-token contexts, 4 one-token choices (" A".." D");
- piqa-like: ~120-token contexts, 2 choices of ~20 tokens.

Three ways, same log-likelihoods (the largest difference is printed):

- shared:        eval.scoring.choice_loglikelihoods (context once per item, KV cache repeated per
                 choice, items batched);
- naive loop:    one forward of context+choice per choice, one sequence at a time;
- naive batched: one row per choice, rows batched like the shared run (right-padded).

Run by hand:  python bench/bench_eval_mc.py [--items 48] [--batch-size 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from eval.batching import right_pad
from eval.scoring import ChoiceRequest, choice_loglikelihoods

WORKLOADS = {  # name: (context length range, choices, choice length range)
    "belebele-like": ((350, 450), 4, (1, 1)),
    "piqa-like": ((90, 150), 2, (12, 28)),
}


def build_model(hidden: int, layers: int, vocab: int) -> LlamaForCausalLM:
    """A random Llama, float32, eval mode."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=2048,
    )
    return LlamaForCausalLM(config).float().eval()


def make_requests(name: str, items: int, vocab: int) -> list[ChoiceRequest]:
    """Seeded random items of one workload; contexts start with BOS (id 1)."""
    (c_lo, c_hi), choices, (k_lo, k_hi) = WORKLOADS[name]
    rng = random.Random(name)

    def tokens(low: int, high: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(rng.randint(low, high))]

    return [
        ChoiceRequest([1, *tokens(c_lo, c_hi)], [tokens(k_lo, k_hi) for _ in range(choices)])
        for _ in range(items)
    ]


@torch.no_grad()
def naive_loop(model, requests: list[ChoiceRequest]) -> list[list[float]]:
    """One forward of context+choice per choice, one sequence at a time."""
    scores = []
    for request in requests:
        item = []
        for cont in request.continuations:
            ids = torch.tensor([request.context + cont])
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
            n = len(request.context)
            item.append(sum(logprobs[n - 1 + j, t].item() for j, t in enumerate(cont)))
        scores.append(item)
    return scores


@torch.no_grad()
def naive_batched(model, requests: list[ChoiceRequest], rows: int) -> list[list[float]]:
    """One row per (item, choice), `rows` rows per forward, right-padded."""
    flat = [(r.context, c) for r in requests for c in r.continuations]
    totals: list[float] = []
    for start in range(0, len(flat), rows):
        batch = flat[start : start + rows]
        ids, mask = right_pad([ctx + cont for ctx, cont in batch], torch.device("cpu"))
        logprobs = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), -1)
        for row, (ctx, cont) in enumerate(batch):
            n = len(ctx)
            totals.append(sum(logprobs[row, n - 1 + j, t].item() for j, t in enumerate(cont)))
    scores, at = [], 0
    for request in requests:
        scores.append(totals[at : at + len(request.continuations)])
        at += len(request.continuations)
    return scores


def timed(run: Callable[[], list[list[float]]], repeats: int) -> tuple[float, list[list[float]]]:
    """Best wall seconds over `repeats` calls (the least disturbed by other processes), and the
    result."""
    best, result = float("inf"), []
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    return best, result


def max_difference(a: list[list[float]], b: list[list[float]]) -> float:
    """Largest absolute difference between two score tables."""
    pairs = zip(a, b, strict=True)
    return max(abs(x - y) for row_a, row_b in pairs for x, y in zip(row_a, row_b, strict=True))


def main() -> None:
    """Parse arguments, run both workloads, print times and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=3, help="best of N runs is shown")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = build_model(args.hidden, args.layers, args.vocab)
    print(
        f"random Llama: hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, float32, "
        f"{args.threads} CPU thread(s); {args.items} items, batch {args.batch_size}, "
        f"best of {args.repeats}"
    )
    choice_loglikelihoods(model, make_requests("piqa-like", 4, args.vocab))  # warm-up
    header = f"{'workload':<14} {'shared s':>9} {'naive loop s':>13} {'naive batched s':>16}"
    print(f"{header} {'x loop':>7} {'x batched':>10} {'max |diff|':>11}")
    for name in WORKLOADS:
        requests = make_requests(name, args.items, args.vocab)
        shared_s, shared = timed(
            lambda r=requests: choice_loglikelihoods(model, r, batch_size=args.batch_size),
            args.repeats,
        )
        loop_s, loop = timed(lambda r=requests: naive_loop(model, r), args.repeats)
        choices = len(requests[0].continuations)
        batched_s, batched = timed(
            lambda r=requests, c=choices: naive_batched(model, r, args.batch_size * c),
            args.repeats,
        )
        diff = max(max_difference(shared, loop), max_difference(shared, batched))
        print(
            f"{name:<14} {shared_s:>9.2f} {loop_s:>13.2f} {batched_s:>16.2f} "
            f"{loop_s / shared_s:>7.1f} {batched_s / shared_s:>10.1f} {diff:>11.1e}"
        )


if __name__ == "__main__":
    main()

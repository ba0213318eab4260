"""Benchmark: greedy generation by ``surgery eval`` against lm-eval's HF ``generate_until``.

SmolLM2-135M-Instruct (bench/fetch_smollm2.py; float32, CPU) generates for three tasks, in one
process, each tool in turn on the same prompts:

- flores 0-shot and flores 2-shot: synthetic FLORES-style sentence pairs (seeded sentences of
  common English words, and the same words reversed as the "target language"), greedy until a
  newline, at most 256 new tokens (the flores kind's default);
- exact_match 2-shot: synthetic questions ("What is 23 plus 58?"), greedy until the few-shot
  delimiter (a blank line), at most 32 new tokens.

Ours is `eval.api.evaluate` on the task (prompts, generation and scoring; samples logged).
lm-eval 0.4 gets OUR prompt strings (the task's, checked against the logged ones):
`HFLM.generate_until` with the same ``until`` and ``max_gen_toks``, greedy. The two draw
demonstrations differently, so each item's prompt is the same only this way. Timed: the
`evaluate` call, the `generate_until` call (the model loaded and warmed up before both).

Printed per task: items, each tool's seconds and items per second, the ratio of our time to
lm-eval's, how many items' generations are equal, and each tool's CPU seconds (the process's,
over the same call) with their ratio (the text up to the first newline, or
up to the stop string: what each tool scores). The tools alternate (lm-eval first for one
task, ours first for the next), so load that changes during the run reaches both.

Run by hand (on an idle machine; about a minute per task at the default size):
    python bench/fetch_smollm2.py           # once: needs `pip install gguf`
    python bench/bench_generation.py [--items 64] [--threads 2] [--lm-eval-batch-size 8]
    python bench/bench_generation.py --items 32 --flores-tokens 64 --threads 1  # a loaded machine
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from bench.bench_prefix import WORDS  # noqa: E402

FLORES_TOKENS = 256  # the flores kind's default max_new_tokens
ANSWER_TOKENS = 32  # the exact_match kind's default max_new_tokens


def synthetic_pairs(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """`count` seeded (English, target) sentence pairs: 8 to 20 common words, and the same
    words reversed (a stand-in language the model can learn from two demonstrations)."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(8, 20))]
        pairs.append((" ".join(words).capitalize() + ".", " ".join(reversed(words)) + "."))
    return pairs


def write_flores(folder: Path, count: int) -> Path:
    """A FLORES folder (devtest and dev) of synthetic eng_Latn -> ind_Latn pairs."""
    for split, seed in (("devtest", 0), ("dev", 1)):
        pairs = synthetic_pairs(count, seed)
        (folder / split).mkdir(parents=True, exist_ok=True)
        for lang, column in (("eng_Latn", 0), ("ind_Latn", 1)):
            text = "".join(pair[column] + "\n" for pair in pairs)
            (folder / split / f"{lang}.{split}").write_text(text, encoding="utf-8")
    return folder


def write_questions(path: Path, count: int, seed: int = 0) -> Path:
    """`count` seeded sums as exact_match rows (question, answer)."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as out:
        for _ in range(count):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            row = {"question": f"Question: What is {a} plus {b}?\nAnswer:", "answer": str(a + b)}
            out.write(json.dumps(row) + "\n")
    return path


def tasks(
    folder: Path, items: int, flores_tokens: int = FLORES_TOKENS
) -> list[tuple[str, str, str, int]]:
    """(label, task string, lm-eval stop string, new tokens) of each benchmarked task."""
    flores = write_flores(folder / "flores", items)
    rows = write_questions(folder / "questions.jsonl", items)
    base = f"flores:{flores}:src=eng_Latn,tgt=ind_Latn,max_new_tokens={flores_tokens}"
    return [
        ("flores 0-shot", f"{base},shots=0", "\n", flores_tokens),
        ("flores 2-shot", f"{base},shots=2,shots_split=dev", "\n", flores_tokens),
        ("exact_match 2-shot", f"exact_match:{rows}:input=question,target=answer,shots=2", "\n\n",
         ANSWER_TOKENS),
    ]  # fmt: skip


def ours(model, tok, task: str, log: Path, batch_size: int | None) -> tuple[tuple, list, list]:
    """`evaluate` on the task: (seconds, CPU seconds), prompts, and each item's text up to the
    stop."""
    from eval.api import evaluate

    extra = {} if batch_size is None else {"batch_size": batch_size}
    start, cpu = time.perf_counter(), time.process_time()
    evaluate(model, tok, [task], progress=False, log_samples=log, max_length=2048, **extra)
    seconds = (time.perf_counter() - start, time.process_time() - cpu)
    records = sorted((json.loads(line) for line in log.read_text().splitlines()),
                     key=lambda r: r["index"])  # fmt: skip
    # flores logs the raw generation (to its line end), exact_match the text before the stop.
    texts = [r["raw_generation"].split("\n", 1)[0] if "raw_generation" in r else r["generation"]
             for r in records]  # fmt: skip
    return seconds, [r["prompt"] for r in records], texts


def lm_eval_generations(lm, prompts: list[str], stop: str, tokens: int) -> tuple[tuple, list]:
    """lm-eval's `HFLM.generate_until` on `prompts`: (seconds, CPU seconds) and each item's
    text."""
    from lm_eval.api.instance import Instance

    kwargs = {"until": [stop], "max_gen_toks": tokens, "do_sample": False}
    requests = [
        Instance(request_type="generate_until", doc={}, arguments=(p, dict(kwargs)), idx=0)
        for p in prompts
    ]
    start, cpu = time.perf_counter(), time.process_time()
    texts = lm.generate_until(requests, disable_tqdm=True)
    return (time.perf_counter() - start, time.process_time() - cpu), texts


def main() -> None:
    """Run every task with both tools, alternating which goes first, and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lm-eval-batch-size", type=int, default=8)
    parser.add_argument("--batch-size", type=int, help="ours; default: sized by memory")
    parser.add_argument("--flores-tokens", type=int, default=FLORES_TOKENS, help="quick runs")
    args = parser.parse_args()
    import torch
    from lm_eval.models.huggingface import HFLM

    from bench.fetch_smollm2 import smollm2
    from eval.api import load_model
    from eval.tasks import load_task, parse_task

    torch.set_num_threads(args.threads)
    model, tok = load_model(smollm2(), progress=False)
    with torch.no_grad():  # the first forward pays one-time set-up: outside every timing
        model(input_ids=torch.full((1, 16), tok.eos_token_id))
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=args.lm_eval_batch_size, max_length=2048)
    print(
        f"SmolLM2-135M-Instruct, float32, {args.threads} CPU thread(s); {args.items} items per "
        f"task, flores up to {args.flores_tokens} new tokens; lm-eval HFLM.generate_until at "
        f"batch {args.lm_eval_batch_size}, ours at "
        f"{args.batch_size or 'batches sized by memory'}; load {os.getloadavg()[0]:.2f}"
    )
    header = ("task", "items", "lm-eval s", "ours s", "lm-eval it/s", "ours it/s", "ratio", "equal",
              "lm-eval cpu s", "ours cpu s", "cpu ratio")  # fmt: skip
    print("{:<20} {:>5} {:>9} {:>7} {:>12} {:>9} {:>6} {:>7} {:>13} {:>10} {:>9}".format(*header))
    with tempfile.TemporaryDirectory() as tmp:
        chosen = tasks(Path(tmp), args.items, args.flores_tokens)
        for turn, (label, task, stop, tokens) in enumerate(chosen):
            log = Path(tmp) / f"samples{turn}.jsonl"
            prompts = load_task(parse_task(task)).prompts(args.items, 0)  # evaluate's, seed 0
            if turn % 2:
                theirs_s, theirs = lm_eval_generations(lm, prompts, stop, tokens)
                ours_s, logged, mine = ours(model, tok, task, log, args.batch_size)
            else:
                ours_s, logged, mine = ours(model, tok, task, log, args.batch_size)
                theirs_s, theirs = lm_eval_generations(lm, prompts, stop, tokens)
            assert logged == prompts, f"{label}: the logged prompts are not the task's"
            n = len(mine)
            equal = sum(a == b for a, b in zip(mine, theirs, strict=True))
            (theirs_s, theirs_cpu), (ours_s, ours_cpu) = theirs_s, ours_s
            print(
                f"{label:<20} {n:>5} {theirs_s:>9.1f} {ours_s:>7.1f} {n / theirs_s:>12.2f} "
                f"{n / ours_s:>9.2f} {ours_s / theirs_s:>5.2f}x {equal:>3}/{n:<3} "
                f"{theirs_cpu:>13.1f} {ours_cpu:>10.1f} {ours_cpu / theirs_cpu:>8.2f}x",
                flush=True,
            )
    print(f"ratio: our time / lm-eval's (wall clock, then CPU time of the process); load after "
          f"the run {os.getloadavg()[0]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()

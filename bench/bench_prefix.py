"""Benchmark: Belebele scoring from the shared-prefix KV cache, whole contexts, and lm-eval.

SmolLM2-135M-Instruct (bench/fetch_smollm2.py; float32, CPU) scores the same synthetic
Belebele items at k shots (lm-eval's ``first_n`` demonstrations) three ways, each in its own
process so that each has its own peak memory:

- prefix: ``surgery eval``'s default (eval.prefix_cache: the demonstrations every item shares
  run once, each batch starts from their KV cache; questions on one passage run it once per
  batch);
- whole:  the same with ``--no-prefix-cache`` (every context runs whole, as before);
- lm-eval: stock lm-evaluation-harness 0.4 (HFLM, its own Belebele config pointed at the rows).

Printed per way: scoring seconds (the evaluate / simple_evaluate call, model already loaded)
and the CPU seconds of that call (all threads: on a shared machine wall time swings), process
wall seconds (model load included), peak private memory (RssAnon of the process, see
bench/measure.py), acc and acc_norm, the largest difference of a per-item log-likelihood
from lm-eval's and how many items pick the same choice as lm-eval; then the prefix cache's time
(and CPU time) as a fraction of lm-eval's and its speed-up over whole contexts.

The rows are synthetic (the repository has 6 real Belebele rows, too few): seeded passages of
4 to 6 sentences of common English words, a question and four answers, in Belebele's schema,
so prompts have Belebele's shape and about its length (a 2-shot prompt is ~2/3 demonstrations).
Each passage gets one question; ``--questions 2`` asks two per passage, as Belebele asks most
(900 questions of 488 passages).

Run by hand (on an idle machine; takes a few minutes at the default size):
    python bench/fetch_smollm2.py           # once: needs `pip install gguf`
    python bench/bench_prefix.py [--items 200] [--shots 2] [--batch-size 8] [--threads 2]
        [--questions 1]
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

from bench.measure import measure  # noqa: E402

WAYS = ("prefix", "whole", "lm-eval")
_WORD_TEXT = (
    "the a city river people market school water year house road night morning children "
    "government country village music story train station bridge garden church island forest "
    "animal bird festival century king queen war peace family doctor hospital museum library "
    "language farmers rain winter summer mountain coast ship harbour trade coffee "
    "bread salt gold silver stone wood fire light dark old new small large early late many few "
    "first last long short north south east west built opened closed walked visited grew sold "
    "found lost wrote read sang played moved lived worked studied changed began ended because "
    "after before during while although when where which and but or so then also only still "
    "very often never always most some every each other"
)
WORDS = _WORD_TEXT.split()


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(8, 16))]
    return " ".join(words).capitalize() + "."


def synthetic_rows(count: int, seed: int = 0, questions: int = 1) -> list[dict]:
    """`count` seeded Belebele-format rows (flores_passage, question, mc_answer1..4, label),
    `questions` rows in a row per passage (Belebele asks 900 questions of 488 passages)."""
    rng = random.Random(seed)
    rows = []
    for n in range(count):
        answers = {
            f"mc_answer{k}": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))
            for k in range(1, 5)
        }
        question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 11)))
        if n % questions == 0:  # drawn after the question: rows as before at one per passage
            passage = " ".join(_sentence(rng) for _ in range(rng.randint(4, 6)))
        rows.append(
            {
                "link": f"synthetic/{n // questions}",
                "question_number": n % questions + 1,
                "flores_passage": passage,
                "question": question.capitalize() + "?",
                **answers,
                "correct_answer_num": str(rng.randint(1, 4)),
                "dialect": "eng_Latn",
                "ds": "synthetic",
            }
        )
    return rows


def _score(args: argparse.Namespace) -> dict:
    """One way, in this process: load the model, time the scoring, return results."""
    import torch

    from bench.fetch_smollm2 import smollm2
    from eval.api import load_model

    torch.set_num_threads(args.threads)
    model, tok = load_model(smollm2(), progress=False)
    with torch.no_grad():  # the first forward pays one-time set-up: outside every timing
        model(input_ids=torch.full((1, 16), tok.eos_token_id))
    data = Path(args.data)
    start, cpu = time.perf_counter(), time.process_time()
    if args.way == "lm-eval":
        from tests.support.lmeval_runner import run_lm_eval

        out = run_lm_eval(
            model, tok, data / "tasks", ["local_belebele"], args.shots, 2048, args.batch_size
        )
        seconds = time.perf_counter() - start
        samples = sorted(out["samples"]["local_belebele"], key=lambda s: s["doc_id"])
        lls = [[float(r[0]) for r in s["filtered_resps"]] for s in samples]
        result = out["results"]["local_belebele"]
        acc, acc_norm = result["acc,none"], result["acc_norm,none"]
    else:
        from eval.api import evaluate

        log = data / f"{args.way}.samples.jsonl"
        metrics = evaluate(
            model,
            tok,
            [f"belebele:{data / 'belebele.jsonl'}:shots={args.shots}"],
            batch_size=args.batch_size,
            max_length=2048,
            progress=False,
            log_samples=log,
            prefix_cache=args.way == "prefix",
        )["metrics"]
        seconds = time.perf_counter() - start
        records = [json.loads(line) for line in log.read_text().splitlines()]
        lls = [r["loglikelihoods"] for r in sorted(records, key=lambda r: r["index"])]
        acc, acc_norm = metrics["belebele/acc"], metrics["belebele/acc_norm"]
    cpu = time.process_time() - cpu  # every thread of this process: the machine may be shared
    return {"seconds": seconds, "cpu": cpu, "acc": acc, "acc_norm": acc_norm, "lls": lls}


def _prepare(folder: Path, items: int, questions: int) -> None:
    from tests.support.lmeval_runner import write_jsonl, write_task_yamls

    rows = write_jsonl(folder / "belebele.jsonl", synthetic_rows(items, questions=questions))
    write_task_yamls(folder / "tasks", {"belebele": rows})


def _max_difference(a: list[list[float]], b: list[list[float]]) -> float:
    pairs = zip(a, b, strict=True)
    return max(abs(x - y) for row_a, row_b in pairs for x, y in zip(row_a, row_b, strict=True))


def _shared_fraction(folder: Path, shots: int) -> tuple[int, int, float]:
    """Prefix length, how many contexts start with it, and its share of their mean length."""
    from transformers import AutoTokenizer

    from bench.fetch_smollm2 import smollm2
    from eval.kinds.templates import TARGET_DELIMITER
    from eval.prefix_cache import shared_prefix
    from eval.scoring import make_request
    from eval.tasks import load_task, parse_task
    from eval.tokens import TextEncoder

    task = load_task(parse_task(f"belebele:{folder / 'belebele.jsonl'}:shots={shots}"))
    encoder = TextEncoder(AutoTokenizer.from_pretrained(smollm2()))
    contexts = task.contexts(len(task.items), 0)
    ids = [
        make_request(encoder, c, [TARGET_DELIMITER + x for x in item.choices], 2048)[0].context
        for c, item in zip(contexts, task.items, strict=True)
    ]
    length, members = shared_prefix(ids)
    mean = sum(len(ids[i]) for i in members) / max(len(members), 1)
    return length, len(members), length / mean


def main() -> None:
    """Parse arguments; as parent run every way in a child process and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--shots", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--questions", type=int, default=1, help="questions per passage (Belebele: 1.8)"
    )
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.way:  # child
        Path(args.result).write_text(json.dumps(_score(args)))
        return
    from bench.fetch_smollm2 import smollm2

    checkpoint = smollm2()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _prepare(folder, args.items, args.questions)
        length, members, fraction = _shared_fraction(folder, args.shots)
        print(
            f"SmolLM2-135M-Instruct, float32, {args.threads} CPU thread(s); {args.items} "
            f"synthetic Belebele items ({args.questions} per passage), {args.shots}-shot "
            f"(first_n), batch {args.batch_size}; "
            f"shared prefix {length} tokens, {fraction:.0%} of the {members} contexts that "
            "start with it"
        )
        results, runs = {}, {}
        for way in WAYS:
            result = folder / f"{way}.json"
            command = [sys.executable, __file__, "--way", way, "--data", tmp, "--result"]
            command += [str(result), "--items", str(args.items), "--shots", str(args.shots)]
            command += ["--batch-size", str(args.batch_size), "--threads", str(args.threads)]
            runs[way] = measure(command, inputs=[str(checkpoint)])
            if runs[way].returncode != 0:
                sys.exit(f"{way} failed with exit code {runs[way].returncode}")
            results[way] = json.loads(result.read_text())
    print(
        f"{'way':<8} {'scoring s':>10} {'CPU s':>7} {'wall s':>8} {'peak MB':>8} {'acc':>7} "
        f"{'acc_norm':>9} {'max |d ll| vs lm-eval':>22} {'same argmax':>12}"
    )
    reference = results["lm-eval"]["lls"]
    for way in WAYS:
        r, run = results[way], runs[way]
        diff = _max_difference(r["lls"], reference)
        same = _same_argmax(r["lls"], reference)
        print(
            f"{way:<8} {r['seconds']:>10.1f} {r['cpu']:>7.1f} {run.seconds:>8.1f} "
            f"{run.peak_anon / 2**20:>8.0f} {r['acc']:>7.3f} {r['acc_norm']:>9.3f} "
            f"{diff:>22.1e} {same:>8}/{len(reference)}"
        )
    prefix, whole = results["prefix"]["seconds"], results["whole"]["seconds"]
    cpu = results["prefix"]["cpu"] / results["lm-eval"]["cpu"]
    print(
        f"prefix cache: {prefix / results['lm-eval']['seconds']:.2f}x lm-eval's scoring time "
        f"({cpu:.2f}x its CPU time), {whole / prefix:.2f}x faster than whole contexts"
    )


def _same_argmax(a: list[list[float]], b: list[list[float]]) -> int:
    """Items whose highest-scoring choice is the same in `a` and `b`."""
    return sum(x.index(max(x)) == y.index(max(y)) for x, y in zip(a, b, strict=True))


if __name__ == "__main__":
    main()

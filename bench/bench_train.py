"""Training cost on one small Llama: time per step, and peak memory per rank beside the plan.

Usage:
    python bench/bench_train.py [--rounds 3] [--steps 20] [--hidden 256] [--layers 8]
    python bench/bench_train.py --memory [--hidden 512] [--layers 8] [--vocab 8192]

Time: plain, with L2-SP, with EMA, and transformers' own `Trainer` on the same steps (the same
checkpoint loaded in float32, the same text packed into blocks of the same size, the same batch,
steps, learning rate, cosine schedule and clipping, with no saving); ratios to plain, and plain's
ratio to the Trainer. The Trainer reads blocks tokenized beforehand (as transformers' run_clm
does), while the wrapper packs its mixture while it trains. Memory (`--memory`): plain, L2-SP
and EMA, each on one process, under DDP and under FSDP (`--fsdp "full_shard auto_wrap"`) with
2 CPU ranks (torchrun, gloo). Each rank samples its own RssAnon every millisecond in a thread;
the figure is its peak minus its RssAnon just before `train()` (Python, torch, transformers and
the tokenizer already loaded), printed beside `surgery train --dry-run`'s total for the same run
(the plan's DDP column for one process and DDP, its FSDP column for FSDP).

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
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from tests.support import tiny_models  # noqa: E402
from train.api import train  # noqa: E402
from train.config import TrainConfig  # noqa: E402
from train.strategies.drift import DriftOptions  # noqa: E402
from train.strategies.ema import EMAOptions  # noqa: E402
from train.strategies.l2sp import L2SPOptions  # noqa: E402

VARIANTS = {
    "plain": {},
    "l2sp": {"l2sp": L2SPOptions(lambdas="1:-1=0.05,*=0.001")},
    "ema": {"ema": EMAOptions(alpha=0.92, every=1)},
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
    return tiny_models.random_llama(folder, hidden=hidden, layers=layers, shard_size="10MB")


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


def packed_blocks(tokenizer, data: Path, block: int) -> list[dict[str, torch.Tensor]]:
    """The documents of `data`, tokenized as the wrapper does (special tokens, then EOS),
    concatenated and cut into blocks of `block` tokens, in file order."""
    from surgery.core.textfiles import iter_documents

    eos, ids = tokenizer.eos_token_id, []
    for tokens in tokenizer(list(iter_documents(data)), add_special_tokens=True)["input_ids"]:
        ids += tokens if tokens[-1:] == [eos] else [*tokens, eos]
    blocks = [torch.tensor(ids[i : i + block]) for i in range(0, len(ids) - block + 1, block)]
    return [{"input_ids": b, "labels": b} for b in blocks]


def trainer_run(base: Path, data: Path, out: Path, args: argparse.Namespace, timer) -> None:
    """transformers' Trainer alone on the steps of the wrapper's plain run (see the module's
    docstring): the same model, data, batch, steps and optimizer settings."""
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        Trainer,
        TrainingArguments,
        default_data_collator,
        set_seed,
    )

    set_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    training = TrainingArguments(
        output_dir=str(out),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        learning_rate=1e-4,
        lr_scheduler_type="cosine",
        weight_decay=0.0,
        max_grad_norm=1.0,
        seed=0,
        logging_steps=10**6,
        save_strategy="no",
        report_to=["none"],
        disable_tqdm=True,
        use_cpu=True,
        dataloader_num_workers=0,
    )
    dataset = packed_blocks(tokenizer, data, args.block)
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=dataset,
        data_collator=default_data_collator,
        callbacks=[timer],
    )
    trainer.train()


def main() -> None:
    """Run every variant and the Trainer, interleaved; print seconds per step and ratios."""
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
        samples: dict[str, list[float]] = {name: [] for name in [*VARIANTS, "trainer"]}
        for round_ in range(args.rounds):
            timer = StepTimer()
            trainer_run(base, data, root / f"trainer{round_}", args, timer)
            samples["trainer"] += timer.gaps(args.skip)
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
                    drift=DriftOptions(log=False),
                    **options,
                )
                train(config, callbacks=[timer])
                samples[name] += timer.gaps(args.skip)
        results = {name: statistics.median(gaps) for name, gaps in samples.items()}
    plain, trainer = results["plain"], results.pop("trainer")
    print(f"{'variant':8} {'ms/step':>9} {'ratio':>6}")
    for name, seconds in results.items():
        print(f"{name:8} {seconds * 1000:9.1f} {seconds / plain:6.2f}")
    print(f"{'Trainer':8} {trainer * 1000:9.1f}   (transformers' Trainer, the same steps)")
    print(f"plain / Trainer: {plain / trainer:.2f}x")
    params = args.hidden, args.layers, args.block, args.batch, torch.get_num_threads()
    print(
        json.dumps(
            {
                "hidden_layers_block_batch_threads": params,
                "ms_per_step": {k: round(v * 1000, 2) for k, v in results.items()},
                "ratio_to_plain": {k: round(v / plain, 3) for k, v in results.items()},
                "trainer_ms_per_step": round(trainer * 1000, 2),
                "plain_to_trainer": round(plain / trainer, 3),
            }
        )
    )


# ---- memory per rank -------------------------------------------------------------------

MEMORY_VARIANTS = {
    "plain": {},
    "l2sp": {"l2sp": L2SPOptions(lambdas="*=0.01")},
    "ema": {"ema": EMAOptions(alpha=0.92)},
}
MODES = ("single", "ddp", "fsdp")


def memory_config(
    args: argparse.Namespace, base: Path, data: Path, out: Path, variant: str, mode: str
):
    """The TrainConfig of one memory run (the plan is computed from the same one)."""
    return TrainConfig(
        base=str(base),
        output=out,
        data=[str(data)],
        max_steps=args.steps,
        block_size=args.block,
        batch_size=args.batch,
        learning_rate=1e-4,
        logging_steps=10**6,
        progress=False,
        drift=DriftOptions(log=False),
        fsdp="full_shard auto_wrap" if mode == "fsdp" else None,
        **MEMORY_VARIANTS[variant],
    )


def _sample_peak(stop: threading.Event, peak: list[int]) -> None:
    from bench.measure import _anon_bytes

    pid = os.getpid()
    while not stop.is_set():
        peak[0] = max(peak[0], _anon_bytes(pid))
        time.sleep(0.001)


def worker(args: argparse.Namespace) -> None:
    """One rank of a memory run: peak RssAnon over `train()`, minus the RssAnon before it."""
    import importlib

    # Imported before the baseline, so they are not part of the figure.
    for module in ("accelerate", "transformers.trainer", "train.checkpoint_io", "train.trainer"):
        importlib.import_module(module)
    from bench.measure import _anon_bytes

    config = memory_config(
        args, Path(args.base), Path(args.data), Path(args.out), args.variant, args.mode
    )
    rank = int(os.environ.get("RANK", "0"))
    baseline = _anon_bytes(os.getpid())
    peak, stop = [baseline], threading.Event()
    thread = threading.Thread(target=_sample_peak, args=(stop, peak), daemon=True)
    thread.start()
    train(config)
    stop.set()
    thread.join()
    result = {"rank": rank, "baseline": baseline, "peak": peak[0], "delta": peak[0] - baseline}
    (Path(args.results) / f"{args.variant}-{args.mode}-rank{rank}.json").write_text(
        json.dumps(result)
    )


def build_memory_base(folder: Path, hidden: int, layers: int, vocab: int) -> Path:
    """A random bf16 Llama with `vocab` embedding rows (the tiny tokenizer uses the first few)."""
    return tiny_models.random_llama(
        folder,
        hidden=hidden,
        layers=layers,
        vocab=vocab,
        heads=8,
        kv_heads=4,
        positions=2048,
        shard_size="50MB",
    )


def memory_main(args: argparse.Namespace) -> None:
    """Run every variant in every mode; print measured peaks per rank beside the plan."""
    import subprocess

    from train.memory_plan import plan_memory

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = build_memory_base(root / "base", args.hidden, args.layers, args.vocab)
        data = write_data(root / "data.txt")
        results = root / "results"
        results.mkdir()
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT)}
        for variant in args.variants.split(","):
            for mode in args.modes.split(","):
                launcher = [sys.executable]
                if mode != "single":
                    launcher += [
                        "-m",
                        "torch.distributed.run",
                        "--standalone",
                        "--nproc-per-node",
                        "2",
                    ]
                command = [
                    *launcher,
                    str(Path(__file__).resolve()),
                    "--worker",
                    "--variant",
                    variant,
                    "--mode",
                    mode,
                    "--base",
                    str(base),
                    "--data",
                    str(data),
                    "--out",
                    str(root / f"{variant}-{mode}"),
                    "--results",
                    str(results),
                    *(f"--{k}={getattr(args, k)}" for k in ("steps", "block", "batch")),
                ]
                subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
                config = memory_config(args, base, data, root / "unused", variant, mode)
                ranks = 1 if mode == "single" else 2
                plan = plan_memory(config, gpus=ranks, gpu_memory=10**12)
                ddp, fsdp = plan.totals(checkpointed=False)
                predicted = fsdp if mode == "fsdp" else ddp
                for rank in range(ranks):
                    measured = json.loads(
                        (results / f"{variant}-{mode}-rank{rank}.json").read_text()
                    )
                    rows.append((variant, mode, rank, measured["delta"], predicted))
        params = plan.counts.total
    print(
        f"Llama hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}: "
        f"{params / 1e6:.1f} M parameters; "
        f"micro-batch {args.batch} x {args.block}, {args.steps} steps, float32"
    )
    print(
        f"{'variant':8} {'mode':7} {'rank':>4} {'measured MB':>12} {'plan MB':>9} "
        f"{'plan/measured':>14}"
    )
    for variant, mode, rank, measured, predicted in rows:
        print(
            f"{variant:8} {mode:7} {rank:4d} {measured / 1e6:12.1f} {predicted / 1e6:9.1f} "
            f"{predicted / measured:14.2f}"
        )
    print(json.dumps({"rows": rows}))


def cli() -> None:
    """Dispatch: the timing benchmark, the memory benchmark, or one memory worker."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--variant")
    parser.add_argument("--mode")
    parser.add_argument("--base")
    parser.add_argument("--data")
    parser.add_argument("--out")
    parser.add_argument("--results")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--variants", default=",".join(MEMORY_VARIANTS))
    parser.add_argument("--modes", default=",".join(MODES))
    args, _ = parser.parse_known_args()
    if args.worker:
        worker(args)
    elif args.memory:
        memory_main(args)
    else:
        main()


if __name__ == "__main__":
    cli()

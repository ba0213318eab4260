"""GPU readiness: the training wrapper, FSDP2, the memory plan, the sweep and eval on one device.

Usage:
    python bench/gpu_check.py            # on one CUDA device (under 10 minutes on one GPU)
    python bench/gpu_check.py --cpu      # the same checks on CPU at tiny sizes (a test runs it)
    python bench/gpu_check.py --cpu --full   # the CUDA sizes on CPU (minutes)

Builds a random Llama (bf16 on disk, no download) and a corpus, then runs five checks and prints
one table (check, result, figures, tolerance, PASS/FAIL); the exit code is 1 when a check fails.

1. bf16 autocast: `train.api.train` with --freeze, --l2sp and --ema, once in float32 and once with
   `--mixed-precision bf16`: the loss at every step and the drift per layer group at the end agree
   within BF16_TOLERANCE (see there), far below what training itself changed.
2. FSDP2: `torchrun --nproc-per-node 1 surgery train ... --fsdp "full_shard auto_wrap"` (NCCL on
   CUDA, gloo on CPU) with the same strategies: sharded, the same losses and drifts as the
   float32 run within FLOAT32_TOLERANCE, frozen layers bit-identical to BASE.
3. Memory plan: `surgery train ... --dry-run --gpus 1`'s total beside the float32 run's measured
   peak, `torch.cuda.max_memory_allocated` above what was allocated before `train()`. On CPU
   there is no such counter: the peak RssAnon delta over `train()` is shown, and at tiny sizes
   the row is "not comparable" (the interpreter's and the data pipeline's own allocations
   dominate); `--cpu --full` runs the CUDA sizes on CPU and judges it.
4. Sweep in memory: `surgery sweep --in-memory` on the device (float32) against
   `--write-and-reload` on CPU in float32: the same perplexity at every alpha.
5. Eval: `surgery eval` (perplexity and Belebele-style multiple choice, one batch of 8) on the
   device in float32 against CPU float32 (accuracies equal, perplexity within FLOAT32_TOLERANCE),
   and in bfloat16 against CPU float32 (perplexity within BF16_TOLERANCE).

With --cpu the device is the CPU (CUDA is hidden before torch loads), so rows 4 and 5 compare
CPU with CPU: they still run every code path, and the bfloat16 rows still compare two dtypes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# bfloat16 keeps 8 significant bits (7 stored + 1 implicit): one rounding is off by up to 2^-8
# relative (0.39%). Autocast rounds the inputs of every matmul, which accumulates in float32, so
# a loss or a perplexity built from many such products moves by a few roundings, not by many
# (the errors are independent and partly cancel), and the float32 master weights keep the
# updates from compounding over a few steps. Four roundings: 4 * 2^-8 = 1.6% relative.
BF16_TOLERANCE = 4 * 2**-8
# float32 against float32 on another device or launcher: only the order of sums changes.
FLOAT32_TOLERANCE = 1e-4
# The measured peak over the planned total: the plan's activations are an estimate.
PLAN_TOLERANCE = 0.25


@dataclass(frozen=True)
class Sizes:
    """The model and run of one mode: tiny on CPU, large enough on CUDA that weights, optimizer
    state and activations (not allocator slack) make the memory peak."""

    hidden: int
    layers: int
    vocab: int
    block: int
    batch: int
    steps: int
    lr: float


CPU_SIZES = Sizes(hidden=64, layers=4, vocab=0, block=32, batch=2, steps=8, lr=1e-2)
GPU_SIZES = Sizes(hidden=512, layers=8, vocab=8192, block=256, batch=4, steps=20, lr=3e-3)


@dataclass
class Row:
    """One line of the table."""

    check: str
    result: str
    figures: str
    tolerance: str
    passed: bool | None  # None: shown, not judged (CPU memory at tiny sizes)
    seconds: float = 0.0

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "FAIL", None: "n/a"}[self.passed]


def relative(a: float, b: float) -> float:
    """|a - b| relative to |b| (b the reference), with a floor for values near zero."""
    return abs(a - b) / max(abs(b), 1e-12)


# ---- running the project's commands ---------------------------------------------------------


def quietly(log: Path, function: Callable, *args, **kwargs):
    """Call `function` with its stdout (the Trainer's log lines) appended to `log`."""
    with log.open("a", encoding="utf-8") as handle, contextlib.redirect_stdout(handle):
        return function(*args, **kwargs)


def surgery(*args: str) -> str:
    """Run one `surgery` command in this process; its stdout, or RuntimeError on a non-zero exit."""
    from cli import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            cli.main(list(args), prog_name="surgery")
            code = 0
        except SystemExit as stop:
            code = stop.code or 0
    if code:
        raise RuntimeError(f"surgery {' '.join(args)} exited {code}:\n{out.getvalue()[-2000:]}")
    return out.getvalue()


def write_corpus(path: Path, docs: int = 200, words: int = 60) -> Path:
    """Documents of words drawn from a small vocabulary, so a few steps visibly lower the loss."""
    from tests.support.train_helpers import WORDS

    rng = random.Random(0)
    texts = (" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(docs))
    path.write_text("\n\n".join(texts) + "\n", encoding="utf-8")
    return path


def write_choices(path: Path, rows: int = 8) -> Path:
    """Belebele-format rows (passage, question, four answers, the correct one's number)."""
    from tests.support.train_helpers import WORDS

    rng = random.Random(1)
    with path.open("w", encoding="utf-8") as handle:
        for _ in range(rows):
            row = {
                "flores_passage": " ".join(rng.choice(WORDS) for _ in range(12)),
                "question": " ".join(rng.choice(WORDS) for _ in range(4)),
                **{f"mc_answer{k}": rng.choice(WORDS) for k in range(1, 5)},
                "correct_answer_num": str(rng.randint(1, 4)),
            }
            handle.write(json.dumps(row) + "\n")
    return path


def strategies(sizes: Sizes) -> dict:
    """--freeze, --l2sp and --ema, by their command-line names (the same flags for torchrun)."""
    return {
        "freeze": "1:2",
        "l2sp": f"2:{sizes.layers}=0.05,*=0.001",
        "ema": 0.92,
        "ema_every": 2,
    }


def run_options(sizes: Sizes) -> dict:
    """Budget and schedule of every training run here (a constant rate: only numerics differ)."""
    return {
        "max_steps": sizes.steps,
        "block_size": sizes.block,
        "batch_size": sizes.batch,
        "learning_rate": sizes.lr,
        "lr_scheduler": "constant",
        "logging_steps": 1,
        "progress": False,
        "seed": 0,
        **strategies(sizes),
    }


def logged(folder: Path) -> list[dict]:
    """Per step: the loss, the L2-SP penalty and the drift per layer group."""
    history = json.loads((folder / "surgery_train.json").read_text())["log_history"]
    keep = ("loss", "l2sp_penalty")
    return [
        {k: float(v) for k, v in line.items() if k in keep or k.startswith("drift/")}
        for line in history
        if "loss" in line
    ]


def worst(a: list[dict], b: list[dict], keys: Callable[[str], bool]) -> float:
    """The largest relative difference of the chosen keys over the steps of two runs."""
    return max(relative(x[k], y[k]) for x, y in zip(a, b, strict=True) for k in y if keys(k))


class Peak:
    """The peak memory over a block: CUDA's allocator counter, or sampled RssAnon on CPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.delta = 0

    def __enter__(self) -> Peak:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.baseline = torch.cuda.memory_allocated()
        else:
            from bench.measure import _anon_bytes

            self.baseline = _anon_bytes(os.getpid())
            self.peak, self.stop = self.baseline, threading.Event()
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def _sample(self) -> None:
        from bench.measure import _anon_bytes

        while not self.stop.is_set():
            self.peak = max(self.peak, _anon_bytes(os.getpid()))
            time.sleep(0.001)

    def __exit__(self, *exc) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            self.delta = torch.cuda.max_memory_allocated() - self.baseline
        else:
            self.stop.set()
            self.thread.join()
            self.delta = self.peak - self.baseline


# ---- the checks -----------------------------------------------------------------------------


@dataclass
class Setup:
    """What every check shares: the folders, the sizes, the device."""

    root: Path
    base: Path
    corpus: Path
    choices: Path
    sizes: Sizes
    device: str  # "cuda" or "cpu"

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


def check_bf16(setup: Setup, fp32: Path) -> list[Row]:
    """bf16 autocast against the float32 run: losses per step and final drifts."""
    from train.api import train
    from train.config import TrainConfig

    bf16 = quietly(
        setup.root / "train.log",
        train,
        TrainConfig.from_options(
            base=str(setup.base),
            output=setup.root / "bf16",
            data=[str(setup.corpus)],
            mixed_precision="bf16",
            **run_options(setup.sizes),
        ),
    )
    ref, run = logged(fp32), logged(bf16)
    loss = worst(run, ref, lambda k: k == "loss")
    drift = worst(run[-1:], ref[-1:], lambda k: k.startswith("drift/"))
    # What training itself did: the check is meaningful only if this is far above the tolerance.
    fell = 1 - ref[-1]["loss"] / ref[0]["loss"]
    moved = min(v for k, v in ref[-1].items() if k.startswith("drift/") and v > 0)
    frozen = ref[-1].get("drift/layers_1")
    figures = (
        f"loss max rel diff {loss:.2e} (loss fell {fell:.0%} over {len(ref)} steps); "
        f"drift max rel diff {drift:.2e} (smallest trained drift {moved:.2e}, frozen {frozen})"
    )
    # loss > 0: autocast really ran (a float32 run would match exactly).
    ok = 0 < loss <= BF16_TOLERANCE and drift <= BF16_TOLERANCE and fell > 10 * BF16_TOLERANCE
    return [
        Row(
            "1 bf16 autocast + freeze + L2-SP + EMA",
            f"{len(run)} steps on {setup.device}, equal to float32",
            figures,
            f"rel {BF16_TOLERANCE:.4f} (4 x 2^-8)",
            ok and frozen == 0.0,
        )
    ]


def check_fsdp(setup: Setup, fp32: Path) -> list[Row]:
    """FSDP2 under torchrun with one rank: sharded, and the float32 run's numbers."""
    from safetensors.torch import load_file

    out = setup.root / "fsdp"
    options = run_options(setup.sizes)
    flags = [
        f"--{key.replace('_', '-')}={value}"
        for key, value in options.items()
        if key not in ("learning_rate", "progress")
    ]
    from tests.support.train_helpers import torchrun_train

    extra = [f"--lr={options['learning_rate']}", "-q", "--fsdp", "full_shard auto_wrap"]
    done = torchrun_train(1, setup.base, out, setup.corpus, [*flags, *extra], timeout=600)
    if done.returncode:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        return [Row("2 FSDP2, torchrun 1 rank", "failed", tail[0][:100], "-", False)]
    record = json.loads((out / "surgery_train.json").read_text())
    diff = worst(logged(out), logged(fp32), lambda k: True)
    from tests.support.train_helpers import in_layers

    before, after = {}, {}
    for shard in setup.base.glob("*.safetensors"):
        before.update(load_file(shard))
    for shard in out.glob("*.safetensors"):
        after.update(load_file(shard))
    frozen = [n for n in before if in_layers(n, {1})]
    bitwise = bool(frozen) and all(before[n].equal(after[n]) for n in frozen)
    ok = record.get("sharded") is True and diff <= FLOAT32_TOLERANCE and bitwise
    return [
        Row(
            "2 FSDP2, torchrun --nproc-per-node 1",
            f"sharded={record.get('sharded')}, world {record.get('world_size')}",
            f"loss/penalty/drift max rel diff to 1 process {diff:.2e}; "
            f"frozen layer bit-identical: {bitwise}",
            f"rel {FLOAT32_TOLERANCE:g}",
            ok,
        )
    ]


def plan_total(setup: Setup, measured_config: dict) -> float:
    """`surgery train --dry-run --gpus 1`: the DDP column's total (one process), in bytes."""
    flags = [
        f"--{key.replace('_', '-')}={value}"
        for key, value in measured_config.items()
        if key not in ("learning_rate", "progress")
    ]
    table = surgery(
        "train", str(setup.base), str(setup.root / "unused"), "--data", str(setup.corpus),
        *flags, "-q", "--dry-run", "--gpus", "1",
    )  # fmt: skip
    line = next(x for x in table.splitlines() if x.startswith("total") and "<- this run" in x)
    number, unit = line.split()[1:3]
    scale = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[unit]
    return float(number) * scale


def check_plan(setup: Setup, measured: int) -> list[Row]:
    """The dry run's total against the float32 run's measured peak."""
    planned = plan_total(setup, run_options(setup.sizes))
    ratio = measured / planned
    figures = f"plan {planned / 1e6:.1f} MB, measured {measured / 1e6:.1f} MB ({ratio:.2f}x)"
    tolerance = f"measured/plan within 1 +- {PLAN_TOLERANCE}"
    if setup.cuda:
        what = "torch.cuda.max_memory_allocated over train()"
    elif setup.sizes == GPU_SIZES:
        what = "CPU: peak RssAnon delta over train() (--full sizes)"
    else:
        what = "CPU: not comparable (peak RssAnon delta over train(); tiny sizes)"
        return [Row("3 --dry-run plan vs peak", what, figures, "-", None)]
    return [
        Row("3 --dry-run plan vs peak", what, figures, tolerance, abs(ratio - 1) <= PLAN_TOLERANCE)
    ]


def scores(rows: Sequence[dict]) -> dict[str, float]:
    """alpha/metric -> value of a sweep's rows (perplexity metrics only)."""
    return {f"{row['alpha']}/{k}": float(v) for row in rows for k, v in row.items() if "ppl" in k}


def check_sweep(setup: Setup, trained: Path) -> list[Row]:
    """An in-memory sweep on the device against write-and-reload on CPU, both float32."""
    results = {}
    for name, mode, device in (
        ("device", "--in-memory", setup.device),
        ("cpu", "--write-and-reload", "cpu"),
    ):
        out = setup.root / f"sweep-{name}"
        surgery(
            "sweep", "--alpha", "0,0.5,1", str(setup.base), str(trained), str(out),
            "-t", f"ppl:{setup.corpus}", "--no-save", mode, "--device", device,
            "--eval-dtype", "fp32", "--limit", "8", "-q",
        )  # fmt: skip
        results[name] = scores(json.loads((out / "sweep.json").read_text())["rows"])
    device, cpu = results["device"], results["cpu"]
    diff = max(relative(device[k], cpu[k]) for k in cpu)
    ppl = [v for k, v in cpu.items() if k.endswith("/ppl")]
    spread = max(ppl) / min(ppl) - 1
    return [
        Row(
            "4 sweep blended in memory",
            f"3 alphas on {setup.device} (fp32) = write-and-reload on cpu",
            f"ppl max rel diff {diff:.2e} (ppl varies {spread:.0%} over alpha)",
            f"rel {FLOAT32_TOLERANCE:g}",
            diff <= FLOAT32_TOLERANCE and set(device) == set(cpu),
        )
    ]


def evaluate(setup: Setup, model: Path, device: str, dtype: str, tag: str) -> dict[str, float]:
    """`surgery eval` of perplexity and multiple choice; metric -> value."""
    out = setup.root / f"eval-{tag}-{dtype}.json"
    surgery(
        "eval", str(model), "-t", f"ppl:{setup.corpus}", "-t", f"belebele:{setup.choices}:shots=1",
        "--device", device, "--eval-dtype", dtype, "--limit", "8", "-o", str(out), "-q",
    )  # fmt: skip
    metrics = json.loads(out.read_text())["metrics"]
    return {k: float(v) for k, v in metrics.items() if isinstance(v, float) and "stderr" not in k}


def check_eval(setup: Setup, trained: Path) -> list[Row]:
    """One eval batch on the device, float32 and bfloat16, against CPU float32."""
    cpu = evaluate(setup, trained, "cpu", "fp32", "reference")
    rows = []
    for dtype, tolerance in (("fp32", FLOAT32_TOLERANCE), ("bf16", BF16_TOLERANCE)):
        device = evaluate(setup, trained, setup.device, dtype, "device")
        ppl = [k for k in cpu if "ppl" in k or "perplexity" in k or "bits_per_byte" in k]
        acc = [k for k in cpu if k.rsplit("/", 1)[-1].startswith("acc")]
        diff = max(relative(device[k], cpu[k]) for k in ppl)
        same_acc = all(device[k] == cpu[k] for k in acc)
        figures = f"ppl metrics max rel diff {diff:.2e}; accuracies equal: {same_acc}"
        ok = diff <= tolerance and (same_acc or dtype == "bf16")
        shown = "rel 4 x 2^-8" if dtype == "bf16" else f"rel {tolerance:g}, acc equal"
        rows.append(
            Row(f"5 eval ppl + MC, {dtype}", f"on {setup.device} vs cpu fp32", figures, shown, ok)
        )
    return rows


# ---- the table ------------------------------------------------------------------------------


def table(rows: Sequence[Row]) -> str:
    """The rows as aligned text, one line per check."""
    head = ("check", "result", "figures", "tolerance", "s", "pass")
    cells = [
        head,
        *((r.check, r.result, r.figures, r.tolerance, f"{r.seconds:.0f}", r.verdict) for r in rows),
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = [" | ".join(c[i].ljust(widths[i]) for i in range(len(head))) for c in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def run_checks(setup: Setup) -> list[Row]:
    """Train the float32 reference once (measuring its peak), then every check against it."""
    from train.api import train
    from train.config import TrainConfig

    config = TrainConfig.from_options(
        base=str(setup.base),
        output=setup.root / "fp32",
        data=[str(setup.corpus)],
        **run_options(setup.sizes),
    )
    start = time.perf_counter()
    with Peak(setup.cuda) as peak:
        fp32 = quietly(setup.root / "train.log", train, config)
    reference = time.perf_counter() - start
    rows: list[Row] = []
    for check in (
        lambda: check_bf16(setup, fp32),
        lambda: check_fsdp(setup, fp32),
        lambda: check_plan(setup, peak.delta),
        lambda: check_sweep(setup, fp32),
        lambda: check_eval(setup, fp32),
    ):
        start = time.perf_counter()
        new = check()
        for row in new:
            row.seconds = (time.perf_counter() - start) / len(new)
        rows += new
    rows[0].seconds += reference  # the float32 run serves every check; counted with the first
    return rows


def build_setup(root: Path, cpu: bool, sizes: Sizes) -> Setup:
    """The base checkpoint and the data every check uses."""
    from tests.support import tiny_models

    base = tiny_models.random_llama(
        root / "base",
        hidden=sizes.hidden,
        layers=sizes.layers,
        vocab=sizes.vocab,
        heads=8 if sizes == GPU_SIZES else 4,
        kv_heads=4 if sizes == GPU_SIZES else 2,
        positions=max(512, sizes.block),
        shard_size="50MB",
    )
    corpus = write_corpus(root / "corpus.txt")
    choices = write_choices(root / "choices.jsonl")
    return Setup(root, base, corpus, choices, sizes, "cpu" if cpu else "cuda")


def main(argv: Sequence[str] | None = None) -> int:
    """Run every check, print the table; 0 when all pass, 1 when one fails, 2 without CUDA."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on CPU at tiny sizes")
    parser.add_argument(
        "--full", action="store_true", help="with --cpu: the CUDA sizes (minutes on CPU)"
    )
    parser.add_argument("--work", type=Path, help="keep the folders here (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch loads; torchrun inherits it
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    sys.path.insert(0, str(ROOT))
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("error: no CUDA device; run with --cpu for the CPU version", file=sys.stderr)
        return 2
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if args.work:
            args.work.mkdir(parents=True, exist_ok=False)
            root = args.work
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        sizes = CPU_SIZES if args.cpu and not args.full else GPU_SIZES
        rows = run_checks(build_setup(root, args.cpu, sizes))
    where = "cpu (--cpu)" if args.cpu else torch.cuda.get_device_name(0)
    print(f"gpu_check on {where}, torch {torch.__version__}")
    print(table(rows))
    failed = [r.check for r in rows if r.passed is False]
    print(f"{len(rows) - len(failed)} of {len(rows)} rows pass or are shown; "
          f"{time.perf_counter() - start:.0f} s")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

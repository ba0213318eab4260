"""`surgery demo`: train, forget, repair, measure, on a synthetic world, offline.

Read top to bottom, this is the paper's pipeline in miniature:

1. world     generate the languages and their text (surgery/demo/world.py)
2. base      pretrain a tiny Llama on the general language and Copain-style list patterns
3. train     Dense CPT (all families), five family experts, and Dense CPT with layer freezing,
             layer-range L2-SP and EMA (the training wrapper)
4. surgery   Dense-Reverted, Expert-Reverted (middle layers back to the base), Expert Soup
5. eval      perplexity on the general language, held-in and held-out family languages; Copain;
             chrF of translation from the general language (the eval wrapper)
6. report    a table like the paper's (deltas from the base), Markdown, CSV/JSON, PNG plots,
             and the drift and sweep pictures of one expert

Every stage writes into OUT_DIR and is skipped when its output is already complete, so a second
run reuses finished work.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from surgery.demo.world import FAMILIES, WorldFiles, build_languages, write_world
from surgery.diagnostics.localize import noise
from surgery.engine.output_paths import check_resumable_folder
from train.options import command_line


@dataclass(frozen=True)
class Size:
    """How big the run is: quick (about 50 s on 2 idle CPU cores) or default."""

    train_sentences: int
    eval_sentences: int
    hidden: int
    layers: int
    middle: str  # the middle layers that freezing, L2-SP and reverting address
    base_steps: int
    cpt_steps: int
    copain_n: int
    sweep_alphas: str


QUICK = Size(800, 8, 64, 6, "2:5", 250, 60, 8, "0:1:0.5")
FULL = Size(4000, 24, 128, 6, "2:5", 1500, 300, 30, "0:1:0.25")

STRATEGIES = [
    ("Base", "base"),
    ("Dense CPT", "dense"),
    ("Family experts", "expert-*"),
    ("Layer freezing", "freeze"),
    ("Layer-range L2-SP", "l2sp"),
    ("EMA", "ema"),
    ("Dense-Reverted", "dense-reverted"),
    ("Expert-Reverted", "expert-*-reverted"),
    ("Expert Soup", "soup"),
]
AXES = [
    ("gen ppl", "lower"),  # forgetting of the base language
    ("held-in ppl", "lower"),  # acquisition of the trained languages
    ("held-out ppl", "lower"),  # generalization to never-trained relatives
    ("Copain acc", "higher"),  # in-context learning
    ("chrF", "higher"),  # translation from the general language
]


def log(message: str) -> None:
    """Progress on stderr."""
    print(message, file=sys.stderr, flush=True)


class Stages:
    """Runs named stages once: a stage whose `done` check passes is skipped."""

    def __init__(self, total: int) -> None:
        self.total, self.count = total, 0

    def run(self, name: str, done: Callable[[], bool], action: Callable[[], object]) -> None:
        self.count += 1
        prefix = f"[{self.count}/{self.total}] {name}"
        if done():
            log(f"{prefix}: done before, reused")
            return
        start = time.perf_counter()
        action()
        log(f"{prefix}: {time.perf_counter() - start:.1f}s")


# --- stage 1 and 2: the world and the base model -----------------------------------------------


def _copain_lines(count: int, seed: int) -> list[str]:
    """Copain-style patterns for pretraining: runs of solved items of one task."""
    from eval.copain import TASKS, make_items

    lines = []
    for task in TASKS:
        items = make_items(task, count, seed)
        for start in range(0, count, 4):
            lines.append("\n".join(item.solved() for item in items[start : start + 4]))
    return lines


def train_tokenizer(texts: list[str], vocab: int):
    """A byte-level BPE tokenizer trained on `texts`: deterministic and offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<pad>", "<bos>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>"
    )


def init_base(world: WorldFiles, size: Size, out: Path, seed: int) -> None:
    """A randomly initialized tiny Llama and the world's tokenizer, saved as a checkpoint."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    texts = [p.read_text() for p in world.train.values()] + _copain_lines(50, 7)
    tokenizer = train_tokenizer(texts, vocab=512)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=size.hidden,
        intermediate_size=size.hidden * 3,
        num_hidden_layers=size.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)


@dataclass(frozen=True)
class TrainingRun:
    """One `surgery train` of the demo: the model it starts from (a folder under models/), its
    data, steps, learning rate and strategy options (TrainConfig fields)."""

    start: str
    data: tuple[str, ...]
    steps: int
    lr: float
    extra: tuple[tuple[str, object], ...] = ()


def training_runs(world: WorldFiles, size: Size) -> dict[str, TrainingRun]:
    """Every training run by output name, in the order the demo runs them: the base, dense CPT
    and its three strategies, then one expert per family."""
    pretrain = (f"gen={world.train['gen']}:0.6", f"copain={world.root / 'copain.txt'}:0.4")
    family_data = {
        f: tuple(f"{f[:3]}{i}={world.train[f'{f[:3]}{i}']}" for i in (1, 2)) for f in FAMILIES
    }
    dense_data = tuple(d for data in family_data.values() for d in data)
    runs = {"base": TrainingRun("base-init", pretrain, size.base_steps, 3e-3)}
    strategies = {
        "dense": (),
        "freeze": (("freeze", size.middle),),
        "l2sp": (("l2sp", f"{size.middle}=0.5,*=0.005"),),
        "ema": (("ema", 0.92),),
    }
    for name, extra in strategies.items():
        runs[name] = TrainingRun("base", dense_data, size.cpt_steps, 2e-3, extra)
    for family in FAMILIES:
        runs[f"expert-{family}"] = TrainingRun("base", family_data[family], size.cpt_steps, 2e-3)
    return runs


def train_config(models: Path, name: str, run: TrainingRun, seed: int):
    """The TrainConfig of a run (what `_train` trains and the report's command makes)."""
    from train.config import TrainConfig

    return TrainConfig(
        base=str(models / run.start),
        output=models / name,
        data=list(run.data),
        max_steps=run.steps,
        block_size=64,
        batch_size=16,
        learning_rate=run.lr,
        warmup=0.05,
        seed=seed,
        progress=True,  # the Trainer's step bar on stderr: no stage is silent for minutes
        logging_steps=max(1, run.steps // 4),
        save_steps=10**9,
        drift=False,
        shuffle_buffer=0,  # documents in file order: the README's demo table was made so
        **dict(run.extra),
    )


def _train(config) -> None:
    from train.api import train

    # The Trainer prints its log dicts on stdout even without a progress bar.
    with contextlib.redirect_stdout(io.StringIO()):
        train(config)


def _trained(folder: Path) -> Callable[[], bool]:
    return lambda: (folder / "surgery_train.json").is_file()


def _made(folder: Path) -> Callable[[], bool]:
    return lambda: (folder / "surgery_recipe.json").is_file()


# --- stage 5: scores ------------------------------------------------------------------------


def _tasks(world: WorldFiles, size: Size, targets: list[str]) -> list[str]:
    flores = [
        f"flores:{world.flores}:src=gen,tgt={t},name=chrf_{t},shots=2,max_new_tokens=40"
        for t in targets
    ]
    return [
        f"ppl:{world.gen_ppl}:name=gen",
        f"ppl:{world.heldin_ppl}:name=heldin",
        f"ppl:{world.heldout_ppl}:name=heldout",
        f"copain:n={size.copain_n},shots=3",
        *flores,
    ]


def score(model_dir: Path, tasks: list[str], out: Path, device: str) -> None:
    """Evaluate a checkpoint on the tasks and save the metrics as JSON."""
    from eval.api import evaluate, load_model

    model, tokenizer = load_model(model_dir, device=device, progress=False)
    result = evaluate(model, tokenizer, tasks, batch_size=16, progress=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


# --- stage 6: the table ----------------------------------------------------------------------


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def axes_of(metrics: dict, families: list[str]) -> dict[str, float]:
    """The five axes of one model's metrics, over the given families' languages."""
    trained = [f"{f[:3]}{i}" for f in families for i in (1, 2)]
    held_out = [f"{f[:3]}3" for f in families]
    chrf = [metrics[f"chrf_{f[:3]}1/chrf"] for f in families if f"chrf_{f[:3]}1/chrf" in metrics]
    return {
        "gen ppl": metrics["gen/gen/ppl"],
        "held-in ppl": _geomean([metrics[f"heldin/{lang}/ppl"] for lang in trained]),
        "held-out ppl": _geomean([metrics[f"heldout/{lang}/ppl"] for lang in held_out]),
        "Copain acc": metrics["copain/acc"],
        "chrF": sum(chrf) / len(chrf) if chrf else math.nan,
    }


def strategy_rows(scores: dict[str, dict]) -> list[dict]:
    """One row per strategy; expert rows average each expert on its own family."""
    rows = []
    for label, key in STRATEGIES:
        if "*" in key:
            per_family = [axes_of(scores[key.replace("*", f)], [f]) for f in FAMILIES]
            values = {axis: sum(p[axis] for p in per_family) / len(per_family) for axis, _ in AXES}
        else:
            values = axes_of(scores[key], list(FAMILIES))
        rows.append({"strategy": label, **values})
    return rows


def change(axis: str, value: float, base: float) -> str:
    """A row's change from the base, readable: perplexities as factors or percentages (they move
    by orders of magnitude), other axes as differences."""
    if not axis.endswith("ppl"):
        return f"{value - base:+.2f}"
    ratio = value / base
    if 0.5 <= ratio <= 2:
        return f"{(ratio - 1) * 100:+.0f}%"
    factor = ratio if ratio > 1 else 1 / ratio
    text = f"{factor:,.0f}" if factor >= 100 else f"{factor:.3g}"  # 3,400x, never 3.4e+03x
    return f"{text}x higher" if ratio > 1 else f"{text}x lower"


def copain_items(size: Size) -> int:
    """How many Copain items each model is scored on (every task, `copain_n` items each)."""
    from eval.copain import TASKS

    return len(TASKS) * size.copain_n


def moves(axis: str, row: dict, base: dict, items: int) -> bool:
    """Whether `row` differs from the base on `axis` by more than noise: Copain accuracy by
    more than twice the binomial standard error of the difference over `items` items (the
    quick run's 0.02 against 0.00 is one item of 56), the other axes by anything at all."""
    if axis != "Copain acc":
        return row[axis] != base[axis]
    scores = [{"copain/acc": r[axis], "copain/n": items} for r in (base, row)]
    return abs(row[axis] - base[axis]) > noise("copain/acc", *scores)


def moving_axes(rows: list[dict], items: int) -> list[tuple[str, str]]:
    """The axes on which at least one strategy differs from the base by more than noise: a
    column that cannot move (Copain in the quick run, whose base never learns it) says nothing."""
    return [(a, b) for a, b in AXES if any(moves(a, row, rows[0], items) for row in rows[1:])]


def markdown_table(rows: list[dict], axes: list[tuple[str, str]] | None = None) -> str:
    """The paper-style table: each axis with its change from the base."""
    axes = AXES if axes is None else axes
    base = rows[0]
    head = "| strategy | " + " | ".join(f"{axis} ({better} is better)" for axis, better in axes)
    lines = [head + " |", "|---|" + "---|" * len(axes)]
    for row in rows:
        cells = [
            f"{row[axis]:.2f}"
            + ("" if row is base else f" ({change(axis, row[axis], base[axis])})")
            for axis, _ in axes
        ]
        lines.append(f"| {row['strategy']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_strategies(rows: list[dict], path: Path, axes: list[tuple[str, str]]) -> list[str]:
    """One panel per axis of `axes` (those the table shows): each strategy's change from the
    base. Returns the panels' titles."""
    from surgery.diagnostics.plots import pyplot

    plt = pyplot()
    fig, panels = plt.subplots(1, len(axes), figsize=(4.2 * len(axes), 4.2), squeeze=False)
    labels = [r["strategy"] for r in rows[1:]]
    titles = []
    for ax, (axis, better) in zip(panels[0], axes, strict=True):
        base = rows[0][axis]
        if axis.endswith("ppl"):
            # Perplexities move by orders of magnitude: show the ratio to the base, log scale.
            ratios = [r[axis] / base for r in rows[1:]]
            good = [ratio < 1 for ratio in ratios]
            ax.barh(
                labels,
                [ratio - 1 for ratio in ratios],
                left=1,
                color=["tab:green" if g else "tab:red" for g in good],
            )
            ax.set_xscale("log")
            ax.axvline(1, color="black", linewidth=0.8)
            ax.set_xlabel("ratio to the base (log scale)")
        else:
            deltas = [r[axis] - base for r in rows[1:]]
            good = [(d < 0) if better == "lower" else (d > 0) for d in deltas]
            ax.barh(labels, deltas, color=["tab:green" if g else "tab:red" for g in good])
            ax.axvline(0, color="black", linewidth=0.8)
            ax.set_xlabel("change from the base")
        titles.append(f"{axis}\n({better} is better)")
        ax.set_title(titles[-1])
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("Strategies against forgetting: change from the base model (green = better)")
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return titles


# --- the pipeline ------------------------------------------------------------------------------


def run_demo(
    out_dir: str | Path, *, quick: bool = False, seed: int = 0, device: str | None = None
) -> Path:
    """Run (or resume) the whole demo into `out_dir`; returns the report's path."""
    out = Path(out_dir)
    check_resumable_folder(out)  # before the first stage writes anything
    _quiet_libraries()
    size = QUICK if quick else FULL
    models, scores_dir = out / "models", out / "scores"
    device = device or _default_device()
    stages = Stages(total=4 + len(FAMILIES) * 2 + 3 + 3 + 1 + 1)
    world_root = out / "data"
    (out / "scores").mkdir(parents=True, exist_ok=True)

    stages.run(
        "world",
        lambda: (world_root / "world.json").is_file(),
        lambda: _make_world(world_root, size, seed),
    )
    world = WorldFiles(world_root, build_languages(seed))
    stages.run(
        "base init",
        lambda: (models / "base-init" / "config.json").is_file(),
        lambda: init_base(world, size, models / "base-init", seed),
    )
    runs = training_runs(world, size)
    for name, run in runs.items():
        stages.run(
            "pretrain base" if name == "base" else f"train {name}",
            _trained(models / name),
            lambda n=name, r=run: _train(train_config(models, n, r, seed)),
        )

    _surgery(stages, models, size)
    model_names = [
        *runs,
        "dense-reverted",
        *(f"expert-{f}-reverted" for f in FAMILIES),
        "soup",
    ]
    all_targets = [f"{f[:3]}1" for f in FAMILIES]

    def score_all() -> None:
        for name in model_names:
            path = scores_dir / f"{name}.json"
            if not path.is_file():
                family = next((f for f in FAMILIES if name.startswith(f"expert-{f}")), None)
                targets = [f"{family[:3]}1"] if family else all_targets
                score(models / name, _tasks(world, size, targets), path, device)

    stages.run(
        "eval all models",
        lambda: all((scores_dir / f"{n}.json").is_file() for n in model_names),
        score_all,
    )
    scores = {n: json.loads((scores_dir / f"{n}.json").read_text())["metrics"] for n in model_names}
    rows = strategy_rows(scores)
    stages.run(
        "expert diagnostics",
        lambda: (out / "expert_sweep" / "sweep.png").is_file(),
        lambda: _diagnostics(out, models, world, size, device),
    )
    # One decision on which columns say something feeds the printed table, the plot and report.
    axes = moving_axes(rows, copain_items(size))
    report = _write_report(out, rows, size, quick, axes, demo_commands(world, size, models, seed))
    log(f"report: {report}")
    print(markdown_table(rows, axes))
    return report


def _quiet_libraries() -> None:
    """Keep the demo's output to its stage lines: no loading bars, no data-reuse warnings."""
    import logging

    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("train").setLevel(logging.ERROR)


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _make_world(root: Path, size: Size, seed: int) -> None:
    write_world(
        root, train_sentences=size.train_sentences, eval_sentences=size.eval_sentences, seed=seed
    )
    (root / "copain.txt").write_text("\n\n".join(_copain_lines(400, seed + 1000)) + "\n")
    (root / "world.json").write_text(json.dumps({"seed": seed, "size": size.__dict__}))


def _surgery(stages: Stages, models: Path, size: Size) -> None:
    from surgery.api import revert, soup

    base = models / "base"
    stages.run(
        "revert dense",
        _made(models / "dense-reverted"),
        lambda: revert(base, models / "dense", models / "dense-reverted", size.middle, quiet=True),
    )
    for family in FAMILIES:
        expert = models / f"expert-{family}"
        stages.run(
            f"revert expert-{family}",
            _made(models / f"expert-{family}-reverted"),
            lambda e=expert, f=family: revert(
                base, e, models / f"expert-{f}-reverted", size.middle, quiet=True
            ),
        )
    stages.run(
        "soup experts",
        _made(models / "soup"),
        lambda: soup([models / f"expert-{f}" for f in FAMILIES], models / "soup", quiet=True),
    )


def _diagnostics(out: Path, models: Path, world: WorldFiles, size: Size, device: str) -> None:
    """Drift and an interpolation sweep of the first family's expert."""
    from surgery.diagnostics.drift import drift, plot_drift
    from surgery.diagnostics.sweep import parse_alpha_grid, run_sweep
    from surgery.hub.resolve import open_input

    family = FAMILIES[0]
    expert = models / f"expert-{family}"
    report = drift(open_input(models / "base"), open_input(expert))
    plot_drift(report, out / "expert_drift.png", f"Drift of expert-{family} from the base")
    tasks = [
        f"ppl:{world.gen_ppl}:name=gen",
        f"ppl:{world.heldin_ppl / 'data' / (family[:3] + '1')}:name=heldin",
    ]
    run_sweep(
        models / "base",
        expert,
        out / "expert_sweep",
        parse_alpha_grid(size.sweep_alphas),
        tasks=tasks,
        save=False,
        in_memory=True,
        force=True,
        quiet=True,
        eval_options={"device": device},
    )


# What each strategy is (the commands that make its models: `demo_commands`). {middle} is the
# demo's middle layers.
EXPLAIN = {
    "Base": (
        "the tiny Llama pretrained on the general language and Copain-style patterns: the "
        "reference every other row is compared with."
    ),
    "Dense CPT": "continual pretraining of every layer on all ten trained languages at once.",
    "Family experts": (
        "one model per language family, each trained on its family's two trained languages; "
        "the row averages each expert on its own family."
    ),
    "Layer freezing": (
        "dense CPT with the middle layers `{middle}` frozen (no gradient: they stay bit-identical "
        "to the base)."
    ),
    "Layer-range L2-SP": (
        "dense CPT with an L2 pull toward the base, lambda * ||w - w0||^2, strong (0.5) on the "
        "middle layers and weak (0.005) elsewhere."
    ),
    "EMA": (
        "dense CPT where every step the weights are averaged back toward the previous ones "
        "(theta = 0.92 theta_prev + 0.08 theta_new) and training continues from the average."
    ),
    "Dense-Reverted": (
        "the dense CPT model with its middle layers `{middle}` copied back from the base after "
        "training."
    ),
    "Expert-Reverted": "each family expert with its middle layers reverted to the base.",
    "Expert Soup": "the uniform average of the five family experts.",
}


def demo_commands(world: WorldFiles, size: Size, models: Path, seed: int) -> dict[str, str]:
    """Per strategy, the `surgery` commands that make its models, with the very arguments the
    demo used (it runs the same through the Python API)."""
    runs = training_runs(world, size)

    def train(name: str) -> str:
        return shlex.join(
            ["surgery", "train", *command_line(train_config(models, name, runs[name], seed))]
        )

    def revert(trained: str) -> str:
        paths = [models / "base", models / trained, models / f"{trained}-reverted"]
        return shlex.join(["surgery", "revert", "--layers", size.middle, *map(str, paths)])

    experts = [f"expert-{f}" for f in FAMILIES]
    soup = ["surgery", "soup", *(str(models / e) for e in experts), str(models / "soup")]
    return {
        "Base": train("base"),
        "Dense CPT": train("dense"),
        "Family experts": "\n".join(map(train, experts)),
        "Layer freezing": train("freeze"),
        "Layer-range L2-SP": train("l2sp"),
        "EMA": train("ema"),
        "Dense-Reverted": revert("dense"),
        "Expert-Reverted": "\n".join(map(revert, experts)),
        "Expert Soup": shlex.join(soup),
    }


def explain(
    row: dict, base: dict, axes: list[tuple[str, str]], size: Size, commands: dict[str, str]
) -> str:
    """One paragraph: what the strategy is, what its row shows here, how to reproduce it."""
    text = f"**{row['strategy']}**: {EXPLAIN[row['strategy']].format(middle=size.middle)}"
    if row is not base:
        moves = [f"{axis} {change(axis, row[axis], base[axis])}" for axis, _ in axes]
        text += f" Here, against the base: {', '.join(moves)}."
    return f"{text}\n\n```bash\n{commands[row['strategy']]}\n```"


def _write_report(
    out: Path,
    rows: list[dict],
    size: Size,
    quick: bool,
    axes: list[tuple[str, str]],
    commands: dict[str, str],
) -> Path:
    """report.md, results.json/.csv (every axis) and strategies.png: the table and the plot show
    `axes` (see `moving_axes`), and the report says why any other axis is left out."""
    (out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    with open(out / "results.csv", "w") as handle:
        handle.write("strategy," + ",".join(axis for axis, _ in AXES) + "\n")
        for row in rows:
            handle.write(row["strategy"] + "," + ",".join(f"{row[a]:.6g}" for a, _ in AXES) + "\n")
    plot_strategies(rows, out / "strategies.png", axes)
    mode = "--quick" if quick else "default"
    dropped = [axis for axis, _ in AXES if (axis, dict(AXES)[axis]) not in axes]
    left_out = (
        f"\n{', '.join(dropped)} is left out: no model differs from the base's "
        f"{rows[0][dropped[0]]:.2f} by more than noise (twice the standard error over "
        f"{copain_items(size)} items)"
        + (
            ": the quick base is too small to learn Copain (`surgery demo` learns it)"
            if quick
            else ""
        )
        + ".\n"
        if dropped
        else ""
    )
    paragraphs = "\n\n".join(explain(row, rows[0], axes, size, commands) for row in rows)
    text = f"""# surgery demo ({mode})

Continual pretraining teaches a model new languages and makes it forget the old one. This run
shows it on a small scale: a tiny Llama ({size.layers} layers, hidden {size.hidden}) pretrained on
a synthetic general language and Copain-style list patterns, then adapted to five synthetic
language families ({", ".join(FAMILIES)}) by each strategy below. Middle layers: `{size.middle}`.

How to read the table: **gen ppl** is the general language's perplexity (forgetting: lower is
better), **held-in ppl** the trained languages' (learning), **held-out ppl** that of one
never-trained relative per family (generalization), **Copain acc** in-context learning of list
tasks, **chrF** translation from the general language. Perplexities are geometric means over
languages; expert rows average each expert on its own family. In brackets: the change from the
base, as a factor ("259x higher") or a percentage for perplexities, a difference otherwise.
{left_out}
{markdown_table(rows, axes)}

## The strategies

{paragraphs}

![strategies](strategies.png)

Drift of one expert from the base, by layer and module kind, and an interpolation sweep between
the base and that expert:

![drift](expert_drift.png)

![sweep](expert_sweep/sweep.png)
"""
    path = out / "report.md"
    path.write_text(text)
    return path

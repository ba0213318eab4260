"""`surgery demo`: train, forget, repair, measure, on a synthetic world, offline.

Read top to bottom, this is the paper's pipeline in miniature:

1. world     generate the languages and their text (demo/world.py)
2. base      pretrain a tiny Llama on the general language and Copain-style list patterns
3. train     Dense CPT (all families), five family experts, and Dense CPT with layer freezing,
             layer-range L2-SP and EMA (the training wrapper)
4. surgery   Dense-Reverted, Expert-Reverted (middle layers back to the base), Expert Soup
5. eval      every model through the world's suite (data/suite.yml: perplexity on the general
             language, held-in and held-out family languages; Copain; chrF of translation from
             the general language), one load per model (`surgery eval --suite`)
6. report    the comparison against the base (`surgery compare`: paired bootstrap intervals,
             sign tests, its report and plots in comparison/), and from its cells a table like
             the paper's, Markdown, CSV/JSON, PNG plots, the drift and sweep of one expert

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

from demo.plots import bar_extent
from demo.world import FAMILIES, WorldFiles, build_languages, write_suite, write_world
from surgery.core.devices import resolve_device
from surgery.engine.output_paths import check_resumable_folder
from train.options import command_line


@dataclass(frozen=True)
class Size:
    """How big the run is: quick (about 7 minutes on 2 CPU cores) or default."""

    train_sentences: int
    eval_sentences: int  # translation: each of dev (demonstrations) and devtest (scored)
    ppl_sentences: int  # perplexity text per language, in documents of four sentences
    hidden: int
    layers: int
    middle: str  # the middle layers that freezing, L2-SP and reverting address
    base_steps: int
    cpt_steps: int
    copain_n: int
    sweep_alphas: str
    resamples: int  # bootstrap resamples B of the comparison (few in the quick run: fast)


# 32 scored sentences and 32 perplexity documents per language: a comparison's cell needs at
# least 30 items per language to be called beyond noise (eval.study.stats.MIN_ITEMS).
QUICK = Size(800, 32, 128, 64, 6, "2:5", 250, 60, 8, "0:1:0.5", 1000)
FULL = Size(4000, 32, 160, 128, 6, "2:5", 1500, 300, 30, "0:1:0.25", 10_000)

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
    from eval.kinds.copain import TASKS, make_items

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
    data, steps, learning rate and strategy options (by their `surgery train` names)."""

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

    return TrainConfig.from_options(
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
        shuffle_buffer=0,  # documents in file order: docs/demo.md's table was made so
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


def score(model_dir: Path, suite: Path, out: Path, device: str) -> None:
    """Score a checkpoint on every unit of the demo's suite (one model load) into the results
    folder `out` (results.json and per-item samples), continuing an interrupted run."""
    from eval.study.runner import SuiteRun, run_suite

    run_suite(str(model_dir), suite, out, SuiteRun(device=device, batch_size=16))


def _scored(folder: Path) -> bool:
    results = folder / "results.json"
    return results.is_file() and json.loads(results.read_text())["complete"]


# --- stage 6: the comparison and the table ---------------------------------------------------

# The table's columns: (label, task, where its cell is in the comparison). A family expert's
# held-in, held-out and chrF cells are those of its own family ("family"), other models' the
# macro over families ("overall"); gen is a language in no family.
AXES = [
    ("gen ppl", "ppl", {"scope": "language", "lang": "gen_Latn"}),  # forgetting
    ("held-in ppl", "ppl", {"split": "held_in"}),  # acquisition of the trained languages
    ("held-out ppl", "ppl", {"split": "held_out"}),  # generalization to never-trained relatives
    ("Copain acc", "copain", {"scope": "task"}),  # in-context learning
    ("chrF", "chrf", {"split": "held_in"}),  # translation from gen into the trained languages
]
# Columns whose changes did not hold across seeds (`surgery demo --quick --seeds 3`, docs/demo.md:
# half of the chrF changes took both signs): one run's value is one draw, and the plot says so.
ONE_DRAW = ("chrF",)


@dataclass(frozen=True)
class TableRow:
    """One row of the demo's table: a strategy's model, and its family for an expert."""

    strategy: str  # the STRATEGIES label
    model: str  # the model's folder under models/ (and scores/)
    family: str | None = None

    @property
    def label(self) -> str:
        return f"{self.strategy} ({self.family})" if self.family else self.strategy


def table_rows() -> list[TableRow]:
    """The table's rows in STRATEGIES order; a strategy made per family has one row each."""
    rows = []
    for label, key in STRATEGIES:
        if "*" in key:
            rows += [TableRow(label, key.replace("*", f), f) for f in FAMILIES]
        else:
            rows.append(TableRow(label, key))
    return rows


def primary_axis(comparison, task: str) -> dict:
    """The comparison's axis of a task's primary metric (ppl, acc, chrf)."""
    return next(a for a in comparison.axes if a["task"] == task and a["primary"])


def cell(comparison, row: TableRow, column: tuple[str, str, dict]) -> dict:
    """The comparison's row (value, change from the base, 95% interval) behind one cell."""
    from eval.study.formatting import find_row

    _, task, where = column
    if "split" in where:
        where = {**where, "scope": "family", "family": row.family} if row.family else where
        where = {"scope": "overall", **where}
    found = find_row(comparison.rows, primary_axis(comparison, task), model=row.model, **where)
    if found is None:
        raise ValueError(f"no comparison row for {row.model}, {column[0]}")
    return found


def digits(comparison, task: str) -> int:
    """Digits of a column: the comparison report's."""
    from eval.study.formatting import decimals

    return decimals(primary_axis(comparison, task))


def moving_axes(comparison, rows: list[TableRow]) -> list[tuple[str, str, dict]]:
    """The columns in which some strategy's change from the base has a 95% interval that
    excludes 0 (the comparison's paired bootstrap): a column in which nothing moves beyond
    noise (Copain in the quick run, whose base never learns it) says nothing."""
    return [
        column
        for column in AXES
        if any(cell(comparison, row, column)["significant"] for row in rows[1:])
    ]


def better(comparison, task: str) -> str:
    return "higher" if primary_axis(comparison, task)["higher_is_better"] else "lower"


def markdown_table(comparison, rows: list[TableRow], axes: list[tuple[str, str, dict]]) -> str:
    """The paper-style table: each cell the value, its change from the base and the change's
    95% interval, bold where the interval excludes 0 (the comparison's cells)."""
    from eval.study.formatting import format_cell

    head = "| strategy | " + " | ".join(
        f"{label} ({better(comparison, task)} is better)" for label, task, _ in axes
    )
    lines = [head + " |", "|---|" + "---|" * len(axes)]
    for row in rows:
        cells = [
            format_cell(cell(comparison, row, column), digits(comparison, column[1]))
            for column in axes
        ]
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def strategy_panels(comparison, rows: list[TableRow], axes: list[tuple[str, str, dict]]):
    """The panels of strategies.png: per column of `axes`, every strategy's cell (the base's
    row left out)."""
    from demo.plots import Panel

    return [
        Panel(
            label,
            task,
            better(comparison, task) == "lower",
            task == "ppl",
            label not in ONE_DRAW,
            [cell(comparison, row, (label, task, where)) for row in rows[1:]],
        )
        for label, task, where in axes
    ]


def plot_strategies(
    comparison, rows: list[TableRow], path: Path, axes: list[tuple[str, str, dict]]
) -> list[str]:
    """strategies.png (demo.plots.strategies_figure), saved with the command that ran the demo
    and the plotting hash; returns the panels' titles."""
    from demo.plots import strategies_figure
    from surgery.plotting import save_figure

    fig = strategies_figure(
        [row.label for row in rows[1:]], strategy_panels(comparison, rows, axes)
    )
    titles = [ax.get_title() for ax in fig.axes]
    save_figure(fig, path)
    return titles


def run_comparison(scores_dir: Path, rows: list[TableRow], out: Path, resamples: int, seed: int):
    """`surgery compare` of every model against the base, written into `out` (report.md,
    comparison.csv/json, plots); returns the comparison."""
    from eval.study.compare import compare
    from eval.study.report import write_report

    models = list(dict.fromkeys(row.model for row in rows))
    comparison = compare(
        scores_dir / models[0], [scores_dir / m for m in models[1:]], resamples=resamples, seed=seed
    )
    out.mkdir(parents=True, exist_ok=True)
    write_report(comparison, out)
    return comparison


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
    device = resolve_device(device)
    stages = Stages(total=4 + len(FAMILIES) * 2 + 3 + 3 + 1 + 1)
    world_root = out / "data"
    (out / "scores").mkdir(parents=True, exist_ok=True)

    stages.run(
        "world",
        lambda: all((world_root / name).is_file() for name in ("world.json", "suite.yml")),
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
    rows = table_rows()
    model_names = [row.model for row in rows]

    def score_all() -> None:
        for name in model_names:
            score(models / name, world.suite, scores_dir / name, device)

    stages.run(
        "eval all models (suite)",
        lambda: all(_scored(scores_dir / n) for n in model_names),
        score_all,
    )
    stages.run(
        "expert diagnostics",
        lambda: (out / "expert_sweep" / "sweep.png").is_file(),
        lambda: _diagnostics(out, models, world, size, device),
    )
    start = time.perf_counter()
    comparison = run_comparison(scores_dir, rows, out / "comparison", size.resamples, seed)
    log(f"compare (B = {size.resamples}): {time.perf_counter() - start:.1f}s")
    # One decision on which columns say something feeds the printed table, the plot and report:
    # the comparison's intervals.
    axes = moving_axes(comparison, rows)
    commands = demo_commands(world, size, models, seed)
    report = _write_report(out, comparison, rows, size, quick, axes, commands)
    log(f"report: {report}")
    print(markdown_table(comparison, rows, axes))
    return report


def _quiet_libraries() -> None:
    """Keep the demo's output to its stage lines: no loading bars, no data-reuse warnings."""
    import logging

    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("train").setLevel(logging.ERROR)


def _make_world(root: Path, size: Size, seed: int) -> None:
    write_world(
        root,
        train_sentences=size.train_sentences,
        eval_sentences=size.eval_sentences,
        ppl_sentences=size.ppl_sentences,
        seed=seed,
    )
    (root / "copain.txt").write_text("\n\n".join(_copain_lines(400, seed + 1000)) + "\n")
    (root / "world.json").write_text(json.dumps({"seed": seed, "size": size.__dict__}))
    write_suite(WorldFiles(root, build_languages(seed)), size.copain_n)


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
    from eval.options import ScoringOptions
    from eval.scorer import TaskScorer
    from surgery.diagnostics.drift import drift, plot_drift
    from surgery.diagnostics.sweep import parse_alpha_grid, run_sweep
    from surgery.hub.resolve import open_input

    family = FAMILIES[0]
    expert = models / f"expert-{family}"
    report = drift(open_input(models / "base"), open_input(expert))
    plot_drift(report, out / "expert_drift.png", f"Drift of expert-{family} from the base")
    tasks = [
        f"ppl:{world.gen_ppl}:name=gen",
        f"ppl:{world.heldin_ppl / 'data' / (family[:3] + '1')}:name=heldin",  # a trained one
    ]
    run_sweep(
        models / "base",
        expert,
        out / "expert_sweep",
        parse_alpha_grid(size.sweep_alphas),
        scorer=TaskScorer.of(tasks, ScoringOptions(device=device)),
        save=False,
        in_memory=True,
        force=True,
        quiet=True,
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


def change(value: float, base: float, ppl: bool) -> str:
    """A change from the base in words: perplexities as factors or percentages (they move by
    orders of magnitude), other axes as differences."""
    if not ppl:
        return f"{value - base:+.2f}"
    ratio = value / base
    if 0.5 <= ratio <= 2:
        return f"{(ratio - 1) * 100:+.0f}%"
    factor = ratio if ratio > 1 else 1 / ratio
    text = f"{factor:,.0f}" if factor >= 100 else f"{factor:.3g}"  # 3,400x, never 3.4e+03x
    return f"{text}x higher" if ratio > 1 else f"{text}x lower"


def explain(
    comparison,
    strategy: str,
    rows: list[TableRow],
    axes: list[tuple[str, str, dict]],
    size: Size,
    commands: dict[str, str],
) -> str:
    """One paragraph: what the strategy is, what its rows show here (only the changes whose
    interval excludes 0), how to reproduce it."""
    text = f"**{strategy}**: {EXPLAIN[strategy].format(middle=size.middle)}"
    for row in (r for r in rows if r.strategy == strategy and r is not rows[0]):
        cells = [(column, cell(comparison, row, column)) for column in axes]
        moves = [
            f"{column[0]} {change(c['value'], c['value'] - c['delta'], column[1] == 'ppl')}"
            for column, c in cells
            if c["significant"]
        ]
        where = f" ({row.family})" if row.family else ""
        text += f" Here{where}, against the base: {', '.join(moves) or 'no change beyond noise'}."
    return f"{text}\n\n```bash\n{commands[strategy]}\n```"


def sensitive(c: dict, ppl: bool) -> bool:
    """A change beyond noise that another machine or seed could bring back within it: less
    than twice its interval's half-width from 0 (perplexity: in log ratio), or resting on too
    few items."""
    if not c["significant"]:
        return False
    length, low, high = bar_extent(c, ppl)
    if ppl:
        length, low, high = math.log(length), math.log(low), math.log(high)
    return bool(c.get("few_items")) or abs(length) < high - low


def sensitive_text(comparison, rows: list[TableRow], axes: list[tuple[str, str, dict]]) -> str:
    """The report's paragraph on which figures are sensitive, naming the cells that are beyond
    noise by a small margin."""
    names = [
        f"{row.label} · {column[0]}"
        for row in rows[1:]
        for column in axes
        if sensitive(cell(comparison, row, column), column[1] == "ppl")
    ]
    margin = (
        " Beyond noise here by a small margin (less than twice the interval's half-width from 0; "
        f"perplexity in log ratio): {'; '.join(names)}."
        if names
        else ""
    )
    return (
        "How far these figures hold: the intervals cover the scored items, not training. Each "
        "model comes from one training run, and floating-point sums differ between CPUs, which "
        "training amplifies, so another machine (or seed) prints other values. "
        "`surgery demo --quick --seeds 3` measures it: over three seeds of the quick run every "
        "perplexity change kept its side, while the base's chrF ranged from 0 to 8 and half "
        "of the chrF changes took both signs, so read the chrF column as one draw." + margin
    )


def _write_results(out: Path, comparison, rows: list[TableRow]) -> None:
    """results.json and results.csv: every column's cell of every row (value, change from the
    base, interval, whether it excludes 0, whether it rests on too few items)."""
    fields = ("value", "delta", "ci_low", "ci_high", "significant", "few_items")
    table = []
    for row in rows:
        cells = {label: cell(comparison, row, (label, t, w)) for label, t, w in AXES}
        entry = {"strategy": row.label, "model": row.model}
        table.append(entry | {a: {k: c.get(k) for k in fields} for a, c in cells.items()})
    (out / "results.json").write_text(json.dumps(table, indent=2) + "\n")
    with open(out / "results.csv", "w") as handle:
        handle.write("strategy,model,axis," + ",".join(fields) + "\n")
        for entry in table:
            for label, _, _ in AXES:
                values = [
                    "" if entry[label].get(k) is None else str(entry[label][k]) for k in fields
                ]
                handle.write(f"{entry['strategy']},{entry['model']},{label}," + ",".join(values))
                handle.write("\n")


def _write_report(
    out: Path,
    comparison,
    rows: list[TableRow],
    size: Size,
    quick: bool,
    axes: list[tuple[str, str, dict]],
    commands: dict[str, str],
) -> Path:
    """report.md, results.json/.csv (every column) and strategies.png: the table and the plot
    show `axes` (see `moving_axes`), and the report says why any other column is left out."""
    _write_results(out, comparison, rows)
    plot_strategies(comparison, rows, out / "strategies.png", axes)
    mode = "--quick" if quick else "default"
    dropped = [label for label, _, _ in AXES if label not in {a for a, _, _ in axes}]
    left_out = (
        f"\n{', '.join(dropped)} {'is' if len(dropped) == 1 else 'are'} left out: no strategy's "
        "change from the base has a 95% interval that excludes 0"
        + (
            " (the quick base is too small to learn Copain: `surgery demo` learns it)"
            if quick and "Copain acc" in dropped
            else ""
        )
        + ".\n"
        if dropped
        else ""
    )
    strategies = list(dict.fromkeys(row.strategy for row in rows))
    paragraphs = "\n\n".join(explain(comparison, s, rows, axes, size, commands) for s in strategies)
    text = f"""# surgery demo ({mode})

Continual pretraining teaches a model new languages and makes it forget the old one. This run
shows it on a small scale: a tiny Llama ({size.layers} layers, hidden {size.hidden}) pretrained on
a synthetic general language and Copain-style list patterns, then adapted to five synthetic
language families ({", ".join(FAMILIES)}) by each strategy below. Middle layers: `{size.middle}`.

Every model is scored through one suite (`data/suite.yml`, `surgery eval --suite`) and compared
with the base item by item (`surgery compare`: its full report, per family and language, with
sign tests and plots, is [comparison/report.md](comparison/report.md)).

How to read the table: **gen ppl** is the general language's perplexity (forgetting: lower is
better), **held-in ppl** the trained languages' (learning), **held-out ppl** that of one
never-trained relative per family (generalization), **Copain acc** in-context learning of list
tasks (%), **chrF** translation from the general language into the trained ones. Held-in,
held-out and chrF cells are unweighted means over languages, then over families; a family
expert's cells are those of its own family. Cells: value (change from the base [95% interval]),
a paired bootstrap over the items with B = {comparison.resamples} resamples
{"(few: the quick run) " if quick else ""}and seed {comparison.seed}; **bold**: the interval
excludes 0 (unadjusted); †: the change stays beyond noise after the Benjamini-Hochberg
correction over its comparison table; ‡: fewer than 30 items in some language, never bold (the
comparison's report explains both).
{left_out}
{markdown_table(comparison, rows, axes)}

{sensitive_text(comparison, rows, axes)}

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

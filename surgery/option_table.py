"""Every option name of the `surgery` commands, with its one meaning: the table a test walks.

Each name means one thing in every command that has it (tests/test_option_table.py walks every
command's click parameters, hidden ones and train's included, against this table). Where two
commands share a name, their declaration is one (the same help, the same default), unless the
entry allows the wording or the default to differ and says why: `--seed` seeds something
different in each command, and says what in its help.

Old spellings kept for one release are in `RENAMED`: hidden, they print one note naming the new
spelling (`surgery.options.renamed`). Data only: no click, nothing imported.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Meaning:
    """One option name's meaning across the commands.

    Attributes:
        text: what the option means, in every command that has it.
        default: the default rule.
        wording: why the help may be worded per command (empty: one help everywhere).
        worded: the commands whose help may differ (all, when `wording` names none).
        defaults: why the default may differ per command (empty: one default everywhere).
    """

    text: str
    default: str = "none"
    wording: str = ""
    worded: tuple[str, ...] = ()
    defaults: str = ""


_PER_COMMAND = "each command's help says what it acts on"

OPTIONS: dict[str, Meaning] = {
    # Where output goes, and how it is written.
    "-o": Meaning("short for --out"),
    "--out": Meaning(
        "the folder of results, reports and figures (eval without --suite: a JSON file); "
        "checkpoints the command also writes go inside it",
        "none, or a folder named after the command (localize, demo)",
        wording="each command's help lists what goes there",
        defaults="localize and demo name a folder; the others need one",
    ),
    "--force": Meaning(
        "replace an output that exists; never an input",
        "off",
        wording="train's help says when OUT is replaced (at the first save)",
        worded=("train",),
    ),
    "-q": Meaning("short for --quiet"),
    "--quiet": Meaning("no progress bar", "off"),
    "--dtype": Meaning("float dtype of the checkpoint written", "the inputs' dtypes"),
    "--max-shard-size": Meaning("largest output shard", "5GB"),
    "--push-to": Meaning("push the written checkpoint to this Hub repository"),
    "--download": Meaning("read Hub inputs as whole snapshots, not by HTTP ranges", "off"),
    # Which tensors.
    "--layers": Meaning("a layer spec of the stack the command acts on", wording=_PER_COMMAND),
    "--stack": Meaning("the layer stack a layer spec addresses", "the text/decoder stack"),
    "--modules": Meaning(
        "only these modules of the chosen layers",
        "all",
        wording="train names its layers",
        worded=("train",),
    ),
    "--attention-only": Meaning(
        "the paper's attention_only: the MLP tensors of the layers change, attention stays",
        "off",
        wording="revert takes MLPs from BASE; train regularizes them",
    ),
    "--extrapolate": Meaning("allow alphas outside [0, 1]", "off"),
    "--alpha": Meaning("the weight of TRAINED in one blend: a number, or per range"),
    "--alphas": Meaning(
        "a list or grid of alphas",
        "per command",
        wording="each command's help says what the alphas blend",
        defaults="sweep spans 0 to 1; localize reverts fully (0)",
    ),
    "--beta": Meaning("the weight of BASE in one blend (1 - alpha)"),
    "--blocks": Meaning("N near-equal blocks of layers, or slices 0:9,9:28", "4"),
    "--block-width": Meaning("consecutive blocks of this many layers"),
    "--window": Meaning("overlapping windows of this many layers"),
    "--stride": Meaning("step between windows' first layers", "1"),
    "--boundaries": Meaning("bands kept as FIRST,LAST;... layers at either end"),
    # Scoring (eval.options.ScoringOptions, declared once).
    "-t": Meaning("short for --task"),
    "--task": Meaning("an eval task string, repeatable"),
    "--suite": Meaning("a suite YAML scored instead of -t tasks"),
    "--device": Meaning(
        "where the model is scored or trained", "the accelerator when present (cuda), else cpu"
    ),
    "--threads": Meaning(
        "CPU threads the command computes with",
        "the cores free at the start, shared with other surgery commands (or SURGERY_THREADS)",
    ),
    "--eval-dtype": Meaning("dtype a model is scored in", "fp32 on cpu, bf16 otherwise"),
    "--batch-size": Meaning(
        "examples per forward pass",
        "8",
        wording="train's examples are blocks per device; eval's items, windows or prompts",
        worded=("train",),
    ),
    "--limit": Meaning("score only the first N items per task"),
    "--max-length": Meaning("longest sequence fed to the model", "the model's context"),
    "--half": Meaning("score one half (search or report) of each unit's items"),
    "--split-seed": Meaning("the seed that splits items into the search and report halves", "0"),
    "--seed": Meaning(
        "the command's random seed",
        "0",
        wording="an allowed exception: each command's help says what it seeds",
    ),
    "--eval-batch-size": Meaning("train's periodic eval: --batch-size of the scoring", "8"),
    "--eval-limit": Meaning("train's periodic eval: --limit of the scoring"),
    "--eval-seed": Meaning("train's periodic eval: --seed of the scoring", "0"),
    "--eval-max-length": Meaning("train's periodic eval: --max-length of the scoring"),
    "--resamples": Meaning(
        "bootstrap resamples",
        "per command",
        wording="compare names them B",
        defaults="compare reports once (10000); search bootstraps every point (2000)",
    ),
    # Dry runs and printing.
    "--dry-run": Meaning(
        "print what would be done and do nothing",
        "off",
        wording="push prints files and card; train its memory plan",
    ),
    "--json": Meaning("print the result as JSON instead of a table", "off"),
    # One command each.
    "--no-save": Meaning("sweep: keep no checkpoint per alpha", "off"),
    "--in-memory": Meaning("sweep: score points blended in memory", "when the model fits"),
    "--write-and-reload": Meaning("sweep: score points written and reloaded"),
    "--weights": Meaning("soup: the experts' weights", "uniform"),
    "--tokenizer-source": Meaning(
        "soup: the output tokenizer when the experts' differ (union, base or a model)",
        "one vocabulary required",
    ),
    "--mergekit-arithmetic": Meaning("merge: compute op by op as mergekit does", "off"),
    "--intermediate-dir": Meaning(
        "merge: where a multi-stage config writes its named stages", "OUT.stages beside OUT"
    ),
    "--clean": Meaning("merge: remove the intermediate results once OUT is written", "off"),
    "--rank": Meaning("extract-lora: the largest LoRA rank", "128"),
    "--max-rank": Meaning("extract-lora: mergekit's spelling of --rank", "128"),
    "--sv-epsilon": Meaning("extract-lora: drop singular values at or below this", "0"),
    "-i": Meaning("short for --include-regex"),
    "--include-regex": Meaning("extract-lora: only modules matching"),
    "-e": Meaning("short for --exclude-regex"),
    "--exclude-regex": Meaning("extract-lora: no modules matching"),
    "--embed-lora": Meaning("extract-lora: factor the embeddings too", "off"),
    "--no-embed-lora": Meaning("extract-lora: save the embeddings whole", "on"),
    "--save-module": Meaning("extract-lora: save this module whole"),
    "--skip-undecomposable": Meaning("extract-lora: leave out tensors without a 2-D weight"),
    "--distribute-scale": Meaning("extract-lora: split sqrt(S) over A and B", "on"),
    "--no-distribute-scale": Meaning("extract-lora: A = S V^T, B = U"),
    "--svd": Meaning("extract-lora: full or randomized SVD", "full"),
    "--values": Meaning("verify: also read every float tensor", "off"),
    "--private": Meaning("push: create the repository as private", "off"),
    "--revision": Meaning("push: the branch to commit to", "main"),
    "--commit-message": Meaning("push: the commit message"),
    "--csv": Meaning("drift: a CSV file of the rows"),
    "--plot": Meaning("drift: a figure file"),
    "--json-file": Meaning("drift: a JSON file of every matrix"),
    "--pair-plot": Meaning("drift: a figure file of one pair"),
    "--pair": Meaning("drift: the pair of --pair-plot", "0,1"),
    "--labels": Meaning(
        "several experts: their names, comma-separated, in the order given",
        "their folder names",
        wording="search reads each name as the expert's family in the suite",
        worded=("search",),
    ),
    "--base": Meaning("compare: the base model's results folder"),
    "--jobs": Meaning("compare: processes", "the usable CPUs"),
    "--bold": Meaning("compare: which changes are bold", "interval"),
    "--quick": Meaning("demo: a smaller run", "off"),
    "--seeds": Meaning("demo: run N times, seeds SEED..SEED+N-1"),
    "--embeddings": Meaning("search: the embeddings and head as a block of their own", "off"),
    "--step": Meaning("search: grid of the strengths", "0.05"),
    "--measure": Meaning("search: TASK[/METRIC] of learning and forgetting"),
    "--objectives": Meaning("search: more objectives"),
    "--budget": Meaning("search: a bound, repeatable"),
    "--trials": Meaning("search: trials over every worker", "50"),
    "--time": Meaning("search: stop after this long"),
    "--baseline-layers": Meaning("search: the reverted baseline's layers", "9:28 of 34"),
    "--uniform": Meaning("search: uniform-strength baselines", "0.25,0.5,0.75"),
    "--storage": Meaning("search: an optuna database URL", "DIR's journal"),
    "--sampler": Meaning("search: optuna's sampler (tpe, gp, nsga2, random)", "tpe"),
    "--prune": Meaning("search: cut short trials a budget or the frontier rules out early", "on"),
    "--no-prune": Meaning("search: score every trial on the whole search half", "off"),
    "--seed-profiles": Meaning("search: first-trial priors (lines, reverted, localize, blocks)"),
    "--write": Meaning("search: write point N as a checkpoint in DIR"),
    "--fewshot-seeds": Meaning("eval: repeat few-shot tasks per seed"),
    "--allow-missing": Meaning("eval: skip units whose data is missing", "off"),
    "--tokenizer": Meaning("eval: the tokenizer folder", "CHECKPOINT's"),
    "--log-samples": Meaning("eval: a JSONL file of every scored item"),
    "--no-prefix-cache": Meaning("eval: run every context whole", "off"),
    # train's own (train.config.TrainConfig's fields).
    "--data": Meaning("train: a data source, repeatable"),
    "--max-steps": Meaning("train: optimizer steps"),
    "--max-tokens": Meaning("train: tokens to train on"),
    "--mix-until": Meaning("train: anneal the mixture's weights until"),
    "--block-size": Meaning("train: tokens per packed block", "min(1024, context)"),
    "--grad-accum": Meaning("train: micro-batches per optimizer step", "1"),
    "--lr": Meaning("train: peak learning rate"),
    "--lr-scheduler": Meaning("train: the learning-rate schedule"),
    "--warmup": Meaning("train: warmup steps or share"),
    "--weight-decay": Meaning("train: AdamW's weight decay"),
    "--max-grad-norm": Meaning("train: gradient clipping"),
    "--freeze": Meaning("train: layers that do not train"),
    "--freeze-embeddings": Meaning("train: embeddings do not train", "off"),
    "--l2sp": Meaning("train: L2-SP pull toward BASE per layer range"),
    "--l2sp-form": Meaning("train: the form of the L2-SP penalty"),
    "--ema": Meaning("train: EMA decay toward BASE"),
    "--ema-every": Meaning("train: steps between EMA updates"),
    "--lora": Meaning("train: LoRA settings"),
    "--train-dtype": Meaning("train: the weights' dtype while training", "float32"),
    "--mixed-precision": Meaning("train: autocast compute dtype", "no"),
    "--gradient-checkpointing": Meaning("train: recompute activations", "off"),
    "--fsdp": Meaning("train: FSDP mode"),
    "--fsdp-config": Meaning("train: FSDP config file"),
    "--shuffle-buffer": Meaning("train: documents held for shuffling per source"),
    "--logging-steps": Meaning("train: steps between log lines"),
    "--save-steps": Meaning("train: steps between checkpoints"),
    "--save-total-limit": Meaning("train: checkpoints kept"),
    "--resume": Meaning("train: continue an interrupted run in OUT", "off"),
    "--keep-checkpoints": Meaning("train: keep OUT/checkpoints at the end", "off"),
    "--report-to": Meaning("train: loggers"),
    "--no-drift": Meaning("train: log no drift from BASE", "off"),
    "--drift-groups": Meaning("train: layer groups of the drift log"),
    "--eval-every": Meaning("train: score the -t tasks every N steps"),
    "--early-stopping": Meaning("train: the --eval-every metric to stop on"),
    "--patience": Meaning("train: evaluations without improvement before stopping"),
    "--early-stopping-threshold": Meaning("train: the smallest improvement that counts"),
    "--gpus": Meaning("train --dry-run: GPUs", "8"),
    "--gpu-memory": Meaning("train --dry-run: memory per GPU", "80GB"),
}

# Old spellings, for one release: (command, old) -> the new spelling.
RENAMED: dict[tuple[str, str], str] = {
    ("sweep", "OUT_DIR"): "-o/--out",
    ("sweep", "--alpha"): "--alphas",
    ("sweep", "--eval"): "-t/--task",
    ("sweep", "--dtype"): "--eval-dtype",
    ("localize", "--out-dir"): "-o/--out",
    ("localize", "--block-size"): "--block-width",
    ("localize", "--eval"): "-t/--task",
    ("localize", "--dtype"): "--eval-dtype",
    ("eval", "--eval"): "-t/--task",
    ("eval", "--dtype"): "--eval-dtype",
    ("demo", "OUT_DIR"): "-o/--out",
    ("drift", "--json"): "--json-file",
    ("train", "--dtype"): "--train-dtype",
}

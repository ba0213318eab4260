"""The training configuration: one dataclass, validated once, into a resolved plan.

`TrainConfig` holds what a user asks for, as plain values (strings for specs, so the CLI and the
Python API share one parser). `TrainConfig.validate()` checks everything that can be checked
without loading weights (paths, budgets, specs against the checkpoint's layer count, data files)
and returns a `TrainPlan`: typed values (layer lists and values, module filter, LoRA and
early-stopping specs, drift groups, a torch dtype), parsed once, of which each step of the
recipe (train/api.py) is handed the pieces it needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from surgery.core.dtypes import COMPUTE_DTYPES, parse_dtype, torch_dtype
from surgery.core.errors import OutputError, SurgeryError
from surgery.core.layers import (
    LayerValues,
    layer_groups,
    parse_layer_spec,
    parse_layer_values,
    require_modules,
)
from surgery.core.modules import ModuleFilter, parse_module_filter
from surgery.engine.output_dir import check_output
from surgery.engine.output_paths import existing_output
from train.errors import TrainConfigError
from train.limits import (
    block_size,
    check_attention_only,
    check_lambdas,
    require_attention_only_tensors,
    require_narrowed_layers,
)
from train.regularizers import L2SP_FORMS
from train.sources import DataSource, apply_mix_until, normalize_shares, parse_data_source

if TYPE_CHECKING:
    import torch

    from train.checkpoint_io import CheckpointLayout

MIXED_PRECISION = ("no", "bf16", "fp16")
CHECKPOINTS_DIR = "checkpoints"


@dataclass(frozen=True)
class LoraSpec:
    """LoRA hyperparameters; `targets` is "all-linear" or a list of module names."""

    r: int
    alpha: float
    dropout: float = 0.0
    targets: str | tuple[str, ...] = "all-linear"


@dataclass(frozen=True)
class EarlyStop:
    """Early stopping on one logged eval metric (names as logged, without `eval/`)."""

    metric: str
    greater_is_better: bool
    patience: int
    threshold: float


# Metric names (their last part) whose direction needs no `:min` or `:max`.
_HIGHER = ("acc", "acc_norm", "acc_bytes", "chrf", "chrf++", "exact_match")
_LOWER = ("ppl", "word_perplexity", "byte_perplexity", "bits_per_byte", "loss")


def parse_early_stopping(spec: str, patience: int, threshold: float) -> EarlyStop:
    """Parse `METRIC[:min|max]` (e.g. `ppl/sk/ppl`, `belebele/acc:max`).

    Raises:
        TrainConfigError: an empty metric, or no direction for a metric of unknown kind.
    """
    metric, _, mode = spec.removeprefix("eval/").partition(":")
    leaf = metric.rsplit("/", 1)[-1]
    if not metric or mode not in ("", "min", "max"):
        raise TrainConfigError(f"--early-stopping {spec!r}: give METRIC[:min|max], e.g. ppl/ppl")
    if not mode and leaf not in _HIGHER + _LOWER:
        raise TrainConfigError(
            f"--early-stopping {spec!r}: is higher or lower better? add :max or :min"
        )
    greater = mode == "max" or (not mode and leaf in _HIGHER)
    if patience < 1 or threshold < 0:
        raise TrainConfigError("--patience must be >= 1 and --early-stopping-threshold >= 0")
    return EarlyStop(metric, greater, patience, threshold)


def parse_lora(spec: str) -> LoraSpec:
    """Parse `r=16,alpha=32[,dropout=0.05][,targets=q_proj+v_proj]`; alpha defaults to r.

    Raises:
        TrainConfigError: on unknown keys, a missing or non-positive r, or bad numbers.
    """
    values: dict[str, str] = {}
    for item in (part.strip() for part in spec.split(",") if part.strip()):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in ("r", "alpha", "dropout", "targets"):
            raise TrainConfigError(
                f"--lora {spec!r}: {item!r} is not one of r=, alpha=, dropout=, targets="
            )
        values[key.strip()] = value.strip()
    try:
        r = int(values["r"])
        alpha = float(values.get("alpha", r))
        dropout = float(values.get("dropout", 0.0))
    except KeyError:
        raise TrainConfigError(f"--lora {spec!r}: r= is required, e.g. r=16,alpha=32") from None
    except ValueError as error:
        raise TrainConfigError(f"--lora {spec!r}: {error}") from None
    if r <= 0 or alpha <= 0 or not 0 <= dropout < 1:
        raise TrainConfigError(f"--lora {spec!r}: need r > 0, alpha > 0, 0 <= dropout < 1")
    targets_text = values.get("targets", "all-linear")
    targets = targets_text if targets_text == "all-linear" else tuple(targets_text.split("+"))
    return LoraSpec(r=r, alpha=alpha, dropout=dropout, targets=targets)


def cli(
    help: str = "",
    *,
    flag: str | None = None,
    metavar: str | None = None,
    multiple: bool = False,
    choices: Sequence[str] | None = None,
    argument: bool = False,
    hidden: bool = False,
) -> dict:
    """A field's command-line declaration, kept in the dataclass field's metadata.

    Args:
        help: the option's help text.
        flag: the option's name(s) when not `--field-name`, e.g. "--lr" or "-q/--quiet". For a
            bool field whose default is True, the flag turns it off (`--no-drift`).
        metavar, multiple, choices: as in click.
        argument: a positional argument (BASE, OUT), declared by the command itself.
        hidden: not on the command line (Python API only).

    Returns:
        The metadata mapping.
    """
    return {
        "cli": {
            "help": help,
            "flag": flag,
            "metavar": metavar,
            "multiple": multiple,
            "choices": tuple(choices) if choices else None,
            "argument": argument,
            "hidden": hidden,
        }
    }


@dataclass(frozen=True)
class Strategies:
    """The run's strategies against forgetting, parsed and checked against BASE's layers."""

    frozen_layers: tuple[int, ...]
    freeze_embeddings: bool
    modules: ModuleFilter | None  # narrows --freeze and --l2sp's layers to these modules
    attention_only: bool  # the paper's attention_only (see train.layer_map.LayerMap)
    l2sp: LayerValues | None
    l2sp_form: str
    ema: float | None
    ema_every: int
    lora: LoraSpec | None
    drift: bool
    drift_groups: tuple[tuple[str, tuple[int, ...]], ...]
    early_stopping: EarlyStop | None
    eval_every: int | None


@dataclass(frozen=True)
class TrainPlan:
    """A validated configuration, resolved against the base checkpoint (no weights loaded)."""

    config: TrainConfig
    output: Path
    layout: CheckpointLayout
    sources: tuple[DataSource, ...]
    strategies: Strategies
    resume_from: Path | None
    # --force without --resume: an earlier run's OUT/checkpoints are deleted when training starts.
    discard_checkpoints: bool
    dtype: torch.dtype  # the weights' dtype while training
    block_size: int

    @property
    def checkpoints_dir(self) -> Path:
        """Where the Trainer keeps its intermediate (resumable) checkpoints."""
        return self.output / CHECKPOINTS_DIR


@dataclass(frozen=True)
class _Request:
    """What `TrainConfig.validate` resolves before opening BASE, parsed into typed values."""

    output: Path
    resume_from: Path | None  # the checkpoint a resumed run continues from
    sources: tuple[DataSource, ...]
    lora: LoraSpec | None
    early_stopping: EarlyStop | None
    modules: ModuleFilter | None
    dtype: torch.dtype


@dataclass
class TrainConfig:
    """Everything `surgery train` accepts (one field per CLI option); see `validate`.

    Budget: exactly one of `max_steps` and `max_tokens`. One optimizer step consumes
    `batch_size * grad_accum * world_size` blocks of `block_size` tokens.

    Attributes:
        base: checkpoint folder or Hub id.
        output: the folder to create (must not exist, unless `resume` or `force`).
        data: `[NAME=]PATH[:SHARE]` strings (or `DataSource`s); see `parse_data_source`.
        mix_until: `[NAME=]FRACTION` curriculum limits; see `apply_mix_until`.
        freeze: layer spec of layers that get no gradient ("9:28").
        freeze_embeddings: also freeze input embeddings and output head.
        modules: narrows `freeze` and `l2sp`'s layers to these modules (surgery.core.modules).
        attention_only: the paper's `attention_only`: `l2sp` gives the MLP parameters (names
            holding mlp, gate_proj, up_proj, down_proj, fc1, fc2) no penalty in any layer and
            every other parameter its layer's lambda; `freeze` freezes only its layers' MLPs.
        l2sp: per-layer lambda spec ("9:28=0.05,*=0.001"); `*` covers the other layers and the
            tensors outside the stack (embeddings, final norm), as in the paper's code.
        l2sp_form: "sum", lambda * ||w - w0||^2 per optimizer step (the paper's code), or
            "half", the textbook lambda / 2 * ||w - w0||^2.
        ema, ema_every: alpha and eta of the weight average.
        lora: "r=16,alpha=32[,dropout=..][,targets=a+b]"; merged into full weights when saved.
        dtype: weights dtype while training; the checkpoint keeps BASE's dtypes.
        mixed_precision: "no", "bf16" or "fp16" autocast.
        drift, drift_groups: log per-group drift from BASE; groups as a layer spec list.
        fsdp, fsdp_config: transformers' `fsdp` option and a JSON file of its `fsdp_config`.
        seed, shuffle_buffer: document shuffling per source, mixture order, dropout.
        progress: show the progress bar (else plain log lines).
        force: replace an existing OUT (see `_check_output`).
        early_stopping, patience, early_stopping_threshold: stop on an `eval_every` metric
            ("ppl/sk/ppl", "belebele/acc:max") as transformers' EarlyStoppingCallback does, and
            save the best scored step's weights (`load_best_model_at_end`).
        eval_every, eval_tasks: score these eval task strings every N optimizer steps; the
            scorer itself is passed to `train.api.train` (train does not import eval), the
            strings are recorded with the run.
        extra_args: more `transformers.TrainingArguments` keywords.

    Each field's `metadata` (see `cli`) declares its command-line option; `surgery train`'s
    options are generated from them (train/options.py).
    """

    base: str = field(metadata=cli(argument=True))
    output: str | Path = field(metadata=cli(argument=True))
    data: Sequence[str | DataSource] = field(
        metadata=cli(
            "Training text: .txt, .jsonl, .jsonl.gz (a 'text' field), a folder of them, "
            "or hub:ID[#CONFIG][@SPLIT[@REVISION]]. Repeat with shares to mix sources.",
            metavar="[NAME=]PATH[:SHARE]",
            multiple=True,
        )
    )
    max_steps: int | None = field(
        default=None, metadata=cli("Optimizer steps (or give --max-tokens).")
    )
    max_tokens: int | None = field(
        default=None, metadata=cli("Token budget, rounded up to whole steps.")
    )
    mix_until: Sequence[str] = field(
        default=(),
        metadata=cli(
            "Keep a source only for this first fraction of steps (bare: the last "
            "--data source); its share goes to the others afterwards.",
            metavar="[NAME=]FRACTION",
            multiple=True,
        ),
    )
    block_size: int | None = field(
        default=None, metadata=cli("Tokens per packed block [min(1024, context)].")
    )
    batch_size: int = field(default=8, metadata=cli("Blocks per device per micro-batch."))
    grad_accum: int = field(default=1, metadata=cli("Micro-batches per optimizer step."))
    learning_rate: float = field(default=2e-5, metadata=cli("Peak learning rate.", flag="--lr"))
    lr_scheduler: str = field(default="cosine", metadata=cli("transformers scheduler name."))
    warmup: float = field(
        default=0.0, metadata=cli("Warmup steps (>= 1) or fraction of steps (< 1).")
    )
    weight_decay: float = field(default=0.0, metadata=cli("AdamW weight decay (toward zero)."))
    max_grad_norm: float = field(default=1.0, metadata=cli("Gradient clipping (0: off)."))
    freeze: str | None = field(
        default=None, metadata=cli("Layers that get no gradient, e.g. 9:28.", metavar="LAYERS")
    )
    freeze_embeddings: bool = field(default=False, metadata=cli("Also freeze embeddings and head."))
    modules: str | None = field(
        default=None,
        metadata=cli(
            "Only these modules of the --freeze and --l2sp layers: attn, mlp, or a regex on "
            "names inside a layer; the rest of those layers train as unnamed layers do.",
            metavar="MODULES",
        ),
    )
    attention_only: bool = field(
        default=False,
        metadata=cli(
            "The paper's attention_only: --l2sp gives MLP tensors (names holding mlp, "
            "gate_proj, up_proj, down_proj, fc1, fc2) no penalty in any layer, the others "
            "their layer's lambda; --freeze freezes only its layers' MLPs (attention and "
            "norms train)."
        ),
    )
    l2sp: str | None = field(
        default=None,
        metadata=cli(
            "L2-SP strength lambda toward BASE per layer, e.g. '9:28=0.05,*=0.001' "
            "(penalty lambda * ||w - w0||^2 per optimizer step, see --l2sp-form).",
            metavar="SPEC",
        ),
    )
    l2sp_form: str = field(
        default="sum",
        metadata=cli(
            "sum: lambda * ||w - w0||^2, as the paper's code; half: lambda/2 * ||w - w0||^2.",
            choices=L2SP_FORMS,
        ),
    )
    ema: float | None = field(
        default=None,
        metadata=cli(
            "Average weights: theta = ALPHA * theta_prev + (1 - ALPHA) * theta'.",
            metavar="ALPHA",
        ),
    )
    ema_every: int = field(default=1, metadata=cli("Steps between EMA averages.", metavar="ETA"))
    lora: str | None = field(
        default=None,
        metadata=cli(
            "LoRA baseline (merged when saved), e.g. "
            "r=16,alpha=32[,dropout=0.05][,targets=q_proj+v_proj].",
            metavar="r=R,alpha=A",
        ),
    )
    dtype: str = field(
        default="float32",
        metadata=cli("Weights dtype while training; the checkpoint is saved in BASE's dtype."),
    )
    mixed_precision: str = field(
        default="no", metadata=cli("Autocast compute dtype.", choices=MIXED_PRECISION)
    )
    gradient_checkpointing: bool = field(default=False, metadata=cli("Trade compute for memory."))
    fsdp: str | None = field(
        default=None,
        metadata=cli(
            "Shard weights, gradients, optimizer state, the L2-SP reference and the EMA "
            "anchor over the ranks (FSDP2), e.g. 'full_shard auto_wrap'; run under torchrun.",
            metavar="OPTIONS",
        ),
    )
    fsdp_config: str | None = field(
        default=None,
        metadata=cli("JSON file of transformers' fsdp_config settings.", metavar="PATH"),
    )
    seed: int = field(
        default=0,
        metadata=cli(
            "Shuffles the documents of each source (see --shuffle-buffer), orders the "
            "mixture's slots, seeds dropout and LoRA's initialization."
        ),
    )
    shuffle_buffer: int = field(
        default=10_000,
        metadata=cli(
            "Documents per source held for shuffling by --seed (a whole source when it "
            "has fewer; 0: file order).",
            metavar="DOCS",
        ),
    )
    logging_steps: int = field(default=10, metadata=cli("Steps between log lines."))
    save_steps: int = field(default=500, metadata=cli("Steps between resumable checkpoints."))
    save_total_limit: int | None = field(default=2, metadata=cli("Resumable checkpoints kept."))
    resume: bool = field(
        default=False,
        metadata=cli("Continue from OUT/checkpoints (an interrupted run), or start if none."),
    )
    force: bool = field(
        default=False,
        metadata=cli(
            "Replace an existing OUT (never an input) when the new checkpoint is saved; an "
            "earlier run's OUT/checkpoints are deleted at the start unless --resume."
        ),
    )
    keep_checkpoints: bool = field(
        default=False, metadata=cli("Keep OUT/checkpoints after success.")
    )
    report_to: str = field(
        default="none", metadata=cli("Trainer integrations: wandb, tensorboard...")
    )
    drift: bool = field(
        default=True, metadata=cli("Do not log drift from BASE.", flag="--no-drift")
    )
    drift_groups: str | None = field(
        default=None,
        metadata=cli(
            "Layer groups for drift logs, e.g. 0:9,9:28,28:34 [from --freeze/--l2sp, else thirds].",
            metavar="LAYERS",
        ),
    )
    progress: bool = field(default=True, metadata=cli("No progress bar.", flag="-q/--quiet"))
    eval_every: int | None = field(
        default=None,
        metadata=cli(
            "Score the -t/--task eval tasks every N optimizer steps on the model being "
            "trained; logged as eval/<metric> with the loss.",
            metavar="N",
        ),
    )
    early_stopping: str | None = field(
        default=None,
        metadata=cli(
            "Stop when this --eval-every metric has not improved for --patience scores, and "
            "save the best step's weights, e.g. ppl/sk/ppl or belebele/acc:max.",
            metavar="METRIC[:min|max]",
        ),
    )
    patience: int = field(
        default=6, metadata=cli("Scores without improvement before --early-stopping stops.")
    )
    early_stopping_threshold: float = field(
        default=0.005,
        metadata=cli("Least change that counts as an improvement for --early-stopping."),
    )
    # Given on the command line by the eval wrapper's own -t/--task option (see cli.py).
    eval_tasks: Sequence[str] = field(default=(), metadata=cli(hidden=True))
    extra_args: dict = field(default_factory=dict, metadata=cli(hidden=True))

    def validate(self) -> TrainPlan:
        """Check the request and resolve it against the base checkpoint's layout.

        Returns:
            The plan the training code runs.

        Raises:
            TrainConfigError: bad numbers, specs, data files or option combinations.
            LayerSpecError: a layer range outside the model.
            OutputError: the output exists (and this is not a resume).
            CheckpointError: the base cannot be found or read.
        """
        request = self._check_request()
        # Imported here: the checkpoint code (the engine's writer, numpy) is not needed to parse
        # the command line, and every `surgery` command imports this module for its options.
        from train.checkpoint_io import open_layout

        # From here on the request is resolved against BASE, by the engine's own parsers.
        layout = open_layout(self.base)
        stack = layout.text_stack
        frozen = tuple(parse_layer_spec(self.freeze, stack.num_layers)) if self.freeze else ()
        l2sp = parse_layer_values(self.l2sp, stack.num_layers) if self.l2sp else None
        ranges = tuple(l2sp.per_layer) if l2sp is not None else ()
        # Drift groups cut at the --freeze ranges, else the --l2sp ones, else thirds.
        groups = layer_groups(self.drift_groups, stack.num_layers, frozen or ranges)
        modules = request.modules
        for layers in (frozen, ranges) if modules is not None else ():
            if layers:  # each named range must hold a tensor that --modules selects
                require_modules(modules, layout.tensors, stack, layers)
        # Never BASE or a local data source, never inside one or holding one (even with --force);
        # a new OUT inside another checkpoint only with --force (an existing OUT: judged above).
        output = request.output
        local = [Path(s.location) for s in request.sources if not s.hub]
        check_output(output, [layout.folder, *local], force=self.force or output.exists())
        # What the parsers do not check (train/limits.py).
        if l2sp is not None:
            check_lambdas(l2sp, self.l2sp)
        require_narrowed_layers(modules, frozen or ranges)
        if self.attention_only:
            require_attention_only_tensors(layout.tensors, stack, frozen)
        block = block_size(self.block_size, layout.config)
        strategies = Strategies(
            frozen_layers=frozen,
            freeze_embeddings=self.freeze_embeddings,
            modules=modules,
            attention_only=self.attention_only,
            l2sp=l2sp,
            l2sp_form=self.l2sp_form,
            ema=self.ema,
            ema_every=self.ema_every,
            lora=request.lora,
            drift=self.drift,
            drift_groups=groups,
            early_stopping=request.early_stopping,
            eval_every=self.eval_every,
        )
        return TrainPlan(
            config=self,
            output=output,
            layout=layout,
            sources=request.sources,
            strategies=strategies,
            resume_from=request.resume_from,
            discard_checkpoints=self.force and not self.resume,
            dtype=request.dtype,
            block_size=block,
        )

    def _check_request(self) -> _Request:
        """What can be checked before BASE is opened: numbers, OUT, data, option combinations,
        and the specs that need no layer count (`--lora`, `--early-stopping`, `--modules`,
        `--dtype`), parsed once here."""
        self._check_numbers()
        output = Path(self.output)
        resume_from = _check_output(output, self.resume, self.force)
        sources = self._resolve_sources()
        lora = parse_lora(self.lora) if self.lora else None
        if lora is not None and (self.l2sp or self.ema is not None):
            raise TrainConfigError("--lora is a baseline on its own: drop --l2sp and --ema")
        if lora is not None and self.modules is not None:
            raise TrainConfigError("--modules does not apply to --lora (choose targets=...)")
        if self.attention_only:
            check_attention_only(self.modules, self.lora, self.freeze, self.l2sp)
        return _Request(
            output=output,
            resume_from=resume_from,
            sources=sources,
            lora=lora,
            early_stopping=self._early_stopping(),
            modules=parse_module_filter(self.modules) if self.modules else None,
            dtype=torch_dtype(_training_dtype(self.dtype)),
        )

    def _early_stopping(self) -> EarlyStop | None:
        if self.early_stopping is None:
            return None
        if self.eval_every is None:
            raise TrainConfigError("--early-stopping needs --eval-every N with -t TASK")
        if self.ema is not None and self.eval_every % self.ema_every:
            # Scored (and saved) steps must be averaged ones, or the best would be raw weights.
            raise TrainConfigError(
                "--early-stopping with --ema: --eval-every must be a multiple of --ema-every"
            )
        return parse_early_stopping(
            self.early_stopping, self.patience, self.early_stopping_threshold
        )

    def _check_numbers(self) -> None:
        if (self.max_steps is None) == (self.max_tokens is None):
            raise TrainConfigError("give exactly one budget: --max-steps or --max-tokens")
        positive = {
            "--max-steps": self.max_steps,
            "--max-tokens": self.max_tokens,
            "--block-size": self.block_size,
            "--batch-size": self.batch_size,
            "--grad-accum": self.grad_accum,
            "--ema-every": self.ema_every,
            "--logging-steps": self.logging_steps,
            "--save-steps": self.save_steps,
            "--eval-every": self.eval_every,
        }
        if self.shuffle_buffer < 0:
            raise TrainConfigError(f"--shuffle-buffer must be >= 0, got {self.shuffle_buffer}")
        for option, value in positive.items():
            if value is not None and value <= 0:
                raise TrainConfigError(f"{option} must be positive, got {value}")
        if self.learning_rate <= 0 or self.warmup < 0 or self.weight_decay < 0:
            raise TrainConfigError("--lr must be positive; --warmup and --weight-decay >= 0")
        if self.ema is not None and not 0 < self.ema < 1:
            raise TrainConfigError(
                f"--ema is the weight of the previous average, in (0, 1); got {self.ema}"
            )
        if self.mixed_precision not in MIXED_PRECISION:
            raise TrainConfigError(
                f"mixed precision {self.mixed_precision!r}: choose {', '.join(MIXED_PRECISION)}"
            )
        if self.l2sp_form not in L2SP_FORMS:
            raise TrainConfigError(
                f"--l2sp-form {self.l2sp_form!r}: choose {' or '.join(L2SP_FORMS)}"
            )
        if not self.data:
            raise TrainConfigError("no training data: give at least one --data")
        if (self.eval_every is None) != (not self.eval_tasks):
            raise TrainConfigError(
                "--eval-every N and -t/--task TASK go together: give both or neither"
            )

    def _resolve_sources(self) -> tuple[DataSource, ...]:
        from train.data import check_source

        parsed = [
            s if isinstance(s, DataSource) else parse_data_source(s, i)
            for i, s in enumerate(self.data)
        ]
        sources = apply_mix_until(normalize_shares(parsed), self.mix_until)
        for source in sources:
            check_source(source)
        return sources


def _training_dtype(text: str) -> str:
    """The safetensors name of a --dtype a model can train in (float32, bf16, ...)."""
    try:
        name = parse_dtype(text)
    except SurgeryError:
        name = ""
    if name not in COMPUTE_DTYPES:
        raise TrainConfigError(f"--dtype {text!r}: choose float32, bfloat16, float16 or float64")
    return name


def _check_output(output: Path, resume: bool, force: bool) -> Path | None:
    """Apply the rules for an existing OUT; with resume, return the checkpoint to continue from.

    An empty or missing OUT is always fine. Otherwise: `resume` continues from the last of
    OUT/checkpoints when OUT holds only that folder (an interrupted run); `force` allows anything
    else OUT holds, which the saved checkpoint replaces (with `resume`, OUT/checkpoints is still
    continued; without, it is discarded when training starts).

    Raises:
        OutputError: OUT is not a folder, or exists and neither option allows it.
    """
    if output.exists() and not output.is_dir():
        raise OutputError(f"output {output} exists and is not a folder")
    entries = sorted(p.name for p in output.iterdir()) if output.exists() else []
    if not entries or (force and not resume):
        return None
    if not resume:
        resume_hint = ", or --resume to continue an interrupted run"
        raise OutputError(existing_output(output, resume_hint))
    if entries != [CHECKPOINTS_DIR] and not force:
        raise OutputError(
            f"output {output} holds more than an interrupted run ({', '.join(entries[:5])}); "
            "a finished run is not resumed (--force replaces it)"
        )
    if not (output / CHECKPOINTS_DIR).is_dir():
        return None
    from transformers.trainer_utils import get_last_checkpoint

    last = get_last_checkpoint(str(output / CHECKPOINTS_DIR))
    return Path(last) if last else None

"""The training configuration: one dataclass, validated once, into a resolved plan.

`TrainConfig` holds what a user asks for, as plain values (strings for specs, so the CLI and the
Python API share one parser): the general options declared here, and each strategy's options in
one field holding its option group, declared in the strategy's module (train/strategies/).
`TrainConfig.validate()` checks everything that can be checked without loading weights (paths,
budgets, specs against the checkpoint's layer count, data files) and returns a `TrainPlan`:
typed values (the chosen strategies with their parsed settings, the module filter, the data
sources, a torch dtype), parsed once, which each step of the recipe (train/api.py) is handed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from surgery.core.dtypes import compute_dtype, torch_dtype
from surgery.core.errors import OutputError
from surgery.core.modules import ModuleFilter, parse_module_filter
from surgery.engine.output_dir import check_output
from surgery.engine.output_paths import existing_output
from train import strategies
from train.errors import TrainConfigError
from train.fields import cli, flatten, nest
from train.limits import block_size, check_attention_only
from train.sources import DataSource, normalize_shares, parse_data_source
from train.strategies import Strategies
from train.strategies.curriculum import CurriculumOptions
from train.strategies.drift import DriftOptions
from train.strategies.early_stopping import EarlyStoppingOptions
from train.strategies.ema import EMAOptions
from train.strategies.freeze import FreezeOptions
from train.strategies.l2sp import L2SPOptions
from train.strategies.lora import LoRAOptions

if TYPE_CHECKING:
    import torch

    from train.checkpoint_io import CheckpointLayout

MIXED_PRECISION = ("no", "bf16", "fp16")
CHECKPOINTS_DIR = "checkpoints"


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
    modules: ModuleFilter | None
    dtype: torch.dtype


@dataclass
class TrainConfig:
    """Everything `surgery train` accepts (one field per CLI option, or per strategy); see
    `validate`.

    Budget: exactly one of `max_steps` and `max_tokens`. One optimizer step consumes
    `batch_size * grad_accum * world_size` blocks of `block_size` tokens.

    Attributes:
        base: checkpoint folder or Hub id.
        output: the folder to create (must not exist, unless `resume` or `force`).
        data: `[NAME=]PATH[:SHARE]` strings (or `DataSource`s); see `parse_data_source`.
        modules: narrows `freeze` and `l2sp`'s layers to these modules (surgery.core.modules).
        attention_only: the paper's `attention_only`: `l2sp` gives the MLP parameters (names
            holding mlp, gate_proj, up_proj, down_proj, fc1, fc2) no penalty in any layer and
            every other parameter its layer's lambda; `freeze` freezes only its layers' MLPs.
        dtype: weights dtype while training; the checkpoint keeps BASE's dtypes.
        mixed_precision: "no", "bf16" or "fp16" autocast.
        fsdp, fsdp_config: transformers' `fsdp` option and a JSON file of its `fsdp_config`.
        seed, shuffle_buffer: document shuffling per source, mixture order, dropout.
        progress: show the progress bar (else plain log lines).
        force: replace an existing OUT (see `_check_output`).
        eval_every, eval_tasks: score these eval task strings every N optimizer steps; the
            scorer itself is passed to `train.api.train` (train does not import eval), the
            strings are recorded with the run.
        extra_args: more `transformers.TrainingArguments` keywords.
        curriculum, freeze, l2sp, ema, lora, drift, early_stopping: each strategy's options, as
            the `Options` of its module (train/strategies/) declares them, e.g.
            `l2sp=L2SPOptions(lambdas="9:28=0.05,*=0.001")`.

    Each field's `metadata` (see `train.fields.cli`) declares its command-line option, and so
    does each field of an option group; `surgery train`'s options are generated from them
    (train/options.py), in the order of the fields here.
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
    curriculum: CurriculumOptions = field(default_factory=CurriculumOptions)
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
    freeze: FreezeOptions = field(default_factory=FreezeOptions)
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
    l2sp: L2SPOptions = field(default_factory=L2SPOptions)
    ema: EMAOptions = field(default_factory=EMAOptions)
    lora: LoRAOptions = field(default_factory=LoRAOptions)
    dtype: str = field(
        default="float32",
        metadata=cli(
            "Weights dtype while training; the checkpoint is saved in BASE's dtype.",
            flag="--train-dtype",
        ),
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
    drift: DriftOptions = field(default_factory=DriftOptions)
    progress: bool = field(default=True, metadata=cli("No progress bar.", flag="-q/--quiet"))
    eval_every: int | None = field(
        default=None,
        metadata=cli(
            "Score the -t/--task eval tasks every N optimizer steps on the model being "
            "trained; logged as eval/<metric> with the loss.",
            metavar="N",
        ),
    )
    early_stopping: EarlyStoppingOptions = field(default_factory=EarlyStoppingOptions)
    # Given on the command line by the eval wrapper's own -t/--task option (see cli.py).
    eval_tasks: Sequence[str] = field(default=(), metadata=cli(hidden=True))
    extra_args: dict = field(default_factory=dict, metadata=cli(hidden=True))

    @classmethod
    def from_options(cls, **options: object) -> TrainConfig:
        """A config from values named as `surgery train` and the training record name them:
        flat, by flag (`l2sp_form="half"` for `l2sp=L2SPOptions(form="half")`).

        Raises:
            TypeError: a name that is no option.
        """
        return nest(cls, options)

    def as_options(self) -> dict:
        """Every value named as `from_options` takes them, in the order of `--help` (the
        training record's `config`)."""
        return flatten(self)

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
        # Never BASE or a local data source, never inside one or holding one (even with --force);
        # a new OUT inside another checkpoint only with --force (an existing OUT: judged above).
        output = request.output
        local = [Path(s.location) for s in request.sources if not s.hub]
        check_output(output, [layout.folder, *local], force=self.force or output.exists())
        # Each strategy's layers, checked against BASE's tensors (--modules, --attention-only).
        chosen = strategies.choose(self, layout, request.modules, self.attention_only)
        block = block_size(self.block_size, layout.config)
        return TrainPlan(
            config=self,
            output=output,
            layout=layout,
            sources=request.sources,
            strategies=chosen,
            resume_from=request.resume_from,
            discard_checkpoints=self.force and not self.resume,
            dtype=request.dtype,
            block_size=block,
        )

    def _check_request(self) -> _Request:
        """What can be checked before BASE is opened: numbers, OUT, data, each strategy's options
        that need no layer count (their `check`), `--modules` and `--train-dtype`, parsed once
        here."""
        self._check_numbers()
        output = Path(self.output)
        resume_from = _check_output(output, self.resume, self.force)
        sources = self._resolve_sources()
        if self.attention_only:
            check_attention_only(
                self.modules, self.lora.spec, self.freeze.layers, self.l2sp.lambdas
            )
        return _Request(
            output=output,
            resume_from=resume_from,
            sources=sources,
            modules=parse_module_filter(self.modules) if self.modules else None,
            dtype=torch_dtype(_training_dtype(self.dtype)),
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
        if self.mixed_precision not in MIXED_PRECISION:
            raise TrainConfigError(
                f"mixed precision {self.mixed_precision!r}: choose {', '.join(MIXED_PRECISION)}"
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
        sources = strategies.check(self, normalize_shares(parsed))
        for source in sources:
            check_source(source)
        return sources


def _training_dtype(text: str) -> str:
    """The safetensors name of a --train-dtype a model can train in (float32, bf16, ...)."""
    name = compute_dtype(text)
    if name is None:
        raise TrainConfigError(
            f"--train-dtype {text!r}: choose float32, bfloat16, float16 or float64"
        )
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

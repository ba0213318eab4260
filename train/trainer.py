"""A transformers Trainer with the wrapper's hooks: the strategies' gradients and richer logs."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from train.sharding import enable_fsdp_on_cpu


class SurgeryTrainer(Trainer):
    """`Trainer` plus the strategies' hooks and logs of tokens per second.

    The strategies (train/strategies/) bind their state to the model (`when_bound`) once the
    model's parameters are final: right after construction (one process, DDP: the Trainer has
    moved the model to its device), or, under FSDP, after accelerate has sharded the model and
    before a resumed run loads its checkpoint, in `create_scheduler` (so the L2-SP reference is
    BASE, not the resumed weights). Binding may add `gradient_hooks` and `log_hooks`.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.binders: list[Callable[[torch.nn.Module], None]] = []
        # Called with the loss scale once per optimizer step, when the data gradients are
        # complete: each adds its term to the gradients (L2-SP's penalty).
        self.gradient_hooks: list[Callable[[float], None]] = []
        # Called at each loss log: values the line carries (L2-SP's penalty, drift).
        self.log_hooks: list[Callable[[], dict[str, float]]] = []
        # Copies of BASE's weights a strategy holds, by parameter name, for others to reuse.
        self.base_copies: dict[str, torch.Tensor] = {}
        self.tokens_per_step = 0
        self.global_batch_blocks = 0
        self.held_bytes: dict[str, int] = {}
        # Values the next loss log carries (held-out scores of the same step).
        self.pending_logs: dict[str, float] = {}
        # The periodic scores of the current step (set by PeriodicEval), for `evaluate`.
        self.scores_of_step: Callable[[], dict[str, float]] | None = None
        # (time, step) of the last log; set at the first step so startup does not count.
        self._last_log: tuple[float, int] | None = None

    def create_accelerator_and_postprocess(self) -> None:
        """accelerate's setup, then FSDP on CPU when `--fsdp` asked for it (see sharding)."""
        super().create_accelerator_and_postprocess()
        enable_fsdp_on_cpu(self)

    def when_bound(self, bind: Callable[[torch.nn.Module], None]) -> None:
        """Call `bind(model)` once the model's parameters are final (see the class docstring):
        now, or under FSDP after sharding."""
        if self.is_fsdp_enabled:
            self.binders.append(bind)
        else:
            bind(self.model)

    def bind_strategies(self, model: torch.nn.Module | None = None) -> None:
        """Bind the strategies to the sharded model, once, in the order they asked."""
        binders, self.binders = self.binders, []
        for bind in binders:
            bind(model if model is not None else self.model)

    def create_scheduler(
        self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None
    ) -> torch.optim.lr_scheduler.LRScheduler:
        """Under FSDP the Trainer creates the scheduler right after accelerate has sharded the
        model (and before a resumed run loads its checkpoint): bind there."""
        if self.is_fsdp_enabled:
            self.bind_strategies()
        return super().create_scheduler(num_training_steps, optimizer)

    def training_step(
        self,
        model: torch.nn.Module,
        inputs: dict,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        """The usual step; on the last micro-batch of an optimizer step, run the gradient hooks
        (the L2-SP gradient).

        `sync_gradients` is true only on that micro-batch, after whose backward pass the data
        gradients are complete (accumulated and averaged across ranks).
        """
        if self._last_log is None:
            self._last_log = (time.perf_counter(), self.state.global_step)
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self.gradient_hooks and self.accelerator.sync_gradients:
            scaler = getattr(self.accelerator, "scaler", None)
            scale = scaler.get_scale() if scaler is not None else 1.0
            for hook in self.gradient_hooks:
                hook(scale)
        return loss

    def evaluate(
        self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        """The Trainer's evaluation (for `--early-stopping`'s best-model machinery) is the
        periodic scorer's: this step's scores (measured now if the step had none), named
        `eval_<metric>` as the Trainer expects, handed to the callbacks (EarlyStoppingCallback).
        They were logged already, as `eval/<metric>`."""
        scores = self.scores_of_step() if self.scores_of_step is not None else {}
        metrics = {f"{metric_key_prefix}_{k.removeprefix('eval/')}": v for k, v in scores.items()}
        self.control = self.callback_handler.on_evaluate(
            self.args, self.state, self.control, metrics
        )
        return metrics

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add tokens per second, the log hooks' values (L2-SP penalty, per-group drift) and the
        step's held-out scores (`pending_logs`) to training logs."""
        if "loss" in logs:
            logs.update(self.pending_logs)
            self.pending_logs.clear()
        if "loss" in logs and self._last_log is not None:
            now, step = time.perf_counter(), self.state.global_step
            last_time, last_step = self._last_log
            if now > last_time and step > last_step:
                rate = (step - last_step) * self.tokens_per_step / (now - last_time)
                logs["tokens_per_second"] = round(rate, 1)
            for hook in self.log_hooks:
                logs.update(hook())
            # Restart the clock after measuring, so the next rate excludes the logging itself.
            self._last_log = (time.perf_counter(), step)
        super().log(logs, start_time)

    def exclude_from_rate(self, seconds: float) -> None:
        """Leave `seconds` spent outside training (held-out scoring) out of tokens_per_second."""
        if self._last_log is not None:
            last_time, last_step = self._last_log
            self._last_log = (last_time + seconds, last_step)


class SkipFinalCheckpoint(TrainerCallback):
    """Cancel the Trainer's resumable checkpoint at the last step.

    The final weights are written in BASE's layout right after training, and the checkpoints
    folder is then deleted, so that save (full weights plus optimizer state) would be wasted.
    """

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs
    ) -> None:
        """Runs after DefaultFlowCallback has asked for the final save."""
        if state.global_step >= state.max_steps:
            control.should_save = False

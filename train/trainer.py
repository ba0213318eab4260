"""A transformers Trainer with the wrapper's two hooks: the L2-SP gradient and richer logs."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from train.drift import DriftMonitor
from train.regularizers import L2SP
from train.sharding import enable_fsdp_on_cpu


class SurgeryTrainer(Trainer):
    """`Trainer` plus L2-SP and logs of tokens per second, penalty and drift.

    The strategies are attached by `bind(model)` once the model's parameters are final: right
    after construction (one process, DDP: the Trainer has moved the model to its device), or,
    under FSDP, after accelerate has sharded the model and before a resumed run loads its
    checkpoint, in `create_scheduler` (so the L2-SP reference is BASE, not the resumed
    weights). `bind` sets `l2sp` (an `L2SP` or None) and `drift` (a `DriftMonitor` or None).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.l2sp: L2SP | None = None
        self.drift: DriftMonitor | None = None
        self.bind: Callable[[torch.nn.Module], None] | None = None
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

    def bind_strategies(self, model: torch.nn.Module | None = None) -> None:
        """Attach the strategies to the model as it is now (see the class docstring)."""
        if self.bind is not None:
            bind, self.bind = self.bind, None
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
        """The usual step; on the last micro-batch of an optimizer step, add the L2-SP gradient.

        `sync_gradients` is true only on that micro-batch, after whose backward pass the data
        gradients are complete (accumulated and averaged across ranks).
        """
        if self._last_log is None:
            self._last_log = (time.perf_counter(), self.state.global_step)
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self.l2sp is not None and self.accelerator.sync_gradients:
            scaler = getattr(self.accelerator, "scaler", None)
            self.l2sp.add_gradient(scale=scaler.get_scale() if scaler is not None else 1.0)
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
        """Add tokens per second, the L2-SP penalty, per-group drift and the step's held-out
        scores (`pending_logs`) to training logs."""
        if "loss" in logs:
            logs.update(self.pending_logs)
            self.pending_logs.clear()
        if "loss" in logs and self._last_log is not None:
            now, step = time.perf_counter(), self.state.global_step
            last_time, last_step = self._last_log
            if now > last_time and step > last_step:
                rate = (step - last_step) * self.tokens_per_step / (now - last_time)
                logs["tokens_per_second"] = round(rate, 1)
            if self.l2sp is not None:
                logs["l2sp_penalty"] = self.l2sp.penalty()
            if self.drift is not None:
                logs.update({k: round(v, 6) for k, v in self.drift.measure().items()})
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

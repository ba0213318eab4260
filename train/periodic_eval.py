"""Held-out scores during training (`--eval-every N -t TASK`), logged through the Trainer.

The scorer comes from above: `surgery train` builds it from the eval wrapper's tasks (cli.py),
because train sits below eval and never imports it. Here it is only a
callable `score(model, tokenizer) -> {metric: value}`.

Every rank scores (the same items on the same weights): under FSDP the forward pass gathers each
rank's shards, which needs all ranks; under DDP the other ranks would wait for rank 0 anyway.
Every rank logs, as the Trainer does with the loss; only the main process prints and reports.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from train.trainer import SurgeryTrainer

Scorer = Callable[[Any, Any], Mapping[str, float]]
PREFIX = "eval/"


class PeriodicEval(TrainerCallback):
    """Score the model being trained every `every` optimizer steps and log `eval/<metric>`.

    Added after the wrapper's other callbacks, so it scores the weights the step ends with
    (after an EMA average), the ones a save at that step would write.

    Args:
        trainer: the trainer, whose `log` records the values (log history, console, reporters),
            in the loss's line when the loss is logged at the same step.
        score: `score(model, tokenizer) -> {metric: value}`.
        every: optimizer steps between scores (global step 0 is not scored).
    """

    def __init__(self, trainer: SurgeryTrainer, score: Scorer, every: int) -> None:
        self.trainer = trainer
        self.score = score
        self.every = every
        self._last: tuple[int, dict[str, float]] = (-1, {})
        trainer.scores_of_step = self.scores_of_step

    def scores_of_step(self) -> dict[str, float]:
        """The scores of the trainer's current step: those measured at its end, else now."""
        step = self.trainer.state.global_step
        if self._last[0] != step:
            self._last = (step, self.measure())
        return self._last[1]

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs
    ) -> None:
        """At every multiple of `every`: score in eval mode without gradients, then log.

        When the loss is logged at this step too, the scores join its line (a log of their own
        now would cancel it: the Trainer logs once per step); otherwise they get their own.
        """
        if state.global_step % self.every:
            return
        start = time.perf_counter()
        metrics = self.measure()
        self._last = (state.global_step, metrics)
        # Scoring time is not training time: keep it out of the next tokens_per_second.
        self.trainer.exclude_from_rate(time.perf_counter() - start)
        if control.should_log:
            self.trainer.pending_logs.update(metrics)
        else:
            self.trainer.log(metrics)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs
    ) -> None:
        """Log scores a cancelled loss line did not take (another callback turned it off)."""
        self._flush()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs
    ) -> None:
        """As `on_step_begin`, after the last step."""
        self._flush()

    def _flush(self) -> None:
        if self.trainer.pending_logs:
            pending = dict(self.trainer.pending_logs)
            self.trainer.pending_logs.clear()
            self.trainer.log(pending)

    def measure(self) -> dict[str, float]:
        """The scores of the model as it is now, named `eval/<metric>`.

        The model stays on its device and in its dtype; dropout is off while scoring and the
        previous mode is restored after (also on an error).
        """
        import torch

        trainer = self.trainer
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                scores = self.score(model, trainer.processing_class)
        finally:
            model.train(was_training)
        return {PREFIX + name: float(value) for name, value in scores.items()}

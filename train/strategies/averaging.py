"""Weight averaging in training: every eta steps, theta = alpha * theta_prev + (1 - alpha) * theta'.

`theta_prev` is the average taken eta steps earlier (the base weights at the start), `theta'` the
weights the optimizer reached since; training continues from the average, so the optimizer's
moments carry on while the weights are pulled back. Only trainable parameters are averaged
(frozen ones never move). When the run does not end on a multiple of eta, one last average is
taken at the end, so the saved checkpoint is always an average (docs/training.md, "EMA's last
average").

Under FSDP2 the anchor is a shard: each rank averages its own parameter shards against its own
anchor shards (4 bytes per trained parameter / ranks), element for element what one process
computes, with no gather. Anchors are saved per rank with resumable checkpoints.

The mechanism of the `--ema` strategy (train/strategies/ema.py), apart because its callback
needs transformers: it is imported when training starts, not when the options are read.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from transformers import TrainerCallback

from train.sharding import any_sharded, local, shard_file

if TYPE_CHECKING:
    from torch import nn
    from transformers import TrainerControl, TrainerState, TrainingArguments

ANCHOR_FILE = "ema_anchor.safetensors"
ANCHOR_STEM = "ema_anchor"


class EMA:
    """The running average of a model's trainable parameters.

    Args:
        model: the model (its current weights become theta_0).
        alpha: weight of the previous average, in (0, 1).
        every: eta, the number of optimizer steps between averages.
    """

    def __init__(self, model: nn.Module, alpha: float, every: int) -> None:
        self.alpha = alpha
        self.every = every
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        # This rank's shard of each parameter under FSDP2, the whole tensor otherwise.
        self.anchor = {n: local(p.detach()).clone() for n, p in self.params.items()}
        self.sharded = any_sharded(model)
        self.updates = 0

    @property
    def file_name(self) -> str:
        """The anchor's file in a resumable checkpoint (one per rank when sharded)."""
        return shard_file(ANCHOR_STEM) if self.sharded else ANCHOR_FILE

    def update(self) -> None:
        """theta = alpha * anchor + (1 - alpha) * theta'; the model and the anchor take theta."""
        import torch

        with torch.no_grad():
            for name, param in self.params.items():
                anchor, weights = self.anchor[name], local(param.detach())
                anchor.mul_(self.alpha).add_(weights.to(anchor.dtype), alpha=1 - self.alpha)
                weights.copy_(anchor)
        self.updates += 1

    def save(self, path: Path) -> None:
        """Write the anchor (for resuming between two averages)."""
        from safetensors.torch import save_file

        save_file({n: t.detach().cpu().contiguous() for n, t in self.anchor.items()}, path)

    def load(self, path: Path) -> None:
        """Read an anchor written by `save`, onto the parameters' devices.

        Raises:
            TrainConfigError: the anchor's shards do not match this run's (other rank count).
        """
        from safetensors.torch import load_file

        from train.errors import TrainConfigError

        loaded = load_file(path)
        for name, anchor in self.anchor.items():
            if name not in loaded or loaded[name].shape != anchor.shape:
                raise TrainConfigError(
                    f"{path} does not match this run's EMA anchor ({name}); resume with the same "
                    "number of processes and the same --fsdp setting"
                )
            anchor.copy_(loaded[name].to(anchor.device))


class EMACallback(TrainerCallback):
    """Applies `EMA.update` after every eta-th optimizer step and saves it with checkpoints.

    `ema` is set once the model's parameters are final (after FSDP has sharded them).
    """

    def __init__(self, ema: EMA | None = None) -> None:
        self.ema = ema

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs
    ) -> None:
        """Average on every eta-th step; runs before the step's logging and saving."""
        if state.global_step % self.ema.every == 0:
            self.ema.update()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs
    ) -> None:
        """Take the last average when the run ends between two averaging steps (not when
        `--early-stopping` reloaded the best step's weights, an averaged step)."""
        reloaded = args.load_best_model_at_end and state.best_model_checkpoint is not None
        if state.global_step % self.ema.every != 0 and not reloaded:
            self.ema.update()

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs
    ) -> None:
        """Store the anchor next to the Trainer's checkpoint: on the main process, or every
        rank its own shards under FSDP."""
        if state.is_world_process_zero or self.ema.sharded:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                self.ema.save(folder / self.ema.file_name)

"""The protocol every training strategy follows, and the strategies a run has chosen.

A strategy is one module of this package (freeze.py, l2sp.py, ...): a frozen dataclass of its
typed settings that subclasses `Strategy`. It declares
- `name`: where the run's plan holds it (`plan.strategies.<name>`, None when not asked for);
- `Options`: the dataclass of its options, each field with its command-line option
  (`train.fields.cli`); `TrainConfig` holds it in one field (`config.l2sp`), whose place among
  the general fields is the options' place in `surgery train --help` and in the training record;
and overrides the hooks it needs (each does nothing here), in the order of the recipe's steps
(train/api.py):
- `check` (before BASE is opened) and `plan` (against BASE's layers): its options checked and
  parsed, once, into an instance;
- `prepare`: the model before the Trainer (frozen parameters, adapters);
- `arguments`: keywords for transformers' TrainingArguments;
- `attach`: state bound to the model's parameters, gradient and log hooks, TrainerCallbacks;
- `weights` and `record`: what is saved, and its part of the training record (and so of the
  recipe, which the model card shows);
- `summary`: its flags in the log line that names the run's strategies.

The registry (train/strategies/__init__.py) lists the strategies in the order their hooks run.
Every `surgery` command imports this package (for the options): torch, transformers and peft are
imported inside functions only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from surgery.core.layers import require_modules
from train.fields import flag_of

if TYPE_CHECKING:
    from transformers import PreTrainedModel, TrainerCallback

    from surgery.core.layers import Stack
    from surgery.core.modules import ModuleFilter
    from train.checkpoint_io import CheckpointLayout
    from train.layer_map import LayerMap
    from train.sources import DataSource
    from train.trainer import SurgeryTrainer

# A `train.config.TrainConfig`. It is built from this package's options, so this package does
# not import it; a strategy reads its own fields from it (and another's, to check a combination).
Config = Any


class Strategy:
    """A training strategy: its options, its typed settings and its part of each recipe step."""

    name: ClassVar[str]
    Options: ClassVar[type]
    # Works on the parameters themselves (reference copies, adapters): refused where DeepSpeed
    # or FSDP1 hide them.
    needs_parameters: ClassVar[bool] = False

    @classmethod
    def flag(cls) -> str:
        """Its first option's flag (`--l2sp`), by which messages name the strategy."""
        first = fields(cls.Options)[0]
        return flag_of(first.name, first.metadata)

    @classmethod
    def check(cls, config: Config, sources: tuple[DataSource, ...]) -> tuple[DataSource, ...]:
        """Before BASE is opened: check the options that need no layers.

        Args:
            config: the run's configuration.
            sources: the data sources, shares normalized.

        Returns:
            The sources, refined by a strategy that acts on the data (the curriculum limits
            some to the first steps).

        Raises:
            TrainConfigError: bad numbers, specs, or combinations of options.
        """
        return sources

    @classmethod
    def plan(cls, config: Config, layout: CheckpointLayout, chosen: Strategies) -> Strategy | None:
        """Parse the options against BASE's layers (no weights loaded), and check the layers
        they name against BASE's tensors (`chosen.require_selected`).

        Args:
            config: the run's configuration.
            layout: BASE's layout (tensor names, the text layer stack).
            chosen: the strategies planned before this one, and the layer selection.

        Returns:
            The strategy as the run applies it, or None when the options do not ask for it.

        Raises:
            TrainConfigError, LayerSpecError: specs that do not fit BASE.
        """
        return None

    @property
    def named_layers(self) -> tuple[int, ...]:
        """The layers its options name: `--modules` narrows them to its modules, and the drift
        groups are cut at them."""
        return ()

    def prepare(
        self, model: PreTrainedModel, layers: LayerMap, strategies: Strategies, stack: Stack
    ) -> PreTrainedModel:
        """The model before the Trainer is built (parameters frozen, adapters added).

        Args:
            model: the model as loaded, or as the strategies before this one left it.
            layers: its parameters' layers (before any wrapping).
            strategies: the run's strategies.
            stack: BASE's text layer stack.
        """
        return model

    def arguments(self) -> dict:
        """Keywords for transformers' TrainingArguments (they override the general ones)."""
        return {}

    def attach(
        self,
        trainer: SurgeryTrainer,
        layers: LayerMap,
        strategies: Strategies,
        resume_from: Path | None,
    ) -> list[TrainerCallback]:
        """Hook into the trainer before training starts.

        State held against the model's parameters (a reference copy, an average) is created by
        a function given to `trainer.when_bound`: it runs once the parameters are final (now,
        or after FSDP has sharded them), so it holds this rank's shards. That function may add
        `trainer.gradient_hooks`, `trainer.log_hooks` and `trainer.held_bytes` entries.

        Args:
            trainer: the run's trainer.
            layers: the model's parameters' layers (before any wrapping).
            strategies: the run's strategies.
            resume_from: the checkpoint a resumed run continues from.

        Returns:
            TrainerCallbacks, run before the periodic scores and the caller's callbacks.
        """
        return []

    def weights(
        self, model: PreTrainedModel, state_dict: dict | None, main: bool
    ) -> tuple[PreTrainedModel, dict | None]:
        """The model and the state dict to save (LoRA merges its adapters here).

        Args:
            model: the trained model, unwrapped.
            state_dict: its full state dict gathered from FSDP shards (empty off the main
                process), or None without FSDP (then taken from the returned model).
            main: whether this is the main process.
        """
        return model, state_dict

    def record(self, trainer: SurgeryTrainer) -> dict:
        """Its entries in the training record (surgery_train.json), and so in the recipe."""
        return {}

    @classmethod
    def summary(cls, config: Config) -> list[str]:
        """Its flags and values in the log line that names the run's strategies."""
        return []


@dataclass(frozen=True)
class Strategies:
    """The strategies a run applies, in registry order, and the layer selection they share.

    `strategies.<name>` is the registered strategy of that name, or None when the run does not
    use it (`plan.strategies.l2sp`); iterating gives the chosen ones in the order of the hooks.
    """

    chosen: tuple[Strategy, ...]
    names: frozenset[str]  # every registered strategy's name
    modules: ModuleFilter | None  # narrows the layers the strategies name to these modules
    attention_only: bool  # the paper's attention_only (see train.layer_map.LayerMap)

    def __iter__(self) -> Iterator[Strategy]:
        return iter(self.chosen)

    def __getattr__(self, name: str) -> Strategy | None:
        # Called only for what is not an attribute: a registered strategy's name.
        if name not in self.__dict__.get("names", ()):
            raise AttributeError(f"no strategy named {name!r}")
        return next((s for s in self.chosen if s.name == name), None)

    def arguments(self) -> dict:
        """The chosen strategies' keywords for TrainingArguments (their `arguments`), merged in
        registry order."""
        merged: dict = {}
        for strategy in self.chosen:
            merged.update(strategy.arguments())
        return merged

    def weights(
        self, model: PreTrainedModel, state_dict: dict | None, main: bool
    ) -> tuple[PreTrainedModel, dict | None]:
        """The model and state dict to save, each chosen strategy's `weights` applied in
        registry order (LoRA merges its adapters)."""
        for strategy in self.chosen:
            model, state_dict = strategy.weights(model, state_dict, main)
        return model, state_dict

    def adding(self, strategy: Strategy) -> Strategies:
        """These strategies and `strategy` after them."""
        return replace(self, chosen=(*self.chosen, strategy))

    def require_selected(self, layers: Sequence[int], layout: CheckpointLayout) -> None:
        """Refuse layers a strategy's options name (its `named_layers`, checked by its `plan`)
        where `--modules` selects no tensor of BASE.

        Raises:
            LayerSpecError: a named layer without a tensor that `--modules` selects.
        """
        if self.modules is not None and layers:
            require_modules(self.modules, layout.tensors, layout.text_stack, layers)

    @property
    def named_layers(self) -> tuple[int, ...]:
        """The layers named by the first strategy that names any (--freeze's, else --l2sp's)."""
        return next((s.named_layers for s in self.chosen if s.named_layers), ())

    @property
    def frozen_layers(self) -> tuple[int, ...]:
        """The layers --freeze keeps bit-identical (LoRA puts no adapters there)."""
        return self.freeze.layers if self.freeze is not None else ()

    @property
    def drift_groups(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """The drift log's layer groups (none with --no-drift)."""
        return self.drift.groups if self.drift is not None else ()

"""BASE's layout for training, loading it for training, and saving in the same layout.

The saved checkpoint must line up with BASE tensor for tensor (same names, shapes, dtypes, and
the same shard files), because the surgery engine refuses anything else. So training does not
use `save_pretrained`: it saves through the engine, with a plan that keeps BASE's shard layout
and writes, for each tensor, the trained value rounded once to BASE's dtype, or BASE's own bytes
for tensors that were not trained (a vision tower). The engine's staged writer builds the output
beside OUT and renames it into place, so an interrupted save leaves no half-written checkpoint.

Gemma-3 multimodal checkpoints keep the language model under `language_model.model.` on disk.
Only the language model is loaded (into the text-only class, with a key mapping) and trained;
everything else is copied verbatim from BASE.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from surgery.api import card_file
from surgery.core.errors import CheckpointError, MismatchError
from surgery.core.layers import Stack, select_stack
from surgery.engine.plan import OutputTensor, Plan, copy_of, from_memory
from surgery.engine.reader import TRAIN_RECORD, Checkpoint, TensorInfo
from surgery.engine.recipe import make_recipe
from surgery.engine.writer import execute
from surgery.hub.resolve import open_local

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class CheckpointLayout:
    """What BASE holds on disk (its headers, read by the engine's reader) and its config."""

    checkpoint: Checkpoint
    config: Mapping
    text_stack: Stack

    @property
    def folder(self) -> Path:
        """BASE's local folder (a Hub id's snapshot)."""
        return self.checkpoint.path

    @property
    def tensors(self) -> Mapping[str, TensorInfo]:
        """BASE's tensors by name, in on-disk order."""
        return self.checkpoint.tensors

    @cached_property
    def shards(self) -> dict[str, tuple[str, ...]]:
        """Shard file name -> names of the tensors it holds, in on-disk order."""
        return {s.path.name: tuple(t.name for t in s.tensors) for s in self.checkpoint.shards}

    @property
    def multimodal(self) -> bool:
        """True for a vision-language checkpoint whose language model is trained alone."""
        return "text_config" in self.config and "vision_config" in self.config

    def language_model_prefixes(self) -> tuple[str, str]:
        """On-disk prefixes of the language model body and head of a multimodal checkpoint.

        `language_model.model.layers` gives ("language_model.model.", "language_model.lm_head.");
        the newer `model.language_model.layers` gives ("model.language_model.", "lm_head.").
        """
        parts = self.text_stack.prefix.split(".")[:-1]
        body = ".".join(parts) + "."
        candidates = []
        if parts and parts[-1] == "model" and len(parts) > 1:
            candidates.append(".".join(parts[:-1]) + ".lm_head.")
        candidates.append("lm_head.")
        present = [c for c in candidates if any(n.startswith(c) for n in self.tensors)]
        return body, (present or candidates)[0]

    def trained_scope(self, name: str) -> bool:
        """Whether a BASE tensor belongs to what training loads (and so must be written back)."""
        if not self.multimodal:
            return True
        return name.startswith(self.language_model_prefixes())


def open_layout(base: str | Path) -> CheckpointLayout:
    """Open BASE (a local folder or a Hub id) with the engine's reader; no tensor data is read.

    Raises:
        CheckpointError: not found or not downloadable, no config.json, or unreadable weights.
    """
    checkpoint = open_local(base)  # from_pretrained reads whole local files
    config_path = checkpoint.path / "config.json"
    if checkpoint.folder is None or not config_path.is_file():
        raise CheckpointError(f"{base} has no config.json; is it a Hugging Face checkpoint folder?")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{config_path}: unreadable ({error})") from None
    return CheckpointLayout(checkpoint, config, select_stack(checkpoint.stacks))


def text_only_key_mapping(layout: CheckpointLayout) -> dict[str, str]:
    """Regexes mapping a multimodal checkpoint's language-model keys onto the text-only class."""
    body, head = layout.language_model_prefixes()
    return {f"^{re.escape(body)}": "model.", f"^{re.escape(head)}": "lm_head."}


@contextlib.contextmanager
def _loading_bar(progress: bool) -> Iterator[None]:
    """transformers' weight-loading bar, hidden when progress is off (`train -q`)."""
    from transformers.utils import logging as hf_logging

    hidden = not progress and hf_logging.is_progress_bar_enabled()
    if hidden:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if hidden:
            hf_logging.enable_progress_bar()


def load_for_training(
    layout: CheckpointLayout, dtype: torch.dtype, *, progress: bool = True
) -> PreTrainedModel:
    """Load BASE's causal language model in `dtype`, refusing any silently random weight
    (transformers' loading bar only with `progress`).

    A multimodal checkpoint loads its language model only, into the text-only class, with
    its on-disk prefixes mapped to the class's `model.` and `lm_head.`.

    Raises:
        CheckpointError: not a causal LM, or weights missing or mismatched after loading.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs: dict = {"dtype": dtype, "output_loading_info": True}
    # Never run code shipped with a checkpoint; weights only from safetensors.
    kwargs |= {"trust_remote_code": False, "use_safetensors": True}
    if layout.multimodal:
        config = AutoConfig.from_pretrained(layout.folder, trust_remote_code=False)
        kwargs["config"] = config.get_text_config()
        kwargs["key_mapping"] = text_only_key_mapping(layout)
    try:
        with _loading_bar(progress):
            model, info = AutoModelForCausalLM.from_pretrained(layout.folder, **kwargs)
    except ValueError as error:
        raise CheckpointError(f"{layout.folder} is not a causal language model: {error}") from None
    bad = sorted(info.get("missing_keys", ())) + sorted(str(k) for k in info["mismatched_keys"])
    if bad:
        raise CheckpointError(
            f"loading {layout.folder} left {len(bad)} weights randomly initialized or mismatched "
            f"(e.g. {bad[0]}): the checkpoint's key layout is not mapped onto the model class"
        )
    # Fail now, not after hours of training, if the trained weights cannot be written back.
    to_base_layout(model, model.state_dict(), layout)
    return model


def _on_disk_names(
    model: PreTrainedModel, state_dict: Mapping[str, torch.Tensor], layout: CheckpointLayout
) -> dict[str, torch.Tensor]:
    if layout.multimodal:
        body, head = layout.language_model_prefixes()
        renamed = {}
        for name, tensor in state_dict.items():
            if name.startswith("model."):
                renamed[body + name[len("model.") :]] = tensor
            elif name.startswith("lm_head."):
                renamed[head + name[len("lm_head.") :]] = tensor
            else:
                renamed[name] = tensor
        return renamed
    # transformers renames some checkpoints' keys on load; its own inverse gives disk names back.
    from transformers.core_model_loading import revert_weight_conversion

    return dict(revert_weight_conversion(model, dict(state_dict)))


def _is_tied_copy(tensor: torch.Tensor, kept: Mapping[str, torch.Tensor]) -> bool:
    """A tensor BASE does not store because it is tied to one it does (e.g. lm_head)."""
    import torch

    return any(
        other.shape == tensor.shape
        and (other.data_ptr() == tensor.data_ptr() or torch.equal(other, tensor))
        for other in kept.values()
    )


def to_base_layout(
    model: PreTrainedModel, state_dict: Mapping[str, torch.Tensor], layout: CheckpointLayout
) -> dict[str, torch.Tensor]:
    """Rename a trained state dict to BASE's on-disk names and check it lines up with BASE.

    Args:
        model: the (unwrapped) model the state dict comes from; its load-time key conversions
            are reverted.
        state_dict: full, unsharded tensors by the model's parameter names.
        layout: BASE's layout.

    Returns:
        Tensors by BASE name, covering every BASE tensor in the trained scope.

    Raises:
        MismatchError: a tensor BASE does not have, a shape that differs, or a BASE tensor in
            the trained scope that the model does not produce.
    """
    renamed = _on_disk_names(model, state_dict, layout)
    kept = {name: t for name, t in renamed.items() if name in layout.tensors}
    for name, tensor in renamed.items():
        if name not in kept and not _is_tied_copy(tensor, kept):
            raise MismatchError(f"the trained model has a tensor {name!r} that BASE does not")
    for name, tensor in kept.items():
        if tuple(tensor.shape) != layout.tensors[name].shape:
            raise MismatchError(
                f"{name}: trained shape {tuple(tensor.shape)} != BASE {layout.tensors[name].shape}"
            )
    missing = [n for n in layout.tensors if layout.trained_scope(n) and n not in kept]
    if missing:
        raise MismatchError(
            f"the model does not produce {len(missing)} BASE tensors (e.g. {missing[0]!r})"
        )
    return kept


def plan_checkpoint(
    layout: CheckpointLayout, tensors: Mapping[str, torch.Tensor], record: Mapping
) -> Plan:
    """The engine plan of a training output: BASE's shards, names and dtypes.

    Args:
        layout: BASE's layout.
        tensors: trained tensors by BASE name (any float dtype, any device), each rounded once
            to BASE's dtype as it is written; BASE tensors not in it are byte copies of BASE.
        record: the training record; the recipe keeps all of it but the log history.
    """
    outputs: list[OutputTensor] = [
        copy_of(info) if name not in tensors else from_memory(name, tensors[name], info.dtype)
        for name, info in layout.tensors.items()
    ]
    # JSON round trip: paths and other objects in the config become strings, as in the record.
    summary = json.loads(json.dumps(dict(record), default=str))
    summary.pop("log_history", None)
    base = layout.checkpoint
    recipe = make_recipe("train", [("base", base)], **summary)
    return Plan(
        "train", outputs, recipe, files_from=base, inputs=[base], shards=dict(layout.shards)
    )


def write_checkpoint(
    out: Path,
    layout: CheckpointLayout,
    tensors: Mapping[str, torch.Tensor],
    record: Mapping,
    *,
    carry: Sequence[str] = (),
    replace: bool | None = None,
    quiet: bool = True,
) -> Path:
    """Write the trained checkpoint with the engine's staged writer: nothing appears at `out`
    until the whole checkpoint is written.

    Args:
        out: the output folder; an existing one (the Trainer's resumable checkpoints) is replaced.
        layout: BASE's layout; config, tokenizer and other small files are copied from BASE.
        tensors: trained tensors by BASE name; see `plan_checkpoint`.
        record: JSON-ready training record, written as `surgery_train.json`.
        carry: entries of an existing `out` kept in the new one.
        replace: whether an existing `out` may be replaced (--force); default: only an `out`
            that existed when the save began (the run's own checkpoints).
        quiet: no progress bar.

    Returns:
        The output folder, which also holds `surgery_recipe.json` and a model card.
    """
    plan = plan_checkpoint(layout, tensors, record)
    # The model card as every surgery output has one (keeping BASE's license).
    files = {TRAIN_RECORD: json.dumps(record, indent=2, default=str) + "\n"}
    files |= card_file(plan, Path(out))
    return execute(plan, Path(out), quiet=quiet, extra_files=files, carry=carry, replace=replace)

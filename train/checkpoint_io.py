"""Reading the base checkpoint's layout, loading it for training, saving in the same layout.

The saved checkpoint must line up with BASE tensor for tensor (same names, shapes, dtypes, and
the same shard files), because the surgery engine refuses anything else. So the writer does not
use `save_pretrained`: it walks BASE's shards and writes, for each tensor, the trained value cast
to BASE's dtype, or BASE's own bytes for tensors that were not trained (a vision tower).

Gemma-3 multimodal checkpoints keep the language model under `language_model.model.` on disk.
Only the language model is loaded (into the text-only class, with a key mapping) and trained;
everything else is copied verbatim from BASE.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from surgery.core.errors import CheckpointError, MismatchError
from surgery.core.layers import Stack, find_stacks, select_stack

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Files of BASE that are weights (rewritten) or would mislead next to new weights (model card).
_NOT_COPIED = re.compile(r".*\.(safetensors|bin|pt|pth|h5|msgpack|gguf|ckpt|md)$|.*\.index\.json$")
_HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's safetensors dtype string (e.g. "BF16") and shape."""

    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class CheckpointLayout:
    """What BASE holds on disk: shards, tensor names, dtypes, shapes, and its config."""

    folder: Path
    shards: Mapping[str, tuple[str, ...]]
    tensors: Mapping[str, TensorInfo]
    config: Mapping
    text_stack: Stack

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


_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}


def torch_dtype(safetensors_dtype: str) -> torch.dtype:
    """The torch dtype of a safetensors dtype string ("BF16" -> torch.bfloat16)."""
    import torch

    return getattr(torch, _DTYPES[safetensors_dtype])


def resolve_base(base: str) -> Path:
    """A local folder for BASE: the folder itself, or a Hub snapshot of an id like org/name.

    Raises:
        CheckpointError: not a folder, and not downloadable (offline, unknown id).
    """
    path = Path(base)
    if path.is_dir():
        return path
    if path.exists() or not _HUB_ID.match(base):
        raise CheckpointError(f"base checkpoint {base!r} is not a folder or a Hub id")
    try:
        from huggingface_hub import snapshot_download

        patterns = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]
        return Path(snapshot_download(base, allow_patterns=patterns))
    except Exception as error:  # the hub client raises many types; all mean "not available"
        raise CheckpointError(
            f"base {base!r} is not a local folder and could not be fetched from the Hub "
            f"({type(error).__name__}: {error})"
        ) from None


def read_layout(folder: Path) -> CheckpointLayout:
    """Read shard names and tensor headers of a safetensors checkpoint (no tensor data).

    Raises:
        CheckpointError: no config.json, no safetensors weights, or unreadable files.
    """
    from safetensors import safe_open

    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{folder} has no config.json; is it a Hugging Face checkpoint?")
    if (folder / INDEX_FILE).is_file():
        weight_map = json.loads((folder / INDEX_FILE).read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    elif (folder / SINGLE_FILE).is_file():
        files = [SINGLE_FILE]
    else:
        raise CheckpointError(f"{folder} has no safetensors weights ({SINGLE_FILE} or index)")
    shards: dict[str, tuple[str, ...]] = {}
    tensors: dict[str, TensorInfo] = {}
    for file in files:
        try:
            with safe_open(folder / file, framework="pt") as handle:
                names = tuple(handle.keys())
                for name in names:
                    view = handle.get_slice(name)
                    tensors[name] = TensorInfo(view.get_dtype(), tuple(view.get_shape()))
        except Exception as error:
            raise CheckpointError(f"cannot read {folder / file}: {error}") from None
        shards[file] = names
    stack = select_stack(find_stacks(tensors))
    config = json.loads(config_path.read_text())
    return CheckpointLayout(
        folder=folder, shards=shards, tensors=tensors, config=config, text_stack=stack
    )


def text_only_key_mapping(layout: CheckpointLayout) -> dict[str, str]:
    """Regexes mapping a multimodal checkpoint's language-model keys onto the text-only class."""
    body, head = layout.language_model_prefixes()
    return {f"^{re.escape(body)}": "model.", f"^{re.escape(head)}": "lm_head."}


def load_for_training(layout: CheckpointLayout, dtype: str) -> PreTrainedModel:
    """Load BASE's causal language model in `dtype`, refusing any silently random weight.

    A multimodal checkpoint loads its language model only, into the text-only class, with
    its on-disk prefixes mapped to the class's `model.` and `lm_head.`.

    Raises:
        CheckpointError: not a causal LM, or weights missing or mismatched after loading.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs: dict = {"dtype": getattr(torch, dtype), "output_loading_info": True}
    # Never run code shipped with a checkpoint; weights only from safetensors.
    kwargs |= {"trust_remote_code": False, "use_safetensors": True}
    if layout.multimodal:
        config = AutoConfig.from_pretrained(layout.folder, trust_remote_code=False)
        kwargs["config"] = config.get_text_config()
        kwargs["key_mapping"] = text_only_key_mapping(layout)
    try:
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


def write_checkpoint(
    out: Path, layout: CheckpointLayout, tensors: Mapping[str, torch.Tensor], extra: Mapping
) -> None:
    """Write a checkpoint with BASE's shards, names and dtypes; side files copied from BASE.

    Args:
        out: the output folder (created; files in it are overwritten).
        layout: BASE's layout.
        tensors: trained tensors by BASE name (any dtype, any device); BASE tensors not in it
            are copied from BASE unchanged.
        extra: JSON-serializable training record, written as `surgery_train.json`.
    """
    from safetensors import safe_open
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for shard, names in layout.shards.items():
        payload = {}
        with safe_open(layout.folder / shard, framework="pt") as handle:
            metadata = handle.metadata() or {"format": "pt"}
            for name in names:
                if name in tensors:
                    target = torch_dtype(layout.tensors[name].dtype)
                    payload[name] = tensors[name].detach().to("cpu", target).contiguous()
                else:
                    payload[name] = handle.get_tensor(name)
        save_file(payload, out / shard, metadata=metadata)
    if (layout.folder / INDEX_FILE).is_file():
        shutil.copyfile(layout.folder / INDEX_FILE, out / INDEX_FILE)
    (out / "surgery_train.json").write_text(json.dumps(extra, indent=2, default=str) + "\n")
    # config.json last: a folder with a config is a finished checkpoint.
    side_files = sorted(
        p for p in layout.folder.iterdir() if p.is_file() and not _NOT_COPIED.match(p.name)
    )
    for path in sorted(side_files, key=lambda p: p.name == "config.json"):
        shutil.copyfile(path, out / path.name)

"""Load a checkpoint for scoring, and the facts about a model every task needs.

`AutoModelForCausalLM` maps a Gemma-3 multimodal config to `Gemma3ForConditionalGeneration`,
which scores text when given only `input_ids`, so one loader serves text-only and multimodal
checkpoints alike.
"""

from __future__ import annotations

import functools
import inspect
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from eval.errors import ModelError
from surgery.core.dtypes import compute_dtype, torch_dtype

# transformers' loading sets and restores process-wide state (weight initialisation and tying
# switches, logging): two threads loading at once (search workers in one process) can restore
# each other's values and leave later models untied. One load at a time.
_LOADING = threading.Lock()

# Architectures whose name ends like this are decoders that predict the next token.
_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """The dtype to load weights in: float32 on CPU unless asked, bfloat16 on an accelerator.

    Args:
        dtype: a torch dtype, None, or a name as the other commands take it (bf16, bfloat16,
            fp16, float16, fp32, float32).
        device: where the model will run.

    Returns:
        The torch dtype.

    Raises:
        ModelError: a name that is not a float dtype a model can run in.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None:
        return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
    name = compute_dtype(dtype)
    if name is None:
        raise ModelError(f"unknown dtype {dtype!r}; use bf16, fp16 or fp32")
    return torch_dtype(name)


def dtype_name(dtype: str | torch.dtype | None, device: str) -> str:
    """The name of the dtype `load_model` loads weights in for these arguments (``float32``,
    ``bfloat16``, ``float16``): what results record, never None.

    Raises:
        ModelError: a bad device or dtype name.
    """
    return str(resolve_dtype(dtype, device_type(device))).removeprefix("torch.")


def device_type(device: str) -> str:
    """The kind of device results record: ``cpu``, ``cuda`` (for ``cuda:1`` too), ``mps``, ...

    Raises:
        ModelError: `device` does not parse.
    """
    try:
        return torch.device(device).type
    except RuntimeError as error:
        raise ModelError(f"bad device {device!r}: {error}") from None


def check_device(device: str) -> None:
    """Raise `ModelError` if `device` does not parse or its accelerator is not present."""
    kind = device_type(device)
    if kind == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"device {device!r} asked for, but torch sees no CUDA device")


@contextmanager
def _quiet_transformers(progress: bool):
    """Hide transformers' own progress bars (weight loading) when progress is off."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled and not progress:
            hf_logging.enable_progress_bar()


def load_model(
    path: str | Path,
    device: str = "cpu",
    dtype: str | torch.dtype | None = None,
    *,
    tokenizer: str | Path | None = None,
    progress: bool = True,
) -> tuple[Any, Any]:
    """Load a causal LM checkpoint and its tokenizer for scoring.

    Args:
        path: a checkpoint folder, or a Hub id (`org/name[@revision]`, downloaded through the
            cache).
        device: "cpu", "cuda", "cuda:1", ...
        dtype: bf16, fp16, fp32 (or bfloat16, float16, float32), a torch dtype, or None
            (float32 on CPU, bfloat16 elsewhere).
        tokenizer: where the tokenizer lives (a folder or Hub id), if not next to the weights.
        progress: show transformers' loading bar.

    Returns:
        `(model, tokenizer)`, the model in eval mode on `device`.

    Raises:
        ModelError: not a causal LM, no tokenizer, bad device or dtype.
        CheckpointError: the checkpoint cannot be read.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from surgery.core.errors import CheckpointError
    from surgery.hub.resolve import resolve

    check_device(device)
    # As every command opens a checkpoint: a local path, or a Hub id fetched through the cache
    # with timeouts; a mistyped folder is "no such file or folder", never a Hub request.
    path = resolve(path)[0]
    tokenizer = resolve(tokenizer)[0] if tokenizer is not None else None
    torch_dtype = resolve_dtype(dtype, device)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"cannot read a model config from {path}: {error}") from None
    _check_causal(path, config)
    with _LOADING, _quiet_transformers(progress):
        try:
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=torch_dtype, trust_remote_code=False, use_safetensors=True
            )
        except (OSError, ValueError) as error:
            raise CheckpointError(f"cannot load {path}: {error}") from None
    try:
        tok = AutoTokenizer.from_pretrained(tokenizer or path, trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise ModelError(
            f"no usable tokenizer at {tokenizer or path} ({error}); pass --tokenizer PATH"
        ) from None
    return model.to(device).eval(), tok


def _check_causal(path: str | Path, config: Any) -> None:
    architectures = getattr(config, "architectures", None) or []
    if getattr(config, "is_encoder_decoder", False) or (
        architectures and not any(a.endswith(_CAUSAL_SUFFIXES) for a in architectures)
    ):
        raise ModelError(
            f"{path} is a {', '.join(architectures) or config.model_type} checkpoint; "
            "eval scores decoder-only causal language models"
        )


def model_context(model: Any) -> int | None:
    """The longest sequence the model was built for, or None if its config does not say."""
    config = model.config
    text_config = getattr(config, "text_config", None) or config
    for attribute in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(text_config, attribute, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def pad_id(tokenizer: Any) -> int:
    """An id to fill padding with (masked out, so any valid id works)."""
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id):
        if token_id is not None:
            return int(token_id)
    return 0


def model_device(model: Any) -> torch.device:
    """The device of the model's first parameter (where inputs must go)."""
    return next(model.parameters()).device


@functools.cache
def _forward_parameters(model_class: type) -> frozenset[str]:
    return frozenset(inspect.signature(model_class.forward).parameters)


def cache_argument(model: Any) -> str:
    """Name of the forward argument that takes a KV cache (`cache` in recent 5.x releases)."""
    return "cache" if "cache" in _forward_parameters(type(model)) else "past_key_values"


def supports_logits_to_keep(model: Any) -> bool:
    """Whether the forward takes `logits_to_keep` (logits of the last positions only)."""
    return "logits_to_keep" in _forward_parameters(type(model))

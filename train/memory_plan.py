"""`surgery train --dry-run`: bytes per GPU of a run, from BASE's config.json alone.

The model is built on the meta device (shapes, no storage), frozen and wrapped as the run would
be, and its parameters counted. Per GPU:

- weights: every parameter in the training dtype (`--train-dtype`, float32 by default);
- gradients: trained parameters, same dtype; optimizer: AdamW's two moments per trained one;
  with several GPUs DDP adds its gradient buckets (another copy of the gradients);
- L2-SP reference: trained parameters with lambda > 0; EMA anchor: every trained parameter;
  drift reference: trained parameters the L2-SP reference does not cover, in bfloat16 when BASE
  is bfloat16 (lossless), else in the training dtype;
- activations kept for the backward pass, per micro-batch (`--batch-size` x `--block-size`),
  with and without gradient checkpointing (see `activation_bytes`).

Under DDP every GPU holds all of it. Under FSDP (`--fsdp`) over N GPUs the first five are
divided by N, plus a working set of gathered units (the largest unit, i.e. the embeddings and
head, and two decoder layers, with one unit's gradients before they are reduce-scattered);
activations are per GPU in both. A run fits when the total stays under 90% of `--gpu-memory`
(the rest is for the CUDA context, allocator fragmentation and temporaries).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from surgery.core.errors import CheckpointError
from surgery.core.layers import (
    find_stacks,
    layer_of,
    parse_layer_spec,
    parse_layer_values,
    select_stack,
)
from surgery.core.modules import parse_module_filter
from surgery.core.sizes import format_size
from train.config import TrainConfig
from train.errors import TrainConfigError
from train.limits import block_size, check_attention_only, require_attention_only_tensors
from train.strategies.l2sp import check_lambdas
from train.strategies.lora import LoRA, parse_lora

if TYPE_CHECKING:
    from torch import nn

USABLE = 0.9  # share of a GPU's memory a plan may fill
_DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}


@dataclass(frozen=True)
class Counts:
    """Parameter counts of the model as the run would train it."""

    total: int
    trained: int
    regularized: int  # trained with an L2-SP lambda > 0
    largest_unit: int  # parameters of the largest FSDP unit (embeddings + head, or a layer)
    largest_layer: int


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU of each part of a run, under DDP and under FSDP over `gpus` GPUs."""

    name: str
    counts: Counts
    gpus: int
    gpu_memory: int
    rows: tuple[tuple[str, int, int], ...]  # (part, DDP bytes, FSDP bytes), activations apart
    activations: int
    activations_checkpointed: int
    checkpointing: bool

    def totals(self, checkpointed: bool) -> tuple[int, int]:
        """(DDP, FSDP) bytes per GPU with or without gradient checkpointing."""
        act = self.activations_checkpointed if checkpointed else self.activations
        return (sum(r[1] for r in self.rows) + act, sum(r[2] for r in self.rows) + act)

    def fits(self, checkpointed: bool) -> tuple[bool, bool]:
        """(DDP fits, FSDP fits) within `USABLE` of the GPU's memory."""
        limit = USABLE * self.gpu_memory
        ddp, fsdp = self.totals(checkpointed)
        return ddp <= limit, fsdp <= limit

    def table(self) -> str:
        """The plan as a text table (what `--dry-run` prints)."""
        c = self.counts
        width = 40
        head = f"{'per GPU':{width}} {'DDP':>10} {f'FSDP x {self.gpus}':>12}"
        lines = [
            f"memory plan for {self.name}",
            f"parameters: {_count(c.total)} ({_count(c.trained)} trained, "
            f"{_count(c.total - c.trained)} frozen)",
            "",
            head,
            "-" * len(head),
        ]
        for label, ddp, fsdp in self.rows:
            lines.append(f"{label:{width}} {_size(ddp):>10} {_size(fsdp):>12}")
        act, act_ckpt = self.activations, self.activations_checkpointed
        lines.append(f"{'activations':{width}} {_size(act):>10} {_size(act):>12}")
        label = "activations, gradient checkpointing"
        lines.append(f"{label:{width}} {_size(act_ckpt):>10} {_size(act_ckpt):>12}")
        lines.append("-" * len(head))
        for checkpointed in (False, True):
            ddp, fsdp = self.totals(checkpointed)
            ok_ddp, ok_fsdp = self.fits(checkpointed)
            suffix = ", checkpointing" if checkpointed else ""
            mark = " <- this run" if checkpointed == self.checkpointing else ""
            lines.append(f"{'total' + suffix:{width}} {_size(ddp):>10} {_size(fsdp):>12}{mark}")
            verdict = f"fits {self.gpus} x {format_size(self.gpu_memory)}{suffix}"
            lines.append(f"{verdict:{width}} {_yes(ok_ddp):>10} {_yes(ok_fsdp):>12}")
        lines.append(
            f"(fits: total <= {USABLE:.0%} of the GPU's memory; activations are an estimate)"
        )
        return "\n".join(lines)


def _size(count: int) -> str:
    return format_size(count) if count else "-"


def _count(count: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return str(count)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def read_config(base: str) -> tuple[Path, dict]:
    """BASE's config.json (a folder, or a Hub id: only config.json is fetched).

    Raises:
        CheckpointError: no config.json to read.
    """
    folder = Path(base)
    if folder.is_dir():
        path = folder / "config.json"
        if not path.is_file():
            raise CheckpointError(f"{folder} has no config.json; is it a Hugging Face checkpoint?")
    else:
        from surgery.hub.resolve import parse_hub_id

        parsed = parse_hub_id(base)
        if parsed is None:
            raise CheckpointError(f"base checkpoint {base!r} is not a folder or a Hub id")
        from huggingface_hub import hf_hub_download

        from surgery.hub.timeouts import bound_requests

        bound_requests()
        try:
            path = Path(hf_hub_download(parsed[0], "config.json", revision=parsed[1]))
        except Exception as error:  # offline, unknown, gated: all mean "no config to read"
            raise CheckpointError(
                f"cannot fetch config.json of {base!r} ({type(error).__name__}: {error})"
            ) from None
    try:
        return path.parent, json.loads(path.read_text())
    except ValueError as error:
        raise CheckpointError(f"{path} is not valid JSON: {error}") from None


def meta_model(folder: Path, config: Mapping) -> nn.Module:
    """The causal LM training would load (a multimodal checkpoint's language model), on the
    meta device: shapes and names, no memory."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_config = AutoConfig.from_pretrained(folder)
    if "text_config" in config and "vision_config" in config:
        model_config = model_config.get_text_config()
    with torch.device("meta"):
        try:
            return AutoModelForCausalLM.from_config(model_config)
        except ValueError as error:
            raise CheckpointError(f"{folder} is not a causal language model: {error}") from None


def count_parameters(model: nn.Module, cfg: TrainConfig) -> Counts:
    """Parameters total, trained and regularized, after `--freeze`, `--lora` and `--l2sp`.

    Raises:
        LayerSpecError, TrainConfigError: specs that do not fit the model.
    """
    from train.layer_map import layer_map
    from train.strategies.freeze import freeze

    if cfg.attention_only:
        check_attention_only(cfg.modules, cfg.lora.spec, cfg.freeze.layers, cfg.l2sp.lambdas)
    names = [n for n, _ in model.named_parameters()]
    stack = select_stack(find_stacks(names))
    num_layers = stack.num_layers
    spec = cfg.freeze.layers
    frozen = parse_layer_spec(spec, num_layers) if spec else []
    if cfg.attention_only:
        require_attention_only_tensors(names, stack, frozen)
    modules = parse_module_filter(cfg.modules) if cfg.modules else None
    # `narrowed`: what --l2sp's ranges reach; `freezable`: what --freeze's reach.
    mapped = layer_map(names, num_layers, modules, cfg.attention_only)
    layers, narrowed = mapped.layers, mapped.narrowed
    freeze(model, frozen, mapped.freezable, cfg.freeze.embeddings)
    lambdas = cfg.l2sp.lambdas
    l2sp = check_lambdas(parse_layer_values(lambdas, num_layers), lambdas) if lambdas else None
    params = dict(model.named_parameters())
    total = sum(p.numel() for p in params.values())
    per_layer: dict[int | None, int] = {}
    for name, param in params.items():
        per_layer[layers[name]] = per_layer.get(layers[name], 0) + param.numel()
    largest_layer = max((v for k, v in per_layer.items() if k is not None), default=0)
    largest_unit = max(per_layer.get(None, 0), largest_layer)
    if cfg.lora.spec:
        trained = _lora_parameters(model, parse_lora(cfg.lora.spec), set(frozen))
        return Counts(total + trained, trained, 0, largest_unit, largest_layer)
    trained = regularized = 0
    for name, param in params.items():
        if param.requires_grad:
            trained += param.numel()
            exempt = name in mapped.unregularized
            if l2sp is not None and not exempt and l2sp.value_for(narrowed[name]):
                regularized += param.numel()
    return Counts(total, trained, regularized, largest_unit, largest_layer)


def _lora_parameters(model: nn.Module, spec: LoRA, frozen: set[int]) -> int:
    """r x (in + out) per adapted linear layer of the stack (peft's A and B)."""
    from torch import nn

    count = 0
    for name, module in model.named_modules():
        ref = layer_of(name + ".")
        if not isinstance(module, nn.Linear) or ref is None or ref[1] in frozen:
            continue
        short = name.rsplit(".", 1)[-1]
        if spec.targets == "all-linear" or short in spec.targets:
            count += spec.r * (module.in_features + module.out_features)
    return count


def activation_bytes(
    config: Mapping, batch: int, block: int, element: int, checkpointed: bool
) -> int:
    """Estimated bytes of activations saved for the backward pass of one micro-batch.

    Per token and decoder layer, what autograd keeps: the two norms' inputs and outputs (4 x
    hidden), the residual (hidden), q, k, v before and after rotary embedding (3 x (q + 2 kv)
    over 2), the attention output (q), and the MLP's gate, up, activation and product (4 x
    intermediate); eager attention adds the heads x block scores and probabilities. SDPA keeps
    no scores. The head's float32 logits are held three times at the peak (logits, their
    log-softmax, their gradient). With gradient checkpointing a layer keeps only its input, and
    one layer is recomputed at a time.
    """
    text = config.get("text_config") or config
    hidden = text["hidden_size"]
    heads = text.get("num_attention_heads", 1)
    head_dim = text.get("head_dim") or hidden // heads
    kv = text.get("num_key_value_heads") or heads
    inter = text.get("intermediate_size") or 4 * hidden
    layers = text.get("num_hidden_layers") or text.get("n_layer") or 1
    vocab = text["vocab_size"]
    q_dim, kv_dim = heads * head_dim, kv * head_dim
    per_token = 5 * hidden + 2 * q_dim + 3 * kv_dim + q_dim + 4 * inter
    tokens = batch * block
    layer = tokens * per_token * element
    if text.get("_attn_implementation", config.get("attn_implementation")) == "eager":
        layer += 2 * batch * heads * block * block * element
    logits = 3 * tokens * vocab * 4
    embeddings = tokens * hidden * element
    if checkpointed:
        return embeddings + layers * tokens * hidden * element + layer + logits
    return embeddings + layers * layer + logits


def plan_memory(cfg: TrainConfig, gpus: int, gpu_memory: int) -> MemoryPlan:
    """The memory plan of a run, from BASE's config.json (no weights, no data read).

    Args:
        cfg: the run's configuration (data and budget are not needed).
        gpus: GPUs to plan for (the FSDP column divides by it).
        gpu_memory: bytes per GPU.

    Returns:
        The plan; `table()` renders it.

    Raises:
        CheckpointError: BASE has no readable config.json or is not a causal LM.
        TrainConfigError, LayerSpecError: options that do not fit the model.
    """
    if gpus < 1 or gpu_memory <= 0:
        raise TrainConfigError("--gpus and --gpu-memory must be positive")
    folder, config = read_config(cfg.base)
    model = meta_model(folder, config)
    counts = count_parameters(model, cfg)
    element = _DTYPE_BYTES.get(cfg.dtype.lower())
    if element is None:
        raise TrainConfigError(f"--train-dtype {cfg.dtype!r}: choose float32, bfloat16 or float16")
    text = config.get("text_config") or config
    base_bf16 = str(text.get("torch_dtype", text.get("dtype", config.get("dtype")))) in (
        "bfloat16",
        "torch.bfloat16",
    )
    drift_element = 2 if base_bf16 and element == 4 else element
    regularized = counts.regularized if cfg.l2sp.lambdas else 0
    drift = (counts.trained - regularized) if cfg.drift.log and not cfg.lora.spec else 0
    parts = [
        ("weights", counts.total * element),
        ("gradients", counts.trained * element),
        ("optimizer (AdamW moments)", 2 * counts.trained * element),
        ("L2-SP reference", regularized * element),
        ("EMA anchor", counts.trained * element if cfg.ema.alpha is not None else 0),
        ("drift reference (--no-drift: 0)", drift * drift_element),
    ]
    rows = [(label, size, math.ceil(size / gpus)) for label, size in parts]
    # DDP reduces gradients through flat buckets, a second copy of them (when there are ranks).
    rows.append(("DDP gradient buckets", counts.trained * element if gpus > 1 else 0, 0))
    working = (counts.largest_unit + 2 * counts.largest_layer) * element
    working += counts.largest_unit * element if counts.trained else 0
    rows.append(("FSDP gathered units", 0, working if gpus > 1 else 0))
    block = block_size(cfg.block_size, config)
    act = activation_bytes(config, cfg.batch_size, block, _act_element(cfg, element), False)
    act_ckpt = activation_bytes(config, cfg.batch_size, block, _act_element(cfg, element), True)
    name = f"{cfg.base} ({type(model).__name__}), micro-batch {cfg.batch_size} x {block} tokens"
    return MemoryPlan(
        name=name,
        counts=counts,
        gpus=gpus,
        gpu_memory=gpu_memory,
        rows=tuple(rows),
        activations=act,
        activations_checkpointed=act_ckpt,
        checkpointing=cfg.gradient_checkpointing,
    )


def _act_element(cfg: TrainConfig, element: int) -> int:
    """Bytes per activation: autocast to bf16/fp16 halves float32 activations."""
    return 2 if cfg.mixed_precision in ("bf16", "fp16") else element

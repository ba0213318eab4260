"""What the strategies need from FSDP2: local shards, a few collectives, FSDP on CPU.

Under FSDP2 every parameter is a DTensor whose local tensor is this rank's shard (rows of dim 0,
padded at the end). L2-SP, EMA and drift work on `local(param)` only: their own tensors (the
reference, the anchor) are shards of the same shape, so they cost 1/ranks of a full copy and
nothing is ever gathered. The few numbers a log line needs are summed with one all-reduce.
Without FSDP (one process, DDP) `local` returns the parameter itself and `all_reduce_sum` is an
identity, so the same code serves both.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import Trainer

logger = logging.getLogger(__name__)


def is_sharded(tensor: torch.Tensor) -> bool:
    """True for a DTensor (an FSDP2 parameter or gradient)."""
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a view, writes land in the parameter); else the tensor."""
    return tensor.to_local() if is_sharded(tensor) else tensor


def any_sharded(model: nn.Module) -> bool:
    """Whether the model's parameters are FSDP2 shards."""
    return any(is_sharded(p) for p in model.parameters())


def all_reduce_sum(values: list[float], sharded: bool) -> list[float]:
    """Sum a few floats over ranks when the tensors they come from are sharded.

    Args:
        values: this rank's partial sums (float64 on the wire).
        sharded: False (whole tensors on every rank): the values are returned unchanged.

    Returns:
        The global sums.
    """
    import torch
    import torch.distributed as dist

    if not sharded or not (dist.is_available() and dist.is_initialized()):
        return values
    backend = dist.get_backend()
    device = torch.device("cpu")
    if backend != "gloo":
        kind = torch.accelerator.current_accelerator().type
        device = torch.device(kind, torch.accelerator.current_device_index())
    buffer = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(buffer)
    return buffer.tolist()


def full_state_dict(model: nn.Module, keep: bool) -> dict[str, torch.Tensor]:
    """The model's state dict with every DTensor gathered, one tensor at a time.

    A collective under FSDP2: every rank must call it. Gathered tensors are kept (moved to the
    CPU) only where `keep` is true (the main process), so the other ranks never hold a full
    copy.

    Args:
        model: the FSDP2 model (or a plain one: its state dict is returned as is).
        keep: whether this rank keeps the gathered tensors.

    Returns:
        name -> full CPU tensor on the keeping rank; an empty dict elsewhere.
    """
    result = {}
    for name, tensor in model.state_dict().items():
        full = tensor.full_tensor() if is_sharded(tensor) else tensor
        if keep:
            result[name] = full.detach().to("cpu", copy=full.device.type == "cpu").contiguous()
        del full
    return result


def shard_file(path_stem: str) -> str:
    """A per-rank file name for state kept as shards (`ema_anchor` -> `ema_anchor-rank0-of-2`)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    return f"{path_stem}-rank{rank}-of-{world}.safetensors"


def enable_fsdp_on_cpu(trainer: Trainer) -> bool:
    """Make accelerate honour an FSDP request on a CPU-only (gloo) run.

    accelerate only switches to FSDP for accelerator devices; on CPU it silently falls back to
    DDP, so `--fsdp` would run unsharded. torch's FSDP2 (`fully_shard`) works on CPU with gloo,
    so the plugin is installed by hand. Used on machines without GPUs (tests, the benchmark);
    with GPUs accelerate's own path runs and this does nothing.

    Returns:
        True when FSDP was switched on here.
    """
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = trainer.accelerator.state
    plugin_args = trainer.args.fsdp_plugin_args
    if plugin_args is None or state.distributed_type != DistributedType.MULTI_CPU:
        return False
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = FullyShardedDataParallelPlugin(**plugin_args)
    trainer.is_fsdp_enabled = True
    logger.info("FSDP on CPU (gloo): sharding with torch's fully_shard")
    return True

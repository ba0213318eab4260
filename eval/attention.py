"""Grouped-query attention read as the model stores it, on a CPU.

A grouped-query model keeps fewer key/value heads than query heads (SmolLM2-135M: 9 query
heads, 3 key/value heads). When a forward has an attention mask (padding, a cache), transformers'
SDPA path copies every key/value head once per query head it serves (``repeat_kv``, each
layer, each forward), because CUDA's fused kernels need that. torch's CPU kernel reads the
grouped heads as they are (``enable_gqa``, torch 2.5 and later): the same products and sums,
without the copies. transformers takes that path when ``TRANSFORMERS_SDPA_FORCE_GQA`` is set;
`grouped_query_attention` sets it while a CPU scores, and only then.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

FLAG = "TRANSFORMERS_SDPA_FORCE_GQA"


@contextmanager
def grouped_query_attention(device: torch.device) -> Iterator[None]:
    """Within the block, SDPA on a CPU reads grouped key/value heads without copying them.

    Elsewhere (a GPU, whose kernels need the copies when a mask is given; a torch without
    ``enable_gqa``; the variable already set by the user) nothing changes.
    """
    from transformers.utils import is_torch_greater_or_equal

    if device.type != "cpu" or FLAG in os.environ or not is_torch_greater_or_equal("2.5"):
        yield
        return
    os.environ[FLAG] = "1"
    try:
        yield
    finally:
        os.environ.pop(FLAG, None)

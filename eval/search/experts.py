"""The experts of a search, checked before any model loads: one architecture and layer count,
each expert's family (from `--labels` or its folder's name), and whether the models fit in
memory.

Memory: the search holds the working model (the first expert, in the dtype it is scored in),
one copy of BASE's and every expert's parameters in their storage dtype, and two scratch
buffers the size of the largest parameter. That sum is the expected peak; a search whose peak
exceeds the available memory (`MemAvailable`, or a CUDA device's free memory;
`SURGERY_SEARCH_MEMORY` sets it, in bytes or with a K, M, G or T suffix) is refused in one line
with both figures.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from surgery.core.errors import SurgeryError

MEMORY_ENV = "SURGERY_SEARCH_MEMORY"
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}


def check_experts(experts: Sequence[Any]) -> None:
    """Refuse experts of other architectures or layer counts than the first.

    Raises:
        SurgeryError: naming both experts and what differs.
    """
    from surgery.core.layers import select_stack

    first = experts[0]
    layers = select_stack(first.stacks).num_layers
    for other in experts[1:]:
        if other.model_type != first.model_type:
            raise SurgeryError(
                f"experts {first.path} and {other.path} are of other architectures "
                f"({first.model_type} and {other.model_type}); the experts must share one"
            )
        found = select_stack(other.stacks).num_layers
        if found != layers:
            raise SurgeryError(
                f"experts {first.path} and {other.path} have {layers} and {found} layers; the "
                "experts must have the same layers"
            )


def family_labels(paths: Sequence[str], labels: str | None, families: Sequence[str]) -> list[str]:
    """Each expert's family: `labels` (comma-separated, one per expert), or the one family of
    the suite its folder's name contains.

    Raises:
        SurgeryError: a label the suite lacks, a count other than the experts', a family twice,
            or a folder name naming no family or several.
    """
    known = ", ".join(families)
    if labels is not None:
        chosen = [label.strip() for label in labels.split(",")]
        if len(chosen) != len(paths):
            raise SurgeryError(
                f"--labels {labels}: give one family per expert ({len(paths)} experts)"
            )
        for label in chosen:
            if label not in families:
                raise SurgeryError(f"--labels: the suite has no family {label!r} ({known})")
    else:
        chosen = [_family_of(path, families, known) for path in paths]
    twice = next((label for label in chosen if chosen.count(label) > 1), None)
    if twice is not None:
        raise SurgeryError(f"two experts of family {twice!r}; give each expert its own family")
    return chosen


def _family_of(path: str, families: Sequence[str], known: str) -> str:
    name = Path(str(path).rstrip("/")).name.lower()
    found = [family for family in families if family.lower() in name]
    if len(found) != 1:
        what = "no family" if not found else f"several families ({', '.join(found)})"
        raise SurgeryError(
            f"expert {path}: its folder name names {what} of the suite ({known}); give --labels"
        )
    return found[0]


def peak_bytes(inputs: Sequence[Any], compute_dtype: str) -> int:
    """The search's expected peak: the working model in `compute_dtype`, each input's float
    parameters as stored, and two scratch buffers of the largest parameter."""
    stored = sum(t.numel * _itemsize(t.dtype) for c in inputs for t in c if t.is_float)
    largest = max((t.numel for t in inputs[0] if t.is_float), default=0)
    return inputs[0].num_params * _BYTES.get(compute_dtype, 4) + stored + 2 * largest * 8


def _itemsize(dtype: str) -> int:
    from surgery.core.dtypes import itemsize

    return itemsize(dtype)


def available_bytes(device: str) -> int:
    """The memory a search may use: `SURGERY_SEARCH_MEMORY`, else a CUDA device's free memory,
    else the host's available memory.

    Raises:
        SurgeryError: `SURGERY_SEARCH_MEMORY` does not parse.
    """
    text = os.environ.get(MEMORY_ENV)
    if text is not None:
        found = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
        if found is None:
            raise SurgeryError(f"{MEMORY_ENV}={text!r}: write bytes, or a number with K, M, G, T")
        return int(float(found[1]) * _UNITS[found[2].upper()])
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    from surgery.diagnostics.memory_blend import _available_memory

    return _available_memory()


def check_memory(inputs: Sequence[Any], compute_dtype: str, device: str) -> int:
    """Refuse a search whose expected peak exceeds the available memory; returns the peak.

    Raises:
        SurgeryError: one line with both figures.
    """
    peak, free = peak_bytes(inputs, compute_dtype), available_bytes(device)
    if peak > free:
        raise SurgeryError(
            f"the search would hold about {_gb(peak)} (the working model, BASE and "
            f"{len(inputs) - 1} expert(s) in memory) and {_gb(free)} is available; free memory, "
            f"search fewer experts, or set {MEMORY_ENV}"
        )
    return peak


def _gb(count: int) -> str:
    return f"{count / 2**30:.2f} GiB"

"""The one default device rule of every command that scores or trains a model.

`--device` left out means the accelerator when one is present: CUDA, else the CPU. Apple's MPS is
never chosen by default (some kernels and dtypes differ there, so scores would not match a CPU
run); `--device mps` asks for it. torch is imported only when the device is resolved, at run
time, so `surgery --help` does not pay for it.
"""

from __future__ import annotations


def resolve_device(device: str | None = None) -> str:
    """`device` as given, or (None) "cuda" when torch sees a CUDA device and "cpu" otherwise."""
    if device is not None:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"

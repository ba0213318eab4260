"""Padding token-id lists into batch tensors."""

from __future__ import annotations

import torch


def left_pad(
    seqs: list[list[int]], device: torch.device, pad: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack sequences right-aligned: `(ids, attention mask)`, each `[len(seqs), longest]`.

    Left padding puts every row's last real token in the last column, where a prompt's next
    token is predicted and where generation appends.
    """
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for row, seq in enumerate(seqs):
        if seq:
            ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq) :] = 1
    return ids.to(device), mask.to(device)


def right_pad(
    seqs: list[list[int]], device: torch.device, pad: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack sequences left-aligned: `(ids, attention mask)`, at least one column wide.

    Under a causal mask no real token attends to padding that follows it, so right padding
    leaves the real tokens' outputs unchanged.
    """
    width = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
    return ids.to(device), mask.to(device)

"""Shared checks for surgery outputs (in the spirit of mergekit's run-and-check helper)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from surgery.checks.verify import verify
from surgery.core.layers import find_stacks, layer_of
from surgery.engine.recipe import public_recipe


def load_state(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder, loaded with safetensors' own loader."""
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(Path(path).glob("*.safetensors")):
        state.update(load_file(shard))
    return state


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor, for bit-for-bit comparisons (NaN and -0.0 included)."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality, dtype and shape included."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in units in the last place between two same-dtype float tensors."""
    assert a.dtype == b.dtype and a.shape == b.shape
    int_type = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    ia, ib = a.contiguous().view(int_type).long(), b.contiguous().view(int_type).long()
    # Map sign-magnitude float bits onto a monotonic integer line.
    sign = 1 << (8 * a.element_size() - 1)
    ia = torch.where(ia < 0, -(ia + sign), ia)
    ib = torch.where(ib < 0, -(ib + sign), ib)
    return int((ia - ib).abs().max()) if a.numel() else 0


def assert_valid_output(path: Path) -> dict[str, torch.Tensor]:
    """The output verifies, its index matches its shards, it has no NaN, and carries a recipe."""
    path = Path(path)
    report = verify(path, values=True)
    assert report.ok, report.problems
    shards = sorted(path.glob("*.safetensors"))
    index_path = path / "model.safetensors.index.json"
    if len(shards) > 1:
        weight_map = json.loads(index_path.read_text())["weight_map"]
        assert sorted(set(weight_map.values())) == [s.name for s in shards]
    else:
        assert not index_path.exists()
    recipe = json.loads((path / "surgery_recipe.json").read_text())
    # Each shard's sha256 is recorded (computed while writing; checked here with hashlib).
    hashes = recipe.pop("shard_sha256")
    # The threads that wrote it (a merge's: in the local record only, so no shard byte depends
    # on them; a training run's: in its record, embedded too).
    assert isinstance(recipe.pop("threads"), int)
    assert hashes == {s.name: hashlib.sha256(s.read_bytes()).hexdigest() for s in shards}
    if len(shards) > 1:
        assert json.loads(index_path.read_text())["metadata"]["shard_sha256"] == hashes
    for shard in shards:
        with safe_open(shard, "pt") as handle:
            # The shards embed the recipe's public copy: local inputs by folder name only.
            embedded = json.loads(handle.metadata()["surgery_recipe"])
            embedded.pop("threads", None)
            assert embedded == public_recipe(recipe)
    state = load_state(path)
    assert all(torch.isfinite(t.float()).all() for t in state.values() if t.is_floating_point())
    return state


def text_layer(name: str, names) -> int | None:
    """The text-stack layer index of a tensor name (None outside the text stack)."""
    stack = next(s for s in find_stacks(names) if s.name == "text")
    ref = layer_of(name)
    return ref[1] if ref and ref[0] == stack.prefix else None

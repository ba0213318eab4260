"""The one dtype table against safetensors itself, and checkpoints of every dtype it defines.

The checkpoints are built byte by byte (torch has no F4, F6 or E8M0 tensors a file could come
from), read back with safetensors' own parser, and put through inspect, verify, revert and soup.
"""

from __future__ import annotations

import json
import math
import random
import struct
from pathlib import Path

import pytest
import safetensors
import torch
from click.testing import CliRunner
from safetensors import safe_open

from cli import cli
from surgery.core.dtypes import (
    DTYPES,
    FLOAT_DTYPES,
    compute_dtype,
    itemsize,
    nbytes,
    torch_dtype,
)
from surgery.core.errors import CheckpointError, MismatchError, SurgeryError
from surgery.engine.ops.soup import plan_soup
from surgery.engine.reader import open_checkpoint, read_shard

# (dtype, shape) of every tensor of the test checkpoints, one per dtype, spread over two layers
# and the outside of the stack. Packed shapes fill whole bytes: 4 F4 values are 2 bytes, 4 F6
# values 3 bytes.
_SHAPES = {"F4": [2, 4], "F6_E2M3": [4], "F6_E3M2": [2, 8]}


def _layout() -> dict[str, tuple[str, list[int]]]:
    layout = {}
    for position, dtype in enumerate(DTYPES):
        where = ("model.layers.0.", "model.layers.1.", "model.")[position % 3]
        layout[f"{where}{dtype.lower()}"] = (dtype, _SHAPES.get(dtype, [3, 2]))
    return layout


def write_raw(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> Path:
    """A safetensors file from raw tensor bytes, in the format's own layout."""
    header, offset, data = {}, 0, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset, data = offset + len(raw), data + raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def every_dtype_checkpoint(folder: Path, seed: int) -> dict[str, bytes]:
    """A two-shard checkpoint with one tensor of each safetensors dtype; returns name -> bytes."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    tensors = {}
    for name, (dtype, shape) in _layout().items():
        numel, info = math.prod(shape), DTYPES[dtype]
        if info.kind in ("float", "complex") and info.torch_name and dtype != "F8_E8M0":
            values = torch.randn(numel, generator=gen, dtype=torch.float32)
            if dtype == "C64":
                values = torch.complex(values, -values)
            raw = values.to(torch_dtype(dtype)).view(torch.uint8).numpy().tobytes()
        else:  # packed floats, scales (0xFF is E8M0's NaN), integers, bool
            top = {"BOOL": 2, "F8_E8M0": 255}.get(dtype, 256)
            raw = bytes(rng.randrange(top) for _ in range(nbytes(dtype, numel)))
        tensors[name] = (dtype, shape, raw)
    names = list(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    for file, members in shards.items():
        write_raw(folder / file, {n: tensors[n] for n in members})
    weight_map = {n: f for f, members in shards.items() for n in members}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return {name: raw for name, (_, _, raw) in tensors.items()}


def parsed_by_safetensors(folder: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """Every tensor of a folder as safetensors' own (Rust) parser reads it."""
    tensors = {}
    for shard in sorted(folder.glob("*.safetensors")):
        for name, view in safetensors.deserialize(shard.read_bytes()):
            tensors[name] = (view["dtype"], view["shape"], bytes(view["data"]))
    return tensors


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_the_table_covers_every_dtype_safetensors_parses(tmp_path):
    for dtype in DTYPES:
        shape = _SHAPES.get(dtype, [3])
        path = write_raw(
            tmp_path / f"{dtype}.safetensors",
            {"t": (dtype, shape, bytes(nbytes(dtype, math.prod(shape))))},
        )
        ((_, view),) = safetensors.deserialize(path.read_bytes())
        assert view["dtype"] == dtype and len(view["data"]) == read_shard(path).tensors[0].nbytes
    # A name safetensors does not define is refused by both.
    path = write_raw(tmp_path / "c128.safetensors", {"t": ("C128", [1], bytes(16))})
    with pytest.raises(Exception, match="C128|unknown variant"):
        safetensors.deserialize(path.read_bytes())
    with pytest.raises(CheckpointError, match="unknown dtype 'C128'"):
        read_shard(path)


def test_torch_dtypes_match_safetensors_torch_and_packed_ones_are_refused():
    from safetensors.torch import _getdtype

    for dtype, info in DTYPES.items():
        if info.torch_name is None:
            with pytest.raises(SurgeryError, match="can be copied but not decoded"):
                torch_dtype(dtype)
            with pytest.raises(SurgeryError, match="no whole-byte item size"):
                itemsize(dtype)
            continue
        assert torch_dtype(dtype).itemsize * 8 == info.bits
        try:
            theirs = _getdtype(dtype)
        except KeyError:  # F8_E8M0: safetensors.torch has no mapping for it yet
            continue
        assert theirs == torch_dtype(dtype), dtype
    # Only real floats torch can widen and round back are averaged.
    assert {"C64", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0", "F4", "I64", "BOOL"}.isdisjoint(
        FLOAT_DTYPES
    )
    assert {"F32", "BF16", "F16", "F64"} <= FLOAT_DTYPES


def test_packed_tensors_must_fill_whole_bytes(tmp_path):
    path = write_raw(tmp_path / "odd.safetensors", {"t": ("F4", [3], bytes(2))})
    with pytest.raises(Exception, match="byte boundary"):
        safetensors.deserialize(path.read_bytes())
    with pytest.raises(CheckpointError, match="3 F4 elements do not fill whole bytes"):
        read_shard(path)
    with pytest.raises(CheckpointError, match="3 bytes for shape \\[4\\] of F4 \\(expected 2\\)"):
        read_shard(write_raw(tmp_path / "long.safetensors", {"t": ("F4", [4], bytes(3))}))


def test_every_dtype_is_inspected_verified_and_reverted(tmp_path):
    base_bytes = every_dtype_checkpoint(tmp_path / "base", seed=1)
    trained_bytes = every_dtype_checkpoint(tmp_path / "trained", seed=2)

    result = run("inspect", "--json", tmp_path / "trained")
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert set(info["dtypes"]) == set(DTYPES)
    assert info["bytes"] == sum(len(raw) for raw in trained_bytes.values())
    assert info["stacks"] == [{"name": "text", "prefix": "model.layers", "layers": 2, "beyond": 0}]
    result = run("inspect", tmp_path / "trained")
    assert result.exit_code == 0 and "F8_E4M3FNUZ" in result.output and "C64" in result.output
    result = run("verify", "--values", tmp_path / "trained")
    assert result.exit_code == 0 and result.output.strip().endswith("ok"), result.output

    out = tmp_path / "reverted"
    result = run("revert", "--layers", "0", "-q", tmp_path / "base", tmp_path / "trained", out)
    assert result.exit_code == 0, result.output
    written = parsed_by_safetensors(out)  # safetensors' own parser accepts every shard
    assert set(written) == set(trained_bytes)
    for name, (dtype, shape) in _layout().items():
        expected = base_bytes[name] if name.startswith("model.layers.0.") else trained_bytes[name]
        assert written[name] == (dtype, shape, expected), name
    # Where safetensors' torch loader knows the dtype, it loads the same values.
    for shard in out.glob("*.safetensors"):
        with safe_open(shard, framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118
                if name.endswith(("f8_e4m3fnuz", "f8_e5m2fnuz", "c64")):
                    tensor = handle.get_tensor(name)
                    assert tensor.dtype == torch_dtype(written[name][0])
                    assert (
                        tensor.contiguous().view(torch.uint8).numpy().tobytes()
                        == (written[name][2])
                    )
    # The byte copy of an every-dtype checkpoint reverted onto itself is the input, shard for
    # shard, tensor for tensor.
    same = tmp_path / "same"
    result = run("revert", "--layers", "0:2", "-q", tmp_path / "base", tmp_path / "base", same)
    assert result.exit_code == 0, result.output
    assert parsed_by_safetensors(same) == parsed_by_safetensors(tmp_path / "base")


def test_non_float_tensors_are_copied_never_averaged(tmp_path):
    every_dtype_checkpoint(tmp_path / "a", seed=1)
    every_dtype_checkpoint(tmp_path / "b", seed=2)
    a, b = open_checkpoint(tmp_path / "a"), open_checkpoint(tmp_path / "b")
    with pytest.raises(MismatchError, match="only float tensors are averaged"):
        plan_soup([a, b])
    # Identical non-float tensors (complex, FNUZ, packed, integer) are byte copies in a soup.
    copies = [t for t in plan_soup([a, a]).tensors if t.dtype not in FLOAT_DTYPES]
    assert copies and all(t.is_copy for t in copies)
    assert {t.dtype for t in copies} >= {"C64", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4", "F6_E3M2"}


def test_compute_dtype_names_what_a_model_runs_in():
    """One parse for eval's and train's dtypes: the float dtypes a model computes in, by any of
    their names; anything else (an 8-bit float, an int, a typo) is None for the caller to
    refuse."""
    names = {"bf16": "BF16", "bfloat16": "BF16", "FP16": "F16", " float32 ": "F32", "f64": "F64"}
    assert {text: compute_dtype(text) for text in names} == names
    assert [compute_dtype(t) for t in ("F8_E4M3", "int8", "I32", "float8", "")] == [None] * 5

"""The header reader: real checkpoints, and a folder of hostile files built byte by byte."""

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from surgery.core.errors import CheckpointError
from surgery.engine.reader import open_checkpoint, read_shard


def raw_file(path, header: dict, data: bytes, length: int | None = None):
    """Write a safetensors file from a header dict and raw data, optionally lying about length."""
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)
    return path


def good_header():
    return {
        "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "b": {"dtype": "BF16", "shape": [4], "data_offsets": [16, 24]},
    }


def test_reads_real_sharded_checkpoint(families):
    paths = families("llama")
    ckpt = open_checkpoint(paths["base"])
    assert len(ckpt.shards) == 3
    assert ckpt.stacks[0].num_layers == 4
    from safetensors import safe_open

    for shard in ckpt.shards:
        with safe_open(shard.path, "pt") as handle:
            for tensor in shard.tensors:
                expected = handle.get_tensor(tensor.name)
                raw = shard.path.read_bytes()[tensor.start : tensor.start + tensor.nbytes]
                got = torch.frombuffer(bytearray(raw), dtype=expected.dtype).reshape(expected.shape)
                assert torch.equal(got, expected)


def test_single_file_and_unindexed_folder(tmp_path):
    save_file({"w": torch.ones(3, 3)}, tmp_path / "model.safetensors")
    assert list(open_checkpoint(tmp_path / "model.safetensors").tensors) == ["w"]
    assert open_checkpoint(tmp_path).tensors["w"].shape == (3, 3)
    save_file({"v": torch.ones(1)}, tmp_path / "other.safetensors")
    with pytest.raises(CheckpointError, match="2 .safetensors files but no"):
        open_checkpoint(tmp_path)


def test_a_checkpoint_keeps_the_root_its_files_may_live_in(tmp_path):
    """Found once, when the checkpoint is opened (the writer's companion files stay inside it):
    the folder itself, a cache snapshot's repository folder, nothing for a bare file."""
    repo = tmp_path / "models--org--name"
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    save_file({"w": torch.ones(2)}, snapshot / "model.safetensors")
    plain = tmp_path / "plain"
    plain.mkdir()
    save_file({"w": torch.ones(2)}, plain / "model.safetensors")
    assert open_checkpoint(snapshot).root == repo
    assert open_checkpoint(plain).root == plain
    assert open_checkpoint(plain / "model.safetensors").root is None


def test_valid_raw_file_parses(tmp_path):
    shard = read_shard(raw_file(tmp_path / "ok.safetensors", good_header(), bytes(24)))
    assert [(t.name, t.start - shard.data_start, t.nbytes) for t in shard.tensors] == [
        ("a", 0, 16),
        ("b", 16, 8),
    ]


HOSTILE = {
    "too_short": (None, None, None, "too short"),
    "header_length_past_end": (good_header(), bytes(24), 10**6, "does not fit"),
    "not_json": ("garbage", bytes(0), None, "not JSON"),
    "not_object": ([1, 2], bytes(0), None, "not a JSON object"),
    "unknown_dtype": (
        {"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}},
        bytes(1),
        None,
        "unknown dtype",
    ),
    "shape_mismatch": (
        {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
        bytes(8),
        None,
        "8 bytes for shape",
    ),
    "overlapping": (
        {
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
        },
        bytes(12),
        None,
        "overlaps",
    ),
    "gap": (
        {
            "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
            "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
        },
        bytes(12),
        None,
        "leaves a gap",
    ),
    "truncated": (good_header(), bytes(20), None, "truncated"),
    "trailing_bytes": (good_header(), bytes(30), None, "after the last tensor"),
    "bad_offsets": (
        {"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}},
        bytes(4),
        None,
        "bad data_offsets",
    ),
    "bad_metadata": (
        {"__metadata__": {"k": 1}, **good_header()},
        bytes(24),
        None,
        "__metadata__",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_files_are_refused(tmp_path, case):
    header, data, length, message = HOSTILE[case]
    path = tmp_path / f"{case}.safetensors"
    if header is None:
        path.write_bytes(b"\x01\x02")
    elif isinstance(header, str):
        text = header.encode()
        path.write_bytes(struct.pack("<Q", len(text)) + text)
    else:
        raw_file(path, header, data, length)
    with pytest.raises(CheckpointError, match=message) as error:
        read_shard(path)
    assert str(path) in str(error.value)


def test_index_inconsistencies(tmp_path, families):
    import shutil

    folder = tmp_path / "ckpt"
    shutil.copytree(families("llama")["base"], folder)
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    name = next(iter(index["weight_map"]))
    index["weight_map"]["ghost.weight"] = index["weight_map"][name]
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="has no such tensor"):
        open_checkpoint(folder)
    del index["weight_map"]["ghost.weight"]
    index["weight_map"][name] = "model-00009-of-00009.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="missing: model-00009"):
        open_checkpoint(folder)
    index_path.write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable index"):
        open_checkpoint(folder)


def test_missing_path_and_bin_only_folder(tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        open_checkpoint(tmp_path / "nope")
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="convert .bin"):
        open_checkpoint(tmp_path)

"""Shards written side by side: each shard's sha256 stays exact, a revert keeps TRAINED's shard
layout (so its shards hash on separate cores), and an error in one shard leaves nothing."""

from __future__ import annotations

import json
import os
import threading

import pytest

from surgery.api import revert, soup
from surgery.core import threads
from surgery.engine import shard_hash, writer
from tests.support.checks import assert_valid_output


def _groups(folder) -> list[list[str]]:
    """The tensor names of each shard of `folder`, in file order."""
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    files = sorted(set(weight_map.values()))
    return [sorted(n for n, f in weight_map.items() if f == file) for file in files]


def test_revert_keeps_trained_shard_layout(families, tmp_path):
    paths = families("llama")
    out = revert(paths["base"], paths["trained"], tmp_path / "out", "1:3", quiet=True)
    assert_valid_output(out)
    assert len(_groups(paths["trained"])) > 1
    assert _groups(out) == _groups(paths["trained"])


def test_revert_splits_by_size_when_a_trained_shard_is_too_large(families, tmp_path):
    paths = families("llama")
    trained = _groups(paths["trained"])
    out = revert(
        paths["base"], paths["trained"], tmp_path / "out", "1", max_shard_size=30_000, quiet=True
    )
    assert_valid_output(out)
    assert len(_groups(out)) > len(trained)


@pytest.fixture
def in_flight(monkeypatch):
    """The most shard hashes alive at once (created, digest not yet taken), with two workers."""
    monkeypatch.setattr(threads, "_current", threads.ThreadPlan(2, 2))
    lock, alive, peak = threading.Lock(), [0], [0]
    init, digest = shard_hash.OrderedHash.__init__, shard_hash.OrderedHash.hexdigest

    def counted_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        with lock:
            alive[0] += 1
            peak[0] = max(peak[0], alive[0])

    def counted_digest(self, size):
        with lock:
            alive[0] -= 1
        return digest(self, size)

    monkeypatch.setattr(shard_hash.OrderedHash, "__init__", counted_init)
    monkeypatch.setattr(shard_hash.OrderedHash, "hexdigest", counted_digest)
    return peak


@pytest.mark.parametrize("operation", ["revert", "soup"])
def test_shards_are_written_side_by_side_with_exact_hashes(
    families, tmp_path, in_flight, operation
):
    paths = families("llama")
    if operation == "revert":
        out = revert(paths["base"], paths["trained"], tmp_path / "out", "0:2", quiet=True)
    else:  # blends: early chunks wait as copies, bounded over all the shards in flight
        out = soup(paths["experts"], tmp_path / "out", max_shard_size=30_000, quiet=True)
    assert_valid_output(out)  # every shard's recorded sha256 against hashlib's
    assert len(list(out.glob("*.safetensors"))) > 2
    assert in_flight[0] == 2  # two workers: two shards at once, never more


def test_an_error_in_a_later_shard_leaves_nothing(families, tmp_path, monkeypatch):
    paths = families("llama")
    last = _groups(paths["trained"])[-1][0]
    copy = writer._TensorWriter._copy

    def failing(self, fd, tensor, offset):
        if tensor.name == last:
            raise OSError(5, "Input/output error")
        copy(self, fd, tensor, offset)

    monkeypatch.setattr(writer._TensorWriter, "_copy", failing)
    with pytest.raises(Exception, match="input/output error"):
        revert(paths["base"], paths["trained"], tmp_path / "out", "1", quiet=True)
    assert list(tmp_path.iterdir()) == []  # no output, no staging folder


def test_a_reserved_shard_keeps_its_size_until_written(tmp_path):
    # The writer reserves each shard's blocks up front: the size still says what was written
    # (the writer's check that a shard is whole), and an over-large request is refused.
    from surgery.engine.file_space import reserve

    path = tmp_path / "shard"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        reserve(fd, 2**20)
        assert os.fstat(fd).st_size == 0
        if os.fstat(fd).st_blocks == 0:
            pytest.skip("this file system reserves no blocks")
        assert os.fstat(fd).st_blocks * 512 >= 2**20
        os.pwrite(fd, b"x" * 100, 0)
        assert os.fstat(fd).st_size == 100
        with pytest.raises(OSError):
            reserve(fd, 2**62)  # beyond any file system's largest file
    finally:
        os.close(fd)

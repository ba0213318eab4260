"""The writer's second source kind (tensors held in memory), explicit shard layouts, and carrying
entries of an existing output: what training saves through."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from surgery.core.errors import OutputError
from surgery.engine.output_dir import staged_output
from surgery.engine.plan import Plan, copy_of, from_memory
from surgery.engine.reader import open_checkpoint
from surgery.engine.writer import CHUNK_ELEMENTS, execute


def _load(path):
    with safe_open(path, framework="pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118


@pytest.fixture
def source(tmp_path):
    folder = tmp_path / "source"
    folder.mkdir()
    save_file(
        {"kept": torch.randn(7, 5).to(torch.bfloat16), "ids": torch.arange(9)},
        folder / "model.safetensors",
    )
    (folder / "config.json").write_text('{"model_type": "llama"}')
    return open_checkpoint(folder)


def test_memory_tensors_are_rounded_once_and_laid_out_as_asked(source, tmp_path):
    gen = torch.Generator().manual_seed(0)
    big = torch.randn(3 * CHUNK_ELEMENTS + 11, generator=gen)  # several chunks, a ragged tail
    square = torch.randn(64, 48, generator=gen).t()  # not contiguous
    values = {
        "big": (big, "BF16"),
        "square": (square, "F32"),
        "steps": (torch.arange(5) * 3, "I64"),
        "mask": (torch.tensor([True, False, True]), "BOOL"),
        "scalar": (torch.tensor(2.5, dtype=torch.float64), "F16"),
    }
    tensors = [from_memory(name, v, dtype) for name, (v, dtype) in values.items()]
    tensors += [copy_of(source.tensors["kept"]), copy_of(source.tensors["ids"])]
    layout = {
        "first.safetensors": ["square", "kept", "scalar"],
        "second.safetensors": ["ids", "big", "mask", "steps"],
    }
    plan = Plan("test", tensors, {"operation": "test"}, files_from=source, shards=layout)
    out = execute(plan, tmp_path / "out", quiet=True)

    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {n: f for f, names in layout.items() for n in names}
    assert index["metadata"]["total_parameters"] == sum(
        v.numel() for v, _ in values.values()
    ) + sum(t.numel for t in source)
    assert sorted(p.name for p in out.glob("*.safetensors")) == sorted(layout)
    loaded = _load(out / "first.safetensors") | _load(out / "second.safetensors")
    for name, (value, _) in values.items():
        expected = value.to(loaded[name].dtype)  # the one rounding, as torch does it
        assert loaded[name].shape == value.shape
        assert torch.equal(
            loaded[name].view(-1).view(torch.uint8), expected.reshape(-1).view(torch.uint8)
        )
    original = _load(source.path / "model.safetensors")
    assert all(torch.equal(loaded[n], original[n]) for n in original)
    assert (out / "config.json").read_bytes() == (source.path / "config.json").read_bytes()


def test_one_output_file_needs_no_index_and_layouts_must_be_exact(source, tmp_path):
    tensors = [copy_of(t) for t in source]
    single = Plan(
        "t", tensors, {}, files_from=source, shards={"model.safetensors": ["ids", "kept"]}
    )
    out = execute(single, tmp_path / "one", quiet=True)
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "surgery_recipe.json",
    ]
    for layout in ({"model.safetensors": ["ids"]}, {"a": ["ids", "kept"], "b": ["kept"]}):
        plan = Plan("t", tensors, {}, files_from=source, shards=layout)
        with pytest.raises(ValueError, match="layout"):
            execute(plan, tmp_path / "bad", quiet=True)
        assert not (tmp_path / "bad").exists()


def test_memory_tensor_shape_and_dtype_are_checked_when_planned():
    with pytest.raises(Exception, match="F4 tensors can be copied but not decoded"):
        from_memory("x", torch.zeros(4), "F4")
    assert from_memory("x", torch.zeros(2, 3, requires_grad=True), "F32").shape == (2, 3)


def test_staged_output_carries_named_entries_of_the_old_output(tmp_path):
    out = tmp_path / "out"
    (out / "checkpoints" / "checkpoint-3").mkdir(parents=True)
    (out / "checkpoints" / "checkpoint-3" / "state.json").write_text("{}")
    (out / "runs").mkdir()
    (out / "old.txt").write_text("old")
    with staged_output(out, carry=["checkpoints", "gone", "config.json"]) as staging:
        (staging / "config.json").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "config.json"]
    assert (out / "checkpoints" / "checkpoint-3" / "state.json").is_file()
    assert (out / "config.json").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging or old folder left


def test_staged_output_refuses_more_bytes_than_its_disk_has_and_leaves_nothing(tmp_path):
    out = tmp_path / "sub" / "out"
    needed = shutil.disk_usage(tmp_path).free + 2**30
    with pytest.raises(OutputError, match="the output needs"), staged_output(out, needed=needed):
        pytest.fail("the body must not run")
    assert list(tmp_path.iterdir()) == []  # no staging folder, no parent created for it

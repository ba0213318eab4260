"""Edge inputs that raised tracebacks (issue 24, item 7): empty tensors in sparsified merges,
shard sizes that cannot be counted, index names no file can have. Where mergekit succeeds
(empty tensors) surgery gives its result; everything else is one line, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

from tests.hostile.support import assert_refused, fingerprint, invoke
from tests.support.checks import assert_valid_output

EMPTY = {"e0": (0,), "e1": (4, 0), "e2": (0, 4)}


def _checkpoint(folder: Path, seed: int) -> Path:
    folder.mkdir(parents=True)
    generator = torch.Generator().manual_seed(seed)
    state = {"w": torch.randn(4, 4, generator=generator)}
    state |= {name: torch.ones(shape) for name, shape in EMPTY.items()}
    save_file(state, folder / "model.safetensors")
    return folder


@pytest.mark.parametrize(
    "method", ["ties", "breadcrumbs", "breadcrumbs_ties", "dare_ties", "della", "della_linear"]
)
def test_sparsified_merges_of_empty_tensors_give_empty_tensors(tmp_path, method):
    # TIES and Breadcrumbs raised StopIteration, DELLA on (4, 0) ZeroDivisionError. mergekit's
    # sparsifiers return an empty tensor of the same shape (DELLA's fails on (0,) and (4, 0)
    # with an IndexError, and works on (0, 4): there is only one possible result).
    from mergekit.sparsify import SparsificationMethod, sparsify

    base = _checkpoint(tmp_path / "base", 0)
    experts = [_checkpoint(tmp_path / f"e{i}", i) for i in (1, 2)]
    params = {"weight": 0.5, "density": 0.5}
    config = {
        "merge_method": method,
        "base_model": str(base),
        "models": [{"model": str(e), "parameters": params} for e in experts],
    }
    (tmp_path / "merge.yml").write_text(yaml.safe_dump(config))
    result = invoke("merge", "-q", tmp_path / "merge.yml", tmp_path / "out")
    assert result.exit_code == 0, result.output
    state = assert_valid_output(tmp_path / "out")
    kind = {"ties": "magnitude", "dare_ties": "random"}.get(method, "magnitude_outliers")
    for name, shape in EMPTY.items():
        theirs = sparsify(torch.ones(shape), 0.5, SparsificationMethod(kind), gamma=0.01)
        assert state[name].shape == theirs.shape == shape and state[name].dtype == torch.float32


@pytest.mark.parametrize(
    ("size", "message"),
    [
        ("inf", "cannot parse size 'inf'"),
        ("1e400", "cannot parse size '1e400'"),
        ("1e300GB", "cannot parse size '1e300GB'"),
        ("nan", "cannot parse size 'nan'"),
        ("0.4", "size '0.4' is less than one byte"),
    ],
)
def test_shard_sizes_that_cannot_be_counted_are_refused(tmp_path, size, message):
    # inf and 1e400 raised OverflowError; 0.4 meant 0 bytes (a shard per tensor).
    experts = [_checkpoint(tmp_path / "inputs" / f"e{i}", i) for i in (1, 2)]
    out = tmp_path / "out"
    result = invoke("soup", "--max-shard-size", size, *experts, out)
    assert_refused(result, out, message=message)


def test_fractional_sizes_with_a_unit_still_count():
    from surgery.core.sizes import parse_size

    assert parse_size("0.4KB") == 400 and parse_size("1.5") == 1


def _indexed(folder: Path, files: dict[str, str]) -> Path:
    """Two shards and an index whose JSON text maps tensors `a`, `b` to `files` (raw JSON
    strings, escapes included)."""
    folder.mkdir(parents=True)
    for i, name in enumerate(("a", "b")):
        save_file({f"model.layers.{i}.{name}": torch.ones(4)}, folder / f"s{i}.safetensors")
    pairs = ",".join(f'"model.layers.{i}.{n}":{files[n]}' for i, n in enumerate(("a", "b")))
    (folder / "model.safetensors.index.json").write_text('{"weight_map":{' + pairs + "}}")
    return folder


GOOD = {"a": '"s0.safetensors"', "b": '"s1.safetensors"'}
BAD_INDEXES = [
    (GOOD | {"b": '"s1\\u0000.safetensors"'}, "not a file name (a NUL byte)"),
    (GOOD | {"b": '"s1\\ud800.safetensors"'}, "holds a lone surrogate (not text)"),
    (GOOD | {"b": '"s1\\udc80.safetensors"'}, "holds a lone surrogate (not text)"),
]


@pytest.mark.parametrize(("files", "message"), BAD_INDEXES)
def test_index_names_no_file_can_have_are_one_line(tmp_path, files, message):
    # A NUL byte raised ValueError (exit 1) in inspect, verify and revert; a lone surrogate
    # UnicodeEncodeError.
    base = _indexed(tmp_path / "base", GOOD)
    bad = _indexed(tmp_path / "bad", files)
    before = fingerprint(base, bad)
    result = invoke("inspect", bad)
    assert result.exit_code == 2 and result.stderr.strip().endswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = invoke("revert", "--layers", "0", base, bad, tmp_path / "out")
    assert_refused(result, tmp_path / "out", message=message)
    result = invoke("verify", bad)  # a defect report: exit 1, no traceback
    assert result.exit_code == 1 and f"defect: {bad}" in result.output, result.output
    assert message in result.output and isinstance(result.exception, (SystemExit, type(None)))
    assert fingerprint(base, bad) == before


def test_index_keys_with_a_lone_surrogate_are_one_line(tmp_path):
    base = _indexed(tmp_path / "base", GOOD)
    bad = _indexed(tmp_path / "bad", GOOD)
    index = bad / "model.safetensors.index.json"
    index.write_text(index.read_text().replace('"model.layers.1.b"', '"model.layers.1.\\ud800"'))
    result = invoke("revert", "--layers", "0", base, bad, tmp_path / "out")
    assert_refused(result, tmp_path / "out", message="holds a lone surrogate (not text)")
    assert json.loads(index.read_text())  # Python's json accepts it: the reader must not


def test_a_valid_index_still_opens(tmp_path):
    base = _indexed(tmp_path / "base", GOOD)
    trained = _indexed(tmp_path / "trained", GOOD)
    result = invoke("revert", "-q", "--layers", "0", base, trained, tmp_path / "out")
    assert result.exit_code == 0, result.output
    # The output keeps TRAINED's layout (two files here), as a revert does.
    assert set(assert_valid_output(tmp_path / "out")) == {
        "model.layers.0.a",
        "model.layers.1.b",
    }

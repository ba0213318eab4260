"""One option set for every writing command: declared once, parsed once, passed on as it is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import surgery.api
from cli import cli
from surgery.core.errors import SurgeryError
from surgery.engine.ops.merge.registry import METHODS
from surgery.options import WriteOptions

ROOT = Path(__file__).resolve().parents[1]
# surgery/option_table.py names every option (its meaning) and declares none.
SOURCES = [
    ROOT / "cli.py",
    *(
        p
        for d in ("surgery", "eval", "train", "demo", "diagnose")
        for p in (ROOT / d).rglob("*.py")
        if p != ROOT / "surgery" / "option_table.py"
    ),
]


@pytest.mark.parametrize("flag", ['"--max-shard-size"', '"--push-to"', '"--download"', '"-q"'])
def test_each_write_option_is_declared_once(flag):
    places = [str(p.relative_to(ROOT)) for p in SOURCES if flag in p.read_text(encoding="utf-8")]
    assert places == ["surgery/options.py"], places


# command line -> (the surgery.api function it calls, its extra options)
COMMANDS = {
    "revert": ("revert", ["--layers", "1:2", "b", "t", "o"]),
    "soup": ("soup", ["a", "b", "o"]),
    "interpolate": ("interpolate", ["--alpha", "0.5", "b", "t", "o"]),
    "merge": ("merge", ["c.yml", "o"]),
    "extract-lora": ("extract_lora", ["b", "t", "o"]),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_writing_command_hands_the_api_one_parsed_value(command, monkeypatch, tmp_path):
    name, argv = COMMANDS[command]
    seen = {}

    def record(*args, write, **kwargs):
        seen["write"] = write
        return tmp_path

    monkeypatch.setattr(surgery.api, name, record)
    extra = ["--download", "-q", "--force"]
    if command not in ("merge", "extract-lora"):
        extra += ["--dtype", "bf16"]
    if command != "extract-lora":
        extra += ["--max-shard-size", "500MB"]
    result = CliRunner().invoke(cli, [command, *extra, *argv])
    assert result.exit_code == 0, result.output
    write = seen["write"]
    assert isinstance(write, WriteOptions)
    assert (write.download, write.quiet, write.force, write.push_to) == (True, True, True, None)
    assert write.dtype == (None if command in ("merge", "extract-lora") else "BF16")
    assert write.max_shard_size == (5 * 10**9 if command == "extract-lora" else 500 * 10**6)


def test_values_are_parsed_where_they_are_made():
    assert WriteOptions(dtype="fp16", max_shard_size="2GiB") == WriteOptions(
        dtype="F16", max_shard_size=2 * 2**30
    )
    assert WriteOptions().with_(quiet=True).quiet
    with pytest.raises(TypeError):
        WriteOptions().with_(shard_size=1)
    with pytest.raises(SurgeryError, match="bogus"):
        WriteOptions(dtype="bogus")


def test_merge_refuses_a_dtype_its_config_sets(tmp_path):
    with pytest.raises(SurgeryError, match="the config's dtype"):
        surgery.api.merge(tmp_path / "c.yml", tmp_path / "o", dtype="bf16")


def test_merge_help_lists_every_registered_method():
    result = CliRunner().invoke(cli, ["merge", "--help"])
    text = re.sub(r"\s+", " ", result.output)
    listed = re.search(r"Methods: ([a-z_, ]+)\.", text).group(1).split(", ")
    assert listed == list(METHODS)

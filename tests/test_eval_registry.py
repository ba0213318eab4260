"""The eval task registry, the shared eval options and the shared text reader."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cli import cli
from eval.data import read_documents
from eval.errors import EvalDataError
from eval.options import eval_options
from eval.tasks import KINDS, REQUIRED, kinds_markdown, parse_task
from surgery.core.textfiles import DataFileError, iter_documents
from train.data import iter_documents as train_documents
from train.errors import TrainConfigError
from train.sources import DataSource

# The docs page that lists the task kinds (generated from the registry).
KINDS_PAGE = Path(__file__).parents[1] / "docs" / "evaluation.md"


def test_every_kind_has_a_loader_and_parses_with_its_defaults():
    assert all(callable(kind.loader) for kind in KINDS.values())
    for kind in KINDS.values():
        required = ",".join(f"{k}=x" for k, o in kind.options.items() if o.default is REQUIRED)
        text = kind.name + (":somewhere" if kind.needs_path else "")
        spec = parse_task(text + (f":{required}" if required else ""))
        assert set(spec.options) == {"name", *kind.options}


def test_docs_task_list_is_the_registry():
    text = KINDS_PAGE.read_text(encoding="utf-8")
    block = text.split("<!-- eval-kinds:start -->\n")[1].split("\n<!-- eval-kinds:end -->")[0]
    assert block == kinds_markdown()


def test_eval_help_lists_every_kind_and_option():
    result = CliRunner().invoke(cli, ["eval", "--help"])
    assert result.exit_code == 0
    for kind in KINDS.values():
        assert kind.usage() in result.output
        for key in kind.options:
            assert f"{key}:" in result.output
    # The old spellings work but are not advertised.
    assert "--eval " not in result.output and "--dtype" not in result.output.replace("-dtype", "")


def test_parsing_task_strings_does_not_import_torch():
    code = (
        "import sys\nfrom eval.tasks import parse_task\nfrom eval.command import eval_command\n"
        "parse_task('belebele:x.jsonl:shots=0')\n"
        "assert 'torch' not in sys.modules"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@click.command()
@eval_options
def _echo(tasks, scoring):
    click.echo(json.dumps({"tasks": list(tasks), **asdict(scoring)}, sort_keys=True))


@pytest.mark.parametrize(
    ("canonical", "alias", "notes"),
    [
        (["-t", "copain", "--task", "ppl:x"], ["--eval", "copain", "--eval", "ppl:x"], 1),
        (["-t", "copain", "--eval-dtype", "bf16"], ["--eval", "copain", "--dtype", "bf16"], 2),
    ],
)
def test_old_spellings_are_aliases_of_the_canonical_ones(canonical, alias, notes):
    runner = CliRunner()
    one, two = runner.invoke(_echo, canonical), runner.invoke(_echo, alias)
    assert one.exit_code == two.exit_code == 0, (one.output, two.output)
    assert one.stdout == two.stdout and one.stderr == ""
    # One note per old spelling, naming the new one.
    assert len(two.stderr.splitlines()) == notes and "is now -" in two.stderr
    values = json.loads(one.stdout)
    assert values["device"] is None and values["batch_size"] == 8 and values["seed"] == 0


def test_conflicting_dtype_spellings_are_refused():
    result = CliRunner().invoke(_echo, ["--eval-dtype", "bf16", "--dtype", "fp32"])
    assert result.exit_code == 2 and "give it once" in result.output


def test_sweep_and_localize_take_the_same_options():
    def names(command):
        return {p.name for p in cli.commands[command].params}

    own = {"checkpoint", "fewshot_seeds", "allow_missing", "tokenizer", "log_samples"}
    assert names("sweep") & names("localize") >= names("eval") - own - {"no_prefix_cache"}


def _write_files(root: Path) -> list[Path]:
    root.mkdir()
    (root / "a.txt").write_text("first doc\r\nstill first\n\n\n second doc \n", encoding="utf-8")
    rows = [{"text": "x y"}, {"text": " "}, {"text": "z\n\nw"}]
    lines = "\n".join(json.dumps(r) for r in rows) + "\n\n"
    (root / "b.jsonl").write_text("\ufeff" + lines, encoding="utf-8")
    with gzip.open(root / "c.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write(lines)
    return [root / "a.txt", root / "b.jsonl", root / "c.jsonl.gz"]


def test_train_and_eval_read_the_same_documents(tmp_path):
    files = _write_files(tmp_path / "data")
    expected = ["first doc\nstill first", " second doc ", "x y", "z\n\nw", "x y", "z\n\nw"]
    assert [d for f in files for d in iter_documents(f)] == expected
    assert [d for f in files for d in read_documents(f)] == expected
    source = DataSource("d", str(tmp_path / "data"))
    assert list(train_documents(source)) == expected


def test_reader_errors_name_file_and_line_in_the_callers_type(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"body": 1}\n', encoding="utf-8")
    for error in (DataFileError, EvalDataError, TrainConfigError):
        with pytest.raises(error, match=r"bad\.jsonl:2: no string 'text' field"):
            list(iter_documents(bad, error))

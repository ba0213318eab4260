"""Every option name has one meaning across the commands (surgery.option_table), output follows
one rule, and old spellings still run with one note."""

from __future__ import annotations

from collections import defaultdict

import click
import pytest
from click.testing import CliRunner

from cli import cli
from surgery.option_table import OPTIONS, RENAMED

CHECKPOINT_WRITERS = ("revert", "soup", "interpolate", "merge", "extract-lora", "train")
FOLDER_WRITERS = ("eval", "compare", "sweep", "localize", "search", "demo")


def _params():
    """(command, parameter) for every parameter of every command, hidden ones included."""
    return [(name, param) for name, command in cli.commands.items() for param in command.params]


def _default(param: click.Option):
    # A required option and one without a default are alike: neither has a default value.
    default = param.default
    return None if default is None or repr(default).endswith("UNSET") else default


def _signature(param: click.Option, meaning) -> tuple:
    """What must agree between two commands' options of one name: kind, default (unless the
    table allows it to differ), then help."""
    flag = bool(param.is_flag)
    default = None if meaning.defaults or flag else _default(param)
    return flag, bool(param.multiple), default, param.help


def _meanings(uses: list[tuple[str, tuple]], meaning) -> set[tuple]:
    """The distinct signatures of one name; the help is left out where the table allows the
    command its own wording."""
    return {
        sig[:3] if meaning.wording and (not meaning.worded or command in meaning.worded) else sig
        for command, sig in uses
    }


def _one_meaning(uses: list[tuple[str, tuple]], meaning) -> bool:
    distinct = _meanings(uses, meaning)
    return len(distinct) <= 1 or (
        len({sig[:3] for sig in distinct}) == 1 and sum(len(sig) == 4 for sig in distinct) <= 1
    )


def meaning_problems() -> list[str]:
    """Every name used but not in the table, used with two meanings, or without help; every old
    spelling not declared in RENAMED; every table entry no command uses."""
    problems, seen = [], defaultdict(list)
    for command, param in _params():
        if hasattr(param, "renamed_to"):
            if RENAMED.get((command, param.renamed_from)) != param.renamed_to:
                problems.append(f"{command} {param.renamed_from}: an old spelling not in RENAMED")
            continue
        if not isinstance(param, click.Option):
            continue
        if not param.hidden and not param.help:
            problems.append(f"{command} {param.opts[-1]}: no help")
        for name in (*param.opts, *param.secondary_opts):
            if name not in OPTIONS:
                problems.append(f"{command} {name}: not in surgery.option_table.OPTIONS")
                continue
            meaning = OPTIONS[name]
            if meaning.text.startswith("short for "):
                long = meaning.text.removeprefix("short for ")
                if long not in param.opts:
                    problems.append(f"{command} {name}: short for {long}, but not here")
                meaning = OPTIONS[long]
            seen[name].append((command, _signature(param, meaning)))
    for name, uses in seen.items():
        meaning = OPTIONS[name]
        if meaning.text.startswith("short for "):
            meaning = OPTIONS[meaning.text.removeprefix("short for ")]
        if not _one_meaning(uses, meaning):
            where = "; ".join(f"{command}: {sig}" for command, sig in uses)
            problems.append(f"{name}: {len(_meanings(uses, meaning))} meanings ({where})")
    problems += [f"{name}: in the table, in no command" for name in OPTIONS if name not in seen]
    return problems


def test_every_option_name_has_one_meaning_in_the_table():
    assert meaning_problems() == []


def test_a_second_meaning_is_found():
    """The walk is no formality: an option reusing a name with another help is caught."""
    command = cli.commands["drift"]
    extra = click.Option(["--blocks"], default=None, help="Another meaning.")
    command.params.append(extra)
    try:
        assert any(p.startswith("--blocks: 2 meanings") for p in meaning_problems())
    finally:
        command.params.remove(extra)


def test_output_has_one_rule():
    """A checkpoint is the positional OUT; a folder of results is -o/--out."""
    for name in CHECKPOINT_WRITERS:
        arguments = [p.name for p in cli.commands[name].params if isinstance(p, click.Argument)]
        assert arguments[-1] == "out", name
    for name in FOLDER_WRITERS:
        outs = [p for p in cli.commands[name].params if p.name == "out"]
        assert [p.opts for p in outs] == [["-o", "--out"]], name


def test_old_spellings_are_hidden_from_help():
    for name, command in cli.commands.items():
        text = command.get_help(click.Context(command, info_name=name))
        for (owner, old), _new in RENAMED.items():
            if owner == name and old.startswith("--"):
                assert f"{old} " not in text and f"{old}," not in text, (name, old)


@pytest.fixture
def llama(families):
    """The llama family's base and trained (read only)."""
    paths = families("llama")
    return paths["base"], paths["trained"]


def _notes(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("note: ")]


def test_old_sweep_spellings_still_run_with_one_note_each(llama, tmp_path):
    base, trained = llama
    old = tmp_path / "old"
    argv = ["sweep", "--alpha", "0,1", "-q", str(base), str(trained), str(old)]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 0, result.output
    assert _notes(result) == [
        "note: --alpha is now --alphas; the old spelling goes in the next release",
        "note: the positional OUT_DIR is now -o/--out; the old spelling goes in the next release",
    ]
    new = tmp_path / "new"
    argv = ["sweep", "--alphas", "0,1", "-q", str(base), str(trained), "-o", str(new)]
    again = CliRunner().invoke(cli, argv)
    assert again.exit_code == 0 and again.stderr == ""
    for alpha in ("alpha-0.00", "alpha-1.00"):
        files = sorted(p.name for p in (old / alpha).iterdir())
        assert files == sorted(p.name for p in (new / alpha).iterdir())
        for name in files:
            assert (old / alpha / name).read_bytes() == (new / alpha / name).read_bytes()


@pytest.mark.parametrize(
    ("argv", "notes", "error"),
    [
        (
            ["localize", "--out-dir", "{tmp}/l", "--block-size", "2", "{base}", "{trained}"],
            ["--block-size is now --block-width", "--out-dir is now -o/--out"],
            "localize needs at least one -t/--task",
        ),
        (
            ["drift", "--json", "{tmp}/s.json", "{base}", "{trained}"],
            ["--json is now --json-file"],
            "--json-file: only with two or more TRAINED models",
        ),
        (
            ["demo", "{base}/config.json"],
            ["the positional OUT_DIR is now -o/--out"],
            "config.json",
        ),
        (
            ["localize", "-o", "{tmp}/a", "--out-dir", "{tmp}/b", "{base}", "{trained}"],
            ["--out-dir is now -o/--out"],
            "--out-dir is -o/--out; give it once",
        ),
    ],
)
def test_old_spellings_are_taken_with_one_note_each(llama, tmp_path, argv, notes, error):
    base, trained = llama
    args = [a.format(tmp=tmp_path, base=base, trained=trained) for a in argv]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    lines = _notes(result)
    assert len(lines) == len(notes) and all(n in line for n, line in zip(notes, lines, strict=True))
    assert error in result.stderr.splitlines()[-1]


def test_train_dtype_keeps_its_old_spelling_for_a_release(llama, tmp_path):
    base, _ = llama
    argv = ["train", str(base), str(tmp_path / "o"), "--data", "x", "--dry-run"]
    new = CliRunner().invoke(cli, [*argv, "--train-dtype", "bf16"])
    old = CliRunner().invoke(cli, [*argv, "--dtype", "bf16"])
    assert new.exit_code == old.exit_code == 0, (new.output, old.output)
    assert new.stdout == old.stdout and new.stderr == ""
    assert _notes(old) == [
        "note: --dtype is now --train-dtype; the old spelling goes in the next release"
    ]


def test_devices_resolve_in_one_place():
    from surgery.core.devices import resolve_device

    assert resolve_device("cpu") == "cpu"
    import torch

    assert resolve_device(None) == ("cuda" if torch.cuda.is_available() else "cpu")
    values = {
        p.default
        for name in ("eval", "sweep", "localize", "search", "demo")
        for p in cli.commands[name].params
        if p.name == "device"
    }
    assert values == {None}


def test_train_eval_takes_the_scoring_declaration_under_eval_names():
    from diagnose.scorers import TRAIN_EVAL
    from eval.options import ScoringOptions

    @click.command()
    @TRAIN_EVAL.options
    def echo(tasks, eval_scoring):
        click.echo(repr((tasks, eval_scoring)))

    argv = ["-t", "copain", "--eval-batch-size", "3", "--eval-seed", "2", "--eval-limit", "5"]
    result = CliRunner().invoke(echo, argv)
    assert result.exit_code == 0, result.output
    expected = ScoringOptions(batch_size=3, seed=2, limit=5)
    assert result.stdout.strip() == repr((("copain",), expected))


@pytest.mark.parametrize("text", ["4", "1", "7", "0:3,3:10,10:12"])
def test_blocks_mean_the_same_in_localize_and_search(text):
    from eval.search.space import parse_blocks
    from surgery.diagnostics.blocks import parse_block_plan

    for layers in (7, 12, 34):
        if text[0].isdigit() and ":" not in text and int(text) > layers:
            continue
        if ":" in text and layers != 12:
            continue  # slices name one stack
        localize = [(b.layers[0], b.layers[-1] + 1) for b in parse_block_plan(text).resolve(layers)]
        assert localize == list(parse_blocks(text, layers)), (text, layers)

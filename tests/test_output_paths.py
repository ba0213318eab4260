"""One rule for every path a command writes: never onto or inside a checkpoint without --force,
never over an existing file without --force, never over weights; one line, nothing written.

The options and arguments tried are listed from the click commands themselves (the types of
`surgery.core.cli_paths`), so a new one cannot be left out.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import click
import pytest
from click.testing import CliRunner

from cli import cli
from surgery.core.cli_paths import OutputFile, OutputFolder
from surgery.core.errors import OutputError
from surgery.engine.output_paths import check_output, check_output_file, checkpoint_kind

# Path parameters that name inputs, never written; any other path parameter must be an output
# type (a new `--report FILE` as a plain click.Path fails here).
INPUT_PATHS = {
    "base",
    "trained",
    "experts",
    "config",
    "checkpoint",
    "fsdp_config",
    "tokenizer",
    "suite",
    "dirs",
    "other",  # inspect A B: the second checkpoint
}


def _run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _output_params() -> list[tuple[str, click.Parameter]]:
    # An old spelling kept for a release (`renamed_to`) writes where its new spelling does.
    return [
        (name, param)
        for name, command in cli.commands.items()
        for param in command.params
        if isinstance(param.type, OutputFile | OutputFolder) and not hasattr(param, "renamed_to")
    ]


def _argv(command: str, param: click.Parameter, target, base, trained, tmp_path) -> list:
    """The shortest valid command line of `command` with `param` set to `target`."""
    data = tmp_path / "data.txt"
    data.write_text("some text\n" * 20)
    config = tmp_path / "linear.yml"
    config.write_text(
        f"merge_method: linear\nmodels:\n  - model: {base}\n    parameters: {{weight: 1}}\n"
        f"  - model: {trained}\n    parameters: {{weight: 1}}\n"
    )
    for lang in ("slk_Latn", "eng_Latn"):
        (tmp_path / f"{lang}.txt").write_text("some text\n\nmore text\n")
    suite = tmp_path / "suite.yml"
    suite.write_text(
        "families: {mine: {held_in: [slk_Latn]}}\nothers: [eng_Latn]\n"
        'tasks: {ppl: {path: "{lang}.txt"}}\n'
    )
    positional = {
        "revert": ["--layers", "0", base, trained],
        "soup": [base, trained],
        "interpolate": ["--alpha", "0.5", base, trained],
        "merge": [config],
        "extract-lora": ["--rank", "2", base, trained],
        "sweep": ["--alphas", "0,1", base, trained],
        "localize": [base, trained, "-t", "copain", "--blocks", "0:1"],
        "drift": [base, trained],
        "eval": [trained, "-t", "copain"],
        "train": [base, "--data", data, "--max-steps", "1"],
        "demo": [],
        "compare": [trained, "--base", base],
        "search": [base, trained, "--suite", suite, "--trials", "8"],
    }[command]
    if param.name == "intermediate_dir":  # a config of stages is the one that writes there
        staged = tmp_path / "stages.yml"
        final = config.read_text().replace(f"model: {trained}", "model: first")
        staged.write_text(f"name: first\n{config.read_text()}---\n{final}")
        positional = [staged, tmp_path / "merged"]
    if isinstance(param, click.Argument):
        return [command, *positional, target]
    return [command, *positional, param.opts[-1], target]


def _snapshot(folder):
    return {
        p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def pair(families, tmp_path):
    paths = families("llama")
    work = tmp_path / "inputs"
    for name in ("base", "trained"):
        shutil.copytree(paths[name], work / name)
    return work / "base", work / "trained"


def test_every_path_parameter_is_an_input_or_a_checked_output():
    """Guard: a path parameter is either a known input or an output type (checked below)."""
    for name, command in cli.commands.items():
        for param in command.params:
            is_path = isinstance(param.type, click.Path) or getattr(param, "metavar", None) in (
                "PATH",
                "FILE",
                "DIR",
            )
            if is_path and not isinstance(param.type, OutputFile | OutputFolder):
                assert param.name in INPUT_PATHS, f"{name} {param.name}: input or output?"
    assert len(_output_params()) >= 12


@pytest.mark.parametrize("where", ["shard", "new file in the input"])
def test_every_output_refuses_a_checkpoint_of_an_input(pair, tmp_path, where):
    base, trained = pair
    shard = sorted(trained.glob("*.safetensors"))[0]
    params = _output_params()
    assert params
    for command, param in params:
        target = shard if where == "shard" else trained / "result.json"
        argv = _argv(command, param, target, base, trained, tmp_path)
        before = _snapshot(tmp_path)
        result = _run(*argv)
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2, (argv, result.output)
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, result.stderr)
        assert str(target) in lines[0], (argv, lines[0])  # refused for the path, not another fault
        assert _snapshot(tmp_path) == before, argv
        assert not list(tmp_path.rglob(".*")), argv  # no staging folder left either


def test_no_output_replaces_weights_even_with_force(pair, tmp_path):
    """The shard of an input or of another checkpoint, with --force where the command has it."""
    base, trained = pair
    other = tmp_path / "other"
    shutil.copytree(trained, other)
    for target in (
        sorted(trained.glob("*.safetensors"))[0],
        sorted(other.glob("*.safetensors"))[0],
    ):
        for command, param in _output_params():
            argv = _argv(command, param, target, base, trained, tmp_path)
            if any(p.name == "force" for p in cli.commands[command].params):
                argv.append("--force")
            before = _snapshot(tmp_path)
            result = _run(*argv)
            assert result.exit_code == 2, (argv, result.output)
            assert str(target) in result.stderr and "--force" not in result.stderr, argv
            assert _snapshot(tmp_path) == before, argv


def test_a_file_inside_a_checkpoint_or_over_a_file_needs_force(pair, tmp_path):
    base, trained = pair
    other = tmp_path / "other"
    shutil.copytree(trained, other)
    (other / "surgery_train.json").write_text("{}")
    inside = other / "drift.csv"
    refused = _run("drift", base, trained, "--csv", inside)
    assert refused.exit_code == 2 and not inside.exists()
    assert "lies inside" in refused.stderr and "a training output" in refused.stderr
    assert _run("drift", "-q", base, trained, "--csv", inside, "--force").exit_code == 0
    assert inside.read_text().startswith("name,") or "," in inside.read_text().splitlines()[0]
    outside = tmp_path / "drift.csv"
    outside.write_text("keep")
    refused = _run("drift", base, trained, "--csv", outside)
    assert refused.exit_code == 2 and "already exists; pass --force" in refused.stderr
    assert outside.read_text() == "keep"
    assert _run("drift", "-q", base, trained, "--csv", outside, "--force").exit_code == 0
    assert outside.read_text() != "keep"


def test_two_file_options_naming_one_file_are_refused(pair, tmp_path):
    base, trained = pair
    same = tmp_path / "x.svg"
    result = _run("drift", base, trained, "--csv", same, "--plot", same)
    assert result.exit_code == 2 and "same file" in result.stderr and not same.exists()


@pytest.mark.parametrize(
    ("record", "kind"),
    [
        ("surgery_train.json", "a training output"),
        ("surgery_recipe.json", "a surgery output"),
        (None, "a checkpoint (it holds weights)"),
    ],
)
def test_an_existing_out_that_holds_weights_is_named_before_force(pair, tmp_path, record, kind):
    """TRAINED and OUT swapped: the refusal says what OUT is, not just `pass --force`."""
    base, trained = pair
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    (out / "surgery_train.json").unlink(missing_ok=True)
    (out / "surgery_recipe.json").unlink(missing_ok=True)
    if record:
        (out / record).write_text(json.dumps({}))
    before = _snapshot(out)
    result = _run("revert", "--layers", "0", base, trained, out)
    assert result.exit_code == 2, result.output
    assert f"already exists and is {kind}" in result.stderr
    assert "check the order of the arguments" in result.stderr
    assert _snapshot(out) == before


def test_an_existing_out_holding_checkpoints_says_so(pair, tmp_path):
    base, trained = pair
    models = tmp_path / "models"
    for name in ("a", "b", "c", "d"):
        shutil.copytree(trained, models / name)
    result = _run("interpolate", "--alpha", "0.5", base, trained, models)
    assert result.exit_code == 2
    assert "already exists and holds checkpoints (a, b, c, ...)" in result.stderr


def test_train_names_an_existing_checkpoint_out(pair, tmp_path):
    base, trained = pair
    (trained / "surgery_train.json").write_text("{}")
    data = tmp_path / "data.txt"
    data.write_text("some text\n" * 20)
    before = _snapshot(trained)
    result = _run("train", base, trained, "--data", data, "--max-steps", "1")
    assert result.exit_code == 2, result.output
    assert "already exists and is a training output" in result.stderr
    assert "--resume" in result.stderr and _snapshot(trained) == before


def test_checkpoint_kind_and_plain_folders(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "base.safetensors").write_bytes(b"")  # a single-file input's folder
    assert checkpoint_kind(tmp_path / "work") is None
    check_output(tmp_path / "work" / "out", [tmp_path / "work" / "base.safetensors"], False)
    check_output_file(tmp_path / "work" / "drift.csv", [tmp_path / "work" / "base.safetensors"])
    (tmp_path / "work" / "model.safetensors").write_bytes(b"")
    assert checkpoint_kind(tmp_path / "work") == "a checkpoint (it holds weights)"
    with pytest.raises(OutputError, match="lies inside"):
        check_output(tmp_path / "work" / "out", [], False)
    check_output(tmp_path / "work" / "out", [], True)


@pytest.mark.parametrize("name", ["drift.json", "driftnoext", "drift.PNG.txt"])
def test_a_plot_name_matplotlib_cannot_write_is_one_line_before_any_work(pair, tmp_path, name):
    base, trained = pair
    result = _run("drift", base, trained, "--plot", tmp_path / name)
    assert result.exit_code == 2 and result.stdout == "", result.output  # no table: no work
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "give a file name ending in .png, .pdf, .svg" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inputs"]


def test_every_plot_suffix_is_a_format_matplotlib_writes(pair, tmp_path):
    from surgery.plotting import PLOT_SUFFIXES, pyplot

    figure = pyplot().figure()
    supported = figure.canvas.get_supported_filetypes()
    pyplot().close(figure)
    assert all(suffix[1:] in supported for suffix in PLOT_SUFFIXES)
    base, trained = pair
    result = _run("drift", "-q", base, trained, "--plot", tmp_path / "drift.SVG")
    assert result.exit_code == 0 and (tmp_path / "drift.SVG").read_bytes().startswith(b"<?xml")

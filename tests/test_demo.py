"""`surgery demo --quick` end to end: the whole toolkit working together, then a rerun that reuses
every finished stage."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from surgery.demo.pipeline import (
    AXES,
    QUICK,
    STRATEGIES,
    _write_report,
    copain_items,
    demo_commands,
    markdown_table,
    moves,
    moving_axes,
    run_demo,
    train_config,
    training_runs,
)
from surgery.demo.world import FAMILIES, build_languages, sentences, write_world
from tests.support.checks import load_state, same_bits


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "run"
    run_demo(out, quick=True, device="cpu")
    return out


def test_world_is_deterministic_and_families_share_roots(tmp_path):
    a = write_world(tmp_path / "a", train_sentences=50, eval_sentences=4, seed=3)
    b = write_world(tmp_path / "b", train_sentences=50, eval_sentences=4, seed=3)
    files = sorted(p.relative_to(a.root) for p in a.root.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b.root) for p in b.root.rglob("*") if p.is_file())
    assert all((a.root / f).read_bytes() == (b.root / f).read_bytes() for f in files)
    languages = {lang.code: lang for lang in build_languages(3)}
    assert sum(lang.held_out for lang in languages.values()) == len(FAMILIES)

    # Relatives differ from each other but less than from another family.
    def shared(x, y):
        lexicon = languages[x].lexicon
        return sum(lexicon[c][:1] == languages[y].lexicon[c][:1] for c in lexicon)

    assert shared("sla1", "sla3") > shared("sla1", "ger1")
    assert "sla3.txt" not in {p.name for p in (a.root / "train").iterdir()}
    concepts = sentences(10, 1)
    assert len(set(concepts)) == 10


def test_quick_demo_reports_every_strategy(demo):
    report = (demo / "report.md").read_text()
    rows = json.loads((demo / "results.json").read_text())
    assert [r["strategy"] for r in rows] == [label for label, _ in STRATEGIES]
    for row in rows:
        assert row["strategy"] in report
        for axis, _ in AXES:
            assert math.isfinite(row[axis]), (row["strategy"], axis)
    for picture in ("strategies.png", "expert_drift.png", "expert_sweep/sweep.png"):
        assert (demo / picture).stat().st_size > 5_000
    # The report explains: every strategy has a paragraph and the command that makes its model,
    # changes read as factors or percentages, and no column in which nothing moves.
    for label, _ in STRATEGIES:
        assert f"**{label}**:" in report
    assert report.count("```bash") == len(STRATEGIES)
    assert "x0.0" not in report and "e+0" not in report
    items = copain_items(QUICK)
    for axis, _ in AXES:
        flat = not any(moves(axis, row, rows[0], items) for row in rows[1:])
        assert (f"| {axis} (" in report) != flat, axis
        assert (f"{axis} is left out" in report) == flat, axis
    # One item of 56 either way is noise; ten are not.
    assert not moves("Copain acc", {"Copain acc": 0.0}, {"Copain acc": 1 / 56}, 56)
    assert moves("Copain acc", {"Copain acc": 10 / 56}, {"Copain acc": 1 / 56}, 56)
    assert moves("gen ppl", {"gen ppl": 4.56}, {"gen ppl": 4.55}, 56)
    base, dense = rows[0], rows[1]
    # Continual pretraining learns the new languages and forgets the general one.
    assert dense["held-in ppl"] < base["held-in ppl"] and dense["gen ppl"] > base["gen ppl"]


def test_demo_models_keep_the_surgery_invariants(demo):
    models = demo / "models"
    base, freeze = load_state(models / "base"), load_state(models / "freeze")
    dense, reverted = load_state(models / "dense"), load_state(models / "dense-reverted")
    middle = tuple(f"model.layers.{i}." for i in (2, 3, 4))
    for name, tensor in base.items():
        in_middle = name.startswith(middle)
        assert same_bits(reverted[name], tensor if in_middle else dense[name]), name
        if in_middle:
            assert same_bits(freeze[name], tensor), name
    recipe = json.loads((models / "soup" / "surgery_recipe.json").read_text())
    assert recipe["operation"] == "soup" and len(recipe["inputs"]) == len(FAMILIES)


def test_second_run_reuses_finished_stages(demo, capfd):
    stamps = {p: p.stat().st_mtime_ns for p in (demo / "models").rglob("*.safetensors")}
    capfd.readouterr()
    run_demo(demo, quick=True, device="cpu")
    err = capfd.readouterr().err
    stage_lines = [line for line in err.splitlines() if line.startswith("[")]
    assert stage_lines and all(line.endswith("done before, reused") for line in stage_lines)
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps


def _plain(config) -> dict:
    """A TrainConfig's fields, sequences as lists and paths as text (as a command line has them)."""
    import dataclasses
    from pathlib import Path

    def plain(value):
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        return str(value) if isinstance(value, Path) else value

    return {f.name: plain(getattr(config, f.name)) for f in dataclasses.fields(config)}


def test_report_commands_are_the_real_ones(tmp_path):
    """Each command in report.md parses (with the CLI's own parsers) into exactly what the demo
    ran: the training configs, revert's layers and paths, soup's experts. No `...` anywhere."""
    import shlex

    from cli import cli
    from train.command import build_train_command
    from train.config import TrainConfig

    world = write_world(tmp_path / "data", train_sentences=20, eval_sentences=2, seed=0)
    models = tmp_path / "models"
    commands = demo_commands(world, QUICK, models, seed=0)
    assert set(commands) == {label for label, _ in STRATEGIES}
    lines = [line for text in commands.values() for line in text.splitlines()]
    assert not [line for line in lines if "..." in line]
    trains = {}
    for line in lines:
        words = shlex.split(line)
        assert words[0] == "surgery"
        command = build_train_command() if words[1] == "train" else cli.commands[words[1]]
        params = command.make_context(words[1], words[2:]).params
        if words[1] == "train":
            options = {
                k: v for k, v in params.items() if k not in ("dry_run", "gpus", "gpu_memory")
            }
            config = TrainConfig(base=options.pop("base"), output=options.pop("out"), **options)
            trains[Path(config.output).name] = _plain(config)
        elif words[1] == "revert":
            assert params["layers"] == QUICK.middle and params["base"] == str(models / "base")
            assert params["out"] == params["trained"] + "-reverted"
        else:
            assert [Path(e).name for e in params["experts"]] == [f"expert-{f}" for f in FAMILIES]
    runs = training_runs(world, QUICK)
    assert trains == {n: _plain(train_config(models, n, r, 0)) for n, r in runs.items()}


def test_table_plot_and_report_drop_the_same_noise_column(tmp_path):
    """Copain moves by one item of 56 (noise): the printed table, strategies.png and report.md
    all leave it out, and the report says why."""
    from surgery.demo.pipeline import plot_strategies

    rows = [
        {"strategy": label, "gen ppl": 4.0 + i, "held-in ppl": 90.0 - i, "held-out ppl": 95.0 + i}
        | {"Copain acc": 1 / 56 if label == "EMA" else 0.0, "chrF": 10.0 + i}
        for i, (label, _) in enumerate(STRATEGIES)
    ]
    axes = moving_axes(rows, copain_items(QUICK))
    assert [a for a, _ in axes] == ["gen ppl", "held-in ppl", "held-out ppl", "chrF"]
    assert "Copain" not in markdown_table(rows, axes)
    titles = plot_strategies(rows, tmp_path / "p.png", axes)
    assert [t.splitlines()[0] for t in titles] == [a for a, _ in axes]
    commands = {label: f"surgery {label}" for label, _ in STRATEGIES}
    report = _write_report(tmp_path, rows, QUICK, True, axes, commands).read_text()
    assert "| Copain acc (" not in report and "Copain acc is left out" in report

"""`surgery demo --quick` end to end: the whole toolkit working together, then a rerun that reuses
every finished stage."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from demo.pipeline import (
    AXES,
    QUICK,
    STRATEGIES,
    _write_report,
    cell,
    demo_commands,
    markdown_table,
    moving_axes,
    run_demo,
    table_rows,
    train_config,
    training_runs,
)
from demo.world import FAMILIES, build_languages, sentences, write_suite, write_world
from tests.support.checks import load_state, same_bits


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


def test_world_suite_names_every_language_and_its_data(tmp_path):
    """The world's suite: five families of two held-in languages and one held-out relative,
    gen in no family, and every unit's data file present (FLORES-style codes)."""
    from eval.study.runner import missing_path
    from eval.study.suite import load_suite, plan

    world = write_world(tmp_path, train_sentences=20, eval_sentences=2, seed=0)
    suite = load_suite(write_suite(world, copain_n=4))
    assert [f.name for f in suite.families] == list(FAMILIES)
    by_code = {lang.flores: lang for lang in world.languages}
    for family in suite.families:
        assert [by_code[c].held_out for c in family.held_in + family.held_out] == [0, 0, 1]
        assert {by_code[c].family for c in family.held_in + family.held_out} == {family.name}
    assert suite.others == ("gen_Latn",) and by_code["gen_Latn"].family is None
    units = plan(suite)
    assert not [u.id for u in units if missing_path(u)]
    kinds = {u.kind: sum(v.kind == u.kind for v in units) for u in units}
    assert kinds == {"ppl": 16, "copain": 1, "flores": 15}  # no gen-to-gen translation


@pytest.mark.slow  # the quick demo: about 7 minutes
def test_quick_demo_reports_every_strategy(demo):
    report = (demo / "report.md").read_text()
    table = json.loads((demo / "results.json").read_text())
    assert [r["strategy"] for r in table] == [row.label for row in table_rows()]
    for row in table:
        assert row["strategy"] in report
        for label, _, _ in AXES:
            assert math.isfinite(row[label]["value"]), (row["strategy"], label)
    for picture in ("strategies.png", "expert_drift.png", "expert_sweep/sweep.png"):
        assert (demo / picture).stat().st_size > 5_000
    # The comparison's own report, from every model's suite results folder.
    assert (demo / "comparison" / "report.md").is_file()
    compared = json.loads((demo / "comparison" / "comparison.json").read_text())
    assert compared["models"] == [row.model for row in table_rows()]
    assert compared["bootstrap"]["resamples"] == QUICK.resamples
    # The report explains: every strategy has a paragraph and the command that makes its model,
    # and no column in which no change's interval excludes 0 (the comparison's rule).
    for label, _ in STRATEGIES:
        assert f"**{label}**:" in report
    assert report.count("```bash") == len(STRATEGIES)
    assert "x0.0" not in report and "e+0" not in report
    left_out = next((line for line in report.splitlines() if "left out:" in line), "")
    for label, _, _ in AXES:
        flat = not any(row[label]["significant"] for row in table[1:])
        assert (f"| {label} (" in report) != flat, label
        assert (label in left_out.partition("left out")[0]) == flat, label
    base, dense = table[0], table[1]
    # Continual pretraining learns the new languages and forgets the general one.
    assert dense["held-in ppl"]["value"] < base["held-in ppl"]["value"]
    assert dense["gen ppl"]["value"] > base["gen ppl"]["value"]
    assert dense["held-in ppl"]["ci_low"] <= dense["held-in ppl"]["delta"]


@pytest.mark.slow  # the quick demo: about 7 minutes
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


@pytest.mark.slow  # the quick demo: about 7 minutes
def test_second_run_reuses_finished_stages(demo, capfd):
    stamps = {p: p.stat().st_mtime_ns for p in (demo / "models").rglob("*.safetensors")}
    capfd.readouterr()
    run_demo(demo, quick=True, device="cpu")
    err = capfd.readouterr().err
    stage_lines = [line for line in err.splitlines() if line.startswith("[")]
    assert stage_lines and all(line.endswith("done before, reused") for line in stage_lines)
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps


def _plain(config) -> dict:
    """A TrainConfig's options, sequences as lists and paths as text (as a command line has
    them)."""
    from pathlib import Path

    def plain(value):
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        return str(value) if isinstance(value, Path) else value

    return {key: plain(value) for key, value in config.as_options().items()}


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
            # Not TrainConfig's: the dry run's, and old spellings kept for a release.
            other = {p.name for p in command.params if hasattr(p, "renamed_to")}
            other |= {"dry_run", "gpus", "gpu_memory"}
            options = {k: v for k, v in params.items() if k not in other}
            base, out = options.pop("base"), options.pop("out")
            config = TrainConfig.from_options(base=base, output=out, **options)
            trains[Path(config.output).name] = _plain(config)
        elif words[1] == "revert":
            assert params["layers"] == QUICK.middle and params["base"] == str(models / "base")
            assert params["out"] == params["trained"] + "-reverted"
        else:
            assert [Path(e).name for e in params["experts"]] == [f"expert-{f}" for f in FAMILIES]
    runs = training_runs(world, QUICK)
    assert trains == {n: _plain(train_config(models, n, r, 0)) for n, r in runs.items()}


def _ratio(task: str, value: float, delta: float | None) -> dict:
    """A perplexity row's ratio to the base and its interval, as the comparison gives them."""
    if task != "ppl" or delta is None:
        return dict.fromkeys(("ratio", "ratio_low", "ratio_high"))
    ratio = value / (value - delta)
    return {"ratio": ratio, "ratio_low": ratio / 1.5, "ratio_high": ratio * 1.1}


def _comparison(significant: dict[str, bool]):
    """A comparison's rows, made up, for every cell of the demo's table: `significant` per
    column label (whether its changes' intervals exclude 0)."""
    from types import SimpleNamespace

    axes = [
        {"task": t, "variant": None, "metric": m, "primary": True, "higher_is_better": h}
        | {"scale": "percent" if t == "copain" else "value"}
        for t, m, h in (("ppl", "ppl", False), ("copain", "acc", True), ("chrf", "chrf", True))
    ]
    rows = []
    for i, row in enumerate(table_rows()):
        for label, task, where in AXES:
            if "split" in where:
                scope = {"scope": "family", "family": row.family} if row.family else {}
                where = {"scope": "overall", "family": None, **where, **scope}
            delta = None if i == 0 else 0.5 * i
            rows.append(
                {"model": row.model, "task": task, "variant": None, "lang": None, "split": None}
                | {"metric": axes[["ppl", "copain", "chrf"].index(task)]["metric"]}
                | {"scope": "language", "family": None, **where, "value": 10.0 + i}
                | {"seed_std": None, "delta": delta}
                | {"ci_low": None if i == 0 else (0.1 if significant[label] else -1.0)}
                | {"ci_high": None if i == 0 else delta + 1}
                | {"significant": None if i == 0 else significant[label]}
                | _ratio(task, 10.0 + i, delta)
            )
    return SimpleNamespace(axes=axes, rows=rows, resamples=100, seed=0)


def test_table_plot_and_report_drop_the_same_noise_column(tmp_path):
    """Copain's changes all have intervals that include 0: the printed table, strategies.png
    and report.md all leave it out, and the report says why; the other cells carry their
    intervals."""
    from demo.pipeline import plot_strategies

    significant = {label: label != "Copain acc" for label, _, _ in AXES}
    comparison, rows = _comparison(significant), table_rows()
    axes = moving_axes(comparison, rows)
    assert [a for a, _, _ in axes] == ["gen ppl", "held-in ppl", "held-out ppl", "chrF"]
    table = markdown_table(comparison, rows, axes)
    assert "Copain" not in table and "**11.00 (+0.50 [0.10, 1.50])**" in table
    expert = cell(comparison, rows[2], AXES[1])
    assert (expert["scope"], expert["family"]) == ("family", FAMILIES[0])
    titles = plot_strategies(comparison, rows, tmp_path / "p.png", axes)
    assert [t.split(" (")[0] for t in titles] == [a for a, _, _ in axes]
    commands = {label: f"surgery {label}" for label, _ in STRATEGIES}
    report = _write_report(tmp_path, comparison, rows, QUICK, True, axes, commands).read_text()
    assert "| Copain acc (" not in report and "Copain acc is left out" in report
    assert "B = 100" in report
    assert "How far these figures hold" in report
    # One column that moves is enough to keep it.
    significant["Copain acc"] = True
    assert len(moving_axes(_comparison(significant), rows)) == len(AXES)


@pytest.mark.slow  # 32 units per model, 15 of them translations generated by a random model
def test_models_scored_through_the_suite_make_the_table_from_the_comparison(tmp_path):
    """Stage 5 and 6 on three tiny models, without training: each scored through the world's
    suite (one results folder each), compared with the base, and every table cell is the
    comparison's row with its interval."""
    from demo.pipeline import TableRow, run_comparison, score
    from eval.study.formatting import format_cell
    from tests.support.tiny_models import build_model, perturb, save

    world = write_world(tmp_path / "data", train_sentences=20, eval_sentences=4, seed=0)
    write_suite(world, copain_n=4)
    rows = [
        TableRow("Base", "base"),
        TableRow("Dense CPT", "dense"),
        TableRow("Family experts", "expert-slavic", "slavic"),
    ]
    for i, row in enumerate(rows):
        model = build_model("llama")
        save(perturb(model, seed=i, scale=0.2) if i else model, tmp_path / "models" / row.model)
        score(tmp_path / "models" / row.model, world.suite, tmp_path / "scores" / row.model, "cpu")
    comparison = run_comparison(tmp_path / "scores", rows, tmp_path / "comparison", 200, 0)
    assert (tmp_path / "comparison" / "report.md").is_file()
    assert comparison.models == ["base", "dense", "expert-slavic"]
    gen = cell(comparison, rows[1], AXES[0])
    assert (gen["lang"], gen["family"], gen["scope"]) == ("gen_Latn", None, "language")
    held_in = cell(comparison, rows[1], AXES[1])
    assert (held_in["scope"], held_in["split"], held_in["n"]) == ("overall", "held_in", 5)
    own = cell(comparison, rows[2], AXES[2])
    assert (own["scope"], own["family"], own["split"]) == ("family", "slavic", "held_out")
    table = markdown_table(comparison, rows, list(AXES))
    assert format_cell(own, 2) in table and "[" in format_cell(own, 2)
    from demo.pipeline import plot_strategies

    plot_strategies(comparison, rows, tmp_path / "strategies.png", list(AXES))


def test_perplexity_panels_draw_ratios_to_the_base_on_a_log_axis_past_3x():
    """Perplexity moves by orders of magnitude: its panels draw each strategy's ratio to the
    base (the comparison's ratio and interval) from 1, on a log axis where the ratios span
    more than 3x; chrF the change from 0, in chrF points, hatched (it did not hold across
    seeds); changes within noise in the noise grey."""
    from dataclasses import replace

    from matplotlib.colors import to_rgba

    from demo.pipeline import strategy_panels
    from demo.plots import strategies_figure
    from surgery.plotting import NOISE_COLOUR

    significant = {label: label != "held-out ppl" for label, _, _ in AXES}
    comparison, rows = _comparison(significant), table_rows()
    axes = [a for a in AXES if a[0] != "Copain acc"]
    panels = strategy_panels(comparison, rows, axes)
    far = [
        c | {"ratio": c["ratio"] * 100, "ratio_high": c["ratio_high"] * 100}
        for c in panels[0].cells
    ]
    panels[0] = replace(panels[0], cells=far)
    fig = strategies_figure([row.label for row in rows[1:]], panels)
    for ax, (label, task, _), panel in zip(fig.axes, axes, panels, strict=True):
        ends = [bar.get_x() + bar.get_width() for bar in ax.patches]
        if task == "ppl":
            assert ax.get_xlabel().startswith("ratio to the base")
            assert ax.get_xscale() == ("log" if label == "gen ppl" else "linear")
            assert ends == pytest.approx([c["ratio"] for c in panel.cells])
            assert {bar.get_x() for bar in ax.patches} == {1.0}
        else:
            assert ax.get_xscale() == "linear" and "chrF points" in ax.get_xlabel()
            assert ends == pytest.approx([c["delta"] for c in panel.cells])
        assert {bar.get_hatch() for bar in ax.patches} == {"///" if label == "chrF" else None}
        grey = {bar.get_facecolor() == to_rgba(NOISE_COLOUR) for bar in ax.patches}
        assert grey == {not significant[label]}


def test_the_report_names_changes_that_hold_by_a_small_margin():
    from demo.pipeline import sensitive

    wide = {"significant": True, "delta": 1.0, "ci_low": 0.2, "ci_high": 2.5}
    narrow = {"significant": True, "delta": 2.0, "ci_low": 1.5, "ci_high": 2.5}
    assert sensitive(wide, ppl=False) and not sensitive(narrow, ppl=False)
    assert not sensitive({**wide, "significant": False}, ppl=False)
    assert sensitive({**narrow, "few_items": True}, ppl=False)
    # Perplexity in log ratio: x3 within [x2, x4.5] holds; x1.2 within [x1.01, x1.5] does not.
    assert not sensitive({"significant": True, "ratio": 3, "ratio_low": 2, "ratio_high": 4.5}, True)
    assert sensitive(
        {"significant": True, "ratio": 1.2, "ratio_low": 1.01, "ratio_high": 1.5}, True
    )

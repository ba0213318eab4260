"""`surgery search --seed-profiles`: priors a user can name (LiNeS lines, the paper's reverted
band, a localize run of the same two models), enqueued as first trials and named in the report
(the world: tests/support/search_world.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import cli
from eval.search import priors
from eval.search.space import Space
from surgery.core.errors import SurgeryError
from tests.support import search_world

SEARCH = ["--blocks", "0:2,2:4", "--step", "0.25", "--resamples", "100", "-q"]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    return search_world.build(tmp_path_factory.mktemp("priors_world"))


def _localize(world, first: str, second: str, out: Path) -> Path:
    argv = ["localize", world[first], world[second], "--blocks", "0:2,2:4"]
    argv += ["--suite", world["suite"], "-o", out, "-q"]
    result = CliRunner().invoke(cli, list(map(str, argv)))
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def localized(world, tmp_path_factory) -> Path:
    return _localize(world, "base", "trained", tmp_path_factory.mktemp("loc") / "localize")


def _search(world, out: Path, *extra: str):
    argv = ["search", world["base"], world["trained"], "--suite", world["suite"], "-o", out]
    return CliRunner().invoke(cli, [*map(str, argv), *SEARCH, *extra])


def test_lines_follow_the_line_at_each_blocks_mean_depth():
    """LiNeS: a + (b - a) * l / (L - 1); block 9:28 of 34 has mean depth 18/33."""
    space = Space(((0, 9), (9, 28), (28, 34)), 34, embeddings=True, step=0.05)
    seeds = {s.name: s.strengths for s in priors.lines(space)}
    assert len(seeds) == len(priors.LINES_A) * len(priors.LINES_B)
    for a in priors.LINES_A:
        for b in priors.LINES_B:
            strengths = seeds[f"lines {a:g}-{b:g}"]
            for (start, stop), name in zip(space.blocks, space.names, strict=False):
                depth = (start + stop - 1) / 2 / 33
                assert strengths[name] == pytest.approx(a + (b - a) * depth, abs=0.025)
            assert strengths["*"] == a


def test_reverted_is_the_paper_band_at_each_strength_and_drops_what_baselines_hold():
    space = Space(((0, 9), (9, 28), (28, 34)), 34, step=0.05)
    found = priors.reverted(space)
    assert [s.strengths["9:28"] for s in found] == list(priors.REVERTED)
    assert all(s.strengths["0:9"] == s.strengths["28:34"] == 1 for s in found)
    assert found[0].profile == "0:9=1,9:28=0,28:34=1"
    # A baseline holding the band at 0, and a family named twice: each profile once.
    kept = priors.seeds(space, ["reverted", "reverted"], "pair", taken=found[:1])
    assert [s.name for s in kept] == ["reverted 9:28 at 0.25", "reverted 9:28 at 0.5"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("linear", "write one of lines, reverted, 'localize DIR'"),
        ("localize", "write 'localize DIR'"),
        ("lines somewhere", "write lines"),
    ],
)
def test_a_family_that_is_not_one_is_refused(text, message):
    with pytest.raises(SurgeryError, match=message):
        priors.parse_seed(text)


def test_localize_records_the_identity_of_its_inputs(world, localized):
    from surgery.diagnostics.localize import pair_identity
    from surgery.hub.resolve import open_input

    inputs = json.loads((localized / "localize.json").read_text())["config"]["inputs"]
    base, trained = open_input(world["base"]), open_input(world["trained"])
    assert inputs["identity"] == pair_identity(base, trained)
    assert inputs["identity"] != pair_identity(trained, base)
    assert inputs["num_layers"] == search_world.LAYERS


def test_localize_seeds_find_the_damaged_block_and_the_report_names_each_family(
    world, localized, tmp_path
):
    """In the world, reverting the last block helps both perplexities and reverting the first
    hurts them: `localize sign` is the ideal profile. Every seed runs once, first, and the
    report says which family each point came from (sampled points: none)."""
    out = tmp_path / "seeded"
    seeds = ["--seed-profiles", "lines", "--seed-profiles", "reverted"]
    seeds += ["--seed-profiles", f"localize {localized}"]
    result = _search(world, out, "--trials", "14", *seeds)
    assert result.exit_code == 0, result.output
    document = json.loads((out / "frontier.json").read_text())
    came = {p["profile"]: p["came_from"] for p in document["points"]}
    assert came[search_world.IDEAL] == "localize (localize sign)"
    families = [c.split(" ")[0] for c in came.values()]
    assert {"baseline", "lines", "localize"} <= set(families)
    # The band 1:3 of 4 at 0, 0.25, 0.5 is 0.5 or 0.75 in both blocks: the reverted and
    # uniform baselines hold them, so no `reverted` seed runs here.
    assert "reverted" not in families
    sampled = [p for p in document["points"] if p["baseline"] is None]
    assert all(p["came_from"] == "none" for p in sampled)
    names = [p["baseline"] for p in document["points"] if p["baseline"]]
    assert len(names) == len(set(names))
    report = (out / "report.md").read_text()
    assert "| came from |" in report and "localize (localize sign)" in report


def test_a_localize_run_of_another_pair_is_refused_before_any_model_loads(
    world, tmp_path, monkeypatch
):
    import eval.model_loading

    other = _localize(world, "base", "m", tmp_path / "other")
    monkeypatch.setattr(eval.model_loading, "load_model", _no_model)
    out = tmp_path / "refused"
    result = _search(world, out, "--trials", "8", "--seed-profiles", f"localize {other}")
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1, result.output
    assert "not this BASE and TRAINED" in result.output and str(world["m"]) in result.output
    assert not out.exists()
    result = _search(world, out, "--trials", "8", "--seed-profiles", f"localize {tmp_path}")
    assert result.exit_code == 2 and "no localize run there" in result.output
    assert not out.exists()


def _no_model(*args, **kwargs):
    raise AssertionError("a model was loaded")

"""`surgery search BASE EXPERT EXPERT...`: per-block soups of several experts, reported on items
the search never saw (the world: tests/support/experts_world.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from safetensors.torch import load_file

from cli import cli
from eval.study import results as res
from eval.study.compare import compare
from tests.support import experts_world, search_world

SEARCH = ["--blocks", experts_world.BLOCKS, "--step", "0.5", "--resamples", "200", "-q"]
TRIALS = 12  # the 10 baselines and two proposals: enough to check what a point is
DATA = Path(__file__).parent / "data" / "search"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    return experts_world.build(tmp_path_factory.mktemp("experts_world"))


def _argv(world, out: Path, *extra: str) -> list[str]:
    experts = [world[family] for family in experts_world.FAMILIES]
    argv = ["search", world["base"], *experts, "--suite", world["suite"], "-o", out]
    return [*map(str, argv), *SEARCH, *extra]


def _search(world, out: Path, *extra: str):
    return CliRunner().invoke(cli, _argv(world, out, *extra))


@pytest.fixture(scope="module")
def untrained(tmp_path_factory) -> dict[str, Path]:
    """BASE and three experts of the world's suite, untrained (for checks before any model
    loads: nothing is scored)."""
    from tests.support.tiny_models import build_model, perturb, save

    root = tmp_path_factory.mktemp("untrained")
    model = build_model("llama")
    paths = {"base": save(model, root / "base"), "suite": experts_world.write_suite(root)}
    for seed, family in enumerate(experts_world.FAMILIES, start=1):
        paths[family] = save(perturb(build_model("llama"), seed), root / f"expert-{family}")
    return paths


@pytest.fixture(scope="module")
def searched(world, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("experts_searched") / "search"
    result = _search(world, out, "--trials", str(TRIALS))
    assert result.exit_code == 0, result.output
    return out


def _frontier(folder: Path) -> dict:
    return json.loads((folder / "frontier.json").read_text())


@pytest.mark.slow  # the world's training and a search: about a minute on 2 busy cores
def test_the_baselines_and_each_familys_learning_are_reported(searched):
    document = _frontier(searched)
    assert document["trials"] == TRIALS
    assert [e["family"] for e in document["experts"]] == list(experts_world.FAMILIES)
    baselines = {p["baseline"]: p for p in document["points"] if p["baseline"]}
    assert set(baselines) == {
        "soup", "reverted 1:3", "uniform 0.25", "uniform 0.5", "uniform 0.75",
        "expert slavic", "expert germanic", "expert indic", "base",
    }  # fmt: skip
    # The uniform Expert Soup is the reference TRAINED's place holds: the same report values.
    soup, references = baselines["soup"], document["references"]
    for name, entry in references["trained"]["report"].items():
        assert soup["report"][name]["value"] == entry["value"]
    # The mean learning is the mean of the families' own, for every point.
    learning = document["objectives"][0]["name"]
    for point in document["points"]:
        values = [point["families"][f]["value"] for f in experts_world.FAMILIES]
        assert point["report"][learning]["value"] == pytest.approx(sum(values) / 3)
    report = (searched / "report.md").read_text()
    assert "per family" in report and "merge_method: linear" in report


@pytest.mark.slow  # the world's training and a search: about a minute on 2 busy cores
def test_every_frontier_point_rebuilt_by_merge_from_its_config_scores_its_report(
    world, searched, tmp_path
):
    """`surgery merge` of each frontier point's printed config, then `surgery eval --suite
    --half report`, gives the recorded report scores; `surgery search DIR --write N` writes the
    same checkpoint."""
    document = _frontier(searched)
    runner = CliRunner()
    frontier = [p for p in document["points"] if p["frontier"]]
    assert frontier
    for point in frontier:
        config = tmp_path / f"point-{point['point']}.yml"
        config.write_text(point["merge"])
        folder = tmp_path / f"point-{point['point']}"
        result = runner.invoke(cli, ["merge", str(config), str(folder), "-q"])
        assert result.exit_code == 0, result.output
        scored = tmp_path / f"scored-{point['point']}"
        argv = ["eval", folder, "--suite", world["suite"], "-o", scored, "--half", "report", "-q"]
        assert runner.invoke(cli, list(map(str, argv))).exit_code == 0
        comparison = compare(searched / "report" / "base", [scored], resamples=10)
        model = res.read_results(scored).model.name
        for objective in document["objectives"]:
            row = next(
                r
                for r in comparison.rows
                if r["model"] == model
                and (r["task"], r["metric"], r["split"], r["scope"])
                == (objective["task"], objective["metric"], objective["split"], "overall")
            )
            assert row["value"] == point["report"][objective["name"]]["value"], point["profile"]
    number = frontier[-1]["point"]
    result = runner.invoke(cli, ["search", str(searched), "--write", str(number), "-q"])
    assert result.exit_code == 0, result.output
    written, rebuilt = searched / f"point-{number}", tmp_path / f"point-{number}"
    for shard in sorted(rebuilt.glob("*.safetensors")):
        ours, theirs = load_file(written / shard.name), load_file(shard)
        assert all(ours[k].equal(theirs[k]) for k in theirs)


@pytest.mark.slow  # the world's training and a search of LONG_TRIALS trials
def test_the_frontier_keeps_each_experts_block_and_reverts_the_damaged_one(world, tmp_path):
    """With enough trials, the frontier holds the profile that takes each expert's learned
    block and BASE's last layer, or a point no worse than it beyond noise on both axes (paired
    bootstrap on the search half); that point beats the uniform soup on the report half beyond
    the interval on both axes."""
    from eval.search.run import Searcher, check
    from eval.search.settings import SearchOptions
    from eval.study.compare import compare_runs
    from eval.study.runner import SuiteRun

    out = tmp_path / "long"
    result = _search(world, out, "--trials", str(LONG_TRIALS), "--seed-profiles", "blocks")
    assert result.exit_code == 0, result.output
    document = _frontier(out)
    experts = tuple(str(world[f]) for f in experts_world.FAMILIES)
    options = SearchOptions(
        base=str(world["base"]),
        trained=experts[0],
        experts=experts,
        suite=world["suite"],
        out=tmp_path / "scoring",
        blocks=experts_world.BLOCKS,
        step=0.5,
    )
    checked = check(options, SuiteRun(progress=False))
    searcher = Searcher(checked)
    searcher.load()
    ideal = searcher.run(experts_world.IDEAL, checked.search, "ideal")

    def worse(profile: str) -> list[bool]:
        run = searcher.run(profile, checked.search, "point")
        rows = compare_runs([ideal, run], resamples=500, seed=0).rows
        mine = [r for r in rows if r["model"] == "point" and r["scope"] == "overall"]
        return [r["ci_low"] > 0 for r in mine]  # perplexities: higher is worse

    frontier = [p for p in document["points"] if p["frontier"]]
    found = [
        p for p in frontier if p["profile"] == experts_world.IDEAL or not any(worse(p["profile"]))
    ]
    assert found, [p["profile"] for p in frontier]
    assert any(p["came_from"].startswith("blocks (composed") for p in found)
    for point in found:
        soup = {name: entry["vs_trained"] for name, entry in point["report"].items()}
        if all(change["ci_high"] < 0 for change in soup.values()):
            return
    pytest.fail(f"no point like the ideal beats the soup beyond the interval: {found}")


# The 9 baselines, round 1's 16 probes (4 blocks, BASE and 3 experts) and composition, round
# 2's 14 probes and composition (the ideal, measured): 41.
LONG_TRIALS = 41


# --- one expert: today's search, bit for bit --------------------------------------------------


def _run_search(code: Path, world, out: Path, trials: int, sampler: str) -> dict:
    """`surgery search BASE TRAINED` of the code in `code`, in a process of its own."""
    argv = ["search", world["base"], world["trained"], "--suite", world["suite"], "-o", out]
    argv += ["--blocks", "0:2,2:4", "--step", "0.25", "--resamples", "200", "-q"]
    argv += ["--sampler", sampler]
    script = "import sys; from cli import main; sys.argv[0] = 'surgery'; main()"
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", script, *map(str, argv), "--trials", str(trials)]
    subprocess.run(command, env=env, cwd=code, check=True, capture_output=True)
    return _frontier(out)


@pytest.mark.slow
def test_one_expert_gives_the_frontier_of_the_code_before_several_experts(tmp_path):
    """With TPE, the same seed gives the points, profiles and scores the search gave before
    several experts (recorded from that code, commit 718cbb8, in tests/data/search); new fields
    may be added. Scores agree to float rounding (other CPUs may round differently)."""
    recorded = json.loads((DATA / "one_expert_frontier.json").read_text(encoding="utf-8"))
    world = search_world.build(tmp_path / "world")
    ours = _run_search(Path(__file__).parents[1], world, tmp_path / "ours", 16, "tpe")
    assert len(ours["points"]) == len(recorded["points"])
    for mine, old in zip(ours["points"], recorded["points"], strict=True):
        assert _same({k: mine[k] for k in old}, old), (mine, old)


def _same(mine, old) -> bool:
    """Equal, numbers to 1e-9 relative (dicts and lists compared item by item)."""
    if isinstance(old, dict):
        return mine.keys() == old.keys() and all(_same(mine[k], old[k]) for k in old)
    if isinstance(old, list):
        return len(mine) == len(old) and all(map(_same, mine, old))
    if isinstance(old, float):
        return mine == pytest.approx(old, rel=1e-9, abs=1e-12)
    return mine == old


def test_one_experts_config_writes_what_interpolate_writes(tmp_path):
    """The printed config of a one-expert profile rebuilds, with `surgery merge`, the checkpoint
    `surgery interpolate --alpha PROFILE` writes (the blend the search scores)."""
    from eval.search.mix import merge_config, mix_of

    world = {"base": tmp_path / "base", "trained": tmp_path / "trained"}
    from tests.support.tiny_models import build_model, perturb, save

    model = build_model("llama")
    save(model, world["base"])
    save(perturb(model, seed=1), world["trained"])
    profile = "0:2=0.35,2:4=0.8,*=0.55"
    config = tmp_path / "point.yml"
    prefixes = ["model.layers", "model.layers"]
    models = [str(world["base"]), str(world["trained"])]
    config.write_text(merge_config(mix_of(profile, 4, 1), models, prefixes))
    runner = CliRunner()
    assert runner.invoke(cli, ["merge", str(config), str(tmp_path / "merged"), "-q"]).exit_code == 0
    argv = ["interpolate", "--alpha", profile, *models, str(tmp_path / "interpolated"), "-q"]
    assert runner.invoke(cli, argv).exit_code == 0
    merged = {}
    for shard in (tmp_path / "merged").glob("*.safetensors"):
        merged.update(load_file(shard))
    interpolated = {}
    for shard in (tmp_path / "interpolated").glob("*.safetensors"):
        interpolated.update(load_file(shard))
    assert merged.keys() == interpolated.keys()
    assert all(merged[k].equal(interpolated[k]) for k in merged)


# --- bad input: one line, before any model loads ------------------------------------------------


def _no_model(*args, **kwargs):
    raise AssertionError("a model was loaded")


def _refused(world, tmp_path, monkeypatch, experts, *extra: str) -> str:
    import eval.model_loading

    monkeypatch.setattr(eval.model_loading, "load_model", _no_model)
    out = tmp_path / "bad"
    argv = ["search", world["base"], *experts, "--suite", world["suite"], "-o", out]
    result = CliRunner().invoke(cli, [*map(str, argv), *SEARCH, *extra])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1, result.output
    assert not out.exists()
    return result.output


def test_experts_of_another_architecture_or_layer_count_are_refused(
    untrained, tmp_path, monkeypatch
):
    from tests.support.tiny_models import build_model, random_llama, save

    first = untrained["slavic"]
    gpt2 = save(build_model("gpt2"), tmp_path / "expert-germanic")
    output = _refused(untrained, tmp_path, monkeypatch, [first, gpt2])
    assert "other architectures (llama and gpt2)" in output
    short = random_llama(tmp_path / "expert-indic", hidden=32, layers=3)
    output = _refused(untrained, tmp_path, monkeypatch, [first, short])
    assert "have 4 and 3 layers" in output


def test_a_family_the_suite_lacks_is_refused(untrained, tmp_path, monkeypatch):
    experts = [untrained[family] for family in experts_world.FAMILIES]
    output = _refused(
        untrained, tmp_path, monkeypatch, experts, "--labels", "slavic,germanic,celtic"
    )
    assert "the suite has no family 'celtic'" in output
    renamed = tmp_path / "expert-celtic"
    renamed.symlink_to(untrained["indic"], target_is_directory=True)
    output = _refused(untrained, tmp_path, monkeypatch, [*experts[:2], renamed])
    assert "expert-celtic: its folder name names no family" in output


def test_a_search_that_does_not_fit_in_memory_is_refused_with_the_figure(
    untrained, tmp_path, monkeypatch
):
    from eval.search.experts import MEMORY_ENV

    monkeypatch.setenv(MEMORY_ENV, "100K")
    experts = [untrained[family] for family in experts_world.FAMILIES]
    output = _refused(untrained, tmp_path, monkeypatch, experts)
    assert "GiB" in output and "0.00 GiB is available" in output and MEMORY_ENV in output


# --- the pieces, without a model -----------------------------------------------------------------


def test_a_profile_gives_weights_summing_to_one_that_its_config_replays():
    from eval.search.mix import merge_config, mix_of
    from surgery.engine.ops.merge.spec import evaluate
    from surgery.mergekit_config import parse_config

    mix = mix_of("0:2=0.5[1 0 0],2:4=1[0.5 0.5 0],*=0.4", 4, 3)
    assert mix.layers[0] == (0.5, 0.5, 0.0, 0.0)
    assert mix.layers[3] == (0.0, 0.5, 0.5, 0.0)
    assert mix.outside == pytest.approx((0.6, 0.4 / 3, 0.4 / 3, 0.4 / 3))
    assert mix_of("2:4=0", 4, 3).layers[0] == (0.0, 1 / 3, 1 / 3, 1 / 3)  # equal shares
    assert all(sum(w) == pytest.approx(1) for w in [*mix.layers, mix.outside])
    models = ["base", "a", "b", "c"]
    text = merge_config(mix, models, ["model.layers"] * 4)
    spec = parse_config(text)
    assert yaml.safe_load(text)["parameters"] == {"normalize": False}
    for position in range(4):
        weight = spec.model_parameters[position]["weight"]
        for layer in range(4):
            name = f"model.layers.{layer}.mlp.up_proj.weight"
            assert evaluate(weight, name, 0.0) == mix.layers[layer][position]
        assert evaluate(weight, "model.embed_tokens.weight", 0.0) == mix.outside[position]
    with pytest.raises(ValueError, match="one share per expert"):
        mix_of("0:2=0.5[1 0]", 4, 3)


def test_a_multimodal_bases_config_mixes_the_text_decoder_module():
    from eval.search.mix import merge_config, mix_of

    modules = ["text_decoder", "vision_tower", "multi_modal_projector"]
    prefixes = ["language_model.model.layers", "model.layers", "model.layers"]
    text = merge_config(mix_of("0.5", 2, 2), ["base", "a", "b"], prefixes, modules)
    config = yaml.safe_load(text)
    assert list(config["modules"]) == modules
    decoder = config["modules"]["text_decoder"]["models"]
    assert [m["model"] for m in decoder] == ["base", "a", "b"]
    assert config["modules"]["vision_tower"]["models"] == [
        {"model": "base", "parameters": {"weight": 1.0}}
    ]


def test_the_space_suggests_todays_parameters_for_one_expert():
    from eval.search.space import Space, baselines

    one = Space(((0, 2), (2, 4)), 4, step=0.25)
    several = Space(((0, 2), (2, 4)), 4, step=0.25, labels=("a", "b"))
    assert one.params == one.names == ["0:2", "2:4"]
    assert several.params == ["0:2", "2:4", "0:2@a", "0:2@b", "2:4@a", "2:4@b"]
    assert baselines(one, [1, 2], [0.5])[0].strengths == {"0:2": 1.0, "2:4": 1.0}
    names = [b.name for b in baselines(several, [1, 2], [0.5])]
    assert names == ["soup", "reverted 1:3", "uniform 0.5", "expert a", "expert b", "base"]
    assert several.profile(several.complete({"0:2": 0.5, "2:4": 1.0})) == "0:2=0.5[1 1],2:4=1[1 1]"


def test_blocks_with_too_few_trials_for_its_probes_is_refused(untrained, tmp_path, monkeypatch):
    """9 baselines, 16 probes and the first composition: 26 trials at least."""
    experts = [untrained[family] for family in experts_world.FAMILIES]
    extra = ["--seed-profiles", "blocks", "--trials", "25"]
    output = _refused(untrained, tmp_path, monkeypatch, experts, *extra)
    assert "--trials 25: the baselines and seed profiles alone are 26 trials" in output

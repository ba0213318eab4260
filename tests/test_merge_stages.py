"""`surgery merge` of a file of several YAML documents: stages, as `mergekit-multi` runs them.

Named documents are intermediates (under --intermediate-dir), the unnamed one is OUT. The
oracles: the same stages run one by one with single-document configs, and mergekit-multi.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

import surgery.api
from cli import cli
from surgery import api
from tests.support import tiny_models
from tests.support.checks import assert_valid_output, load_state, ulp_distance


def _documents(family: dict) -> list[dict]:
    """Three stages written final first, then `ta` (which needs `soup`), then `soup`."""
    e0, e1, e2 = (str(p) for p in family["experts"])
    final = {
        "merge_method": "linear",
        "dtype": "float32",
        "models": [
            {"model": "soup", "parameters": {"weight": 0.25}},
            {"model": "ta", "parameters": {"weight": 0.75}},
        ],
    }
    ta = {
        "name": "ta",
        "merge_method": "task_arithmetic",
        "base_model": str(family["base"]),
        "dtype": "float32",
        "models": [
            {"model": "soup", "parameters": {"weight": 0.7}},
            {"model": e2, "parameters": {"weight": [0.2, 0.6]}},
        ],
    }
    soup = {
        "name": "soup",
        "merge_method": "linear",
        "dtype": "float32",
        "models": [
            {"model": e0, "parameters": {"weight": 1.0}},
            {"model": e1, "parameters": {"weight": 2.0}},
        ],
    }
    return [final, ta, soup]


def _write(documents: list[dict], path: Path) -> Path:
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def staged(families, tmp_path_factory):
    """The three-stage config, its run to OUT, and the stages run one by one."""
    root = tmp_path_factory.mktemp("stages")
    family = families("llama")
    documents = _documents(family)
    config = _write(documents, root / "stages.yml")
    out = api.merge(config, root / "out", quiet=True)
    return {"family": family, "documents": documents, "config": config, "out": out, "root": root}


def _one_by_one(documents: list[dict], root: Path) -> dict:
    """Each stage as a single-document config, stage names replaced by their outputs."""
    paths = {}
    for doc in (documents[2], documents[1], documents[0]):
        doc = dict(doc)
        name = doc.pop("name", "final")
        text = json.dumps(doc)
        for stage, path in paths.items():
            text = text.replace(f'"{stage}"', json.dumps(str(path)))
        doc = json.loads(text)
        config = root / f"{name}.yml"
        config.write_text(yaml.safe_dump(doc))
        paths[name] = api.merge(config, root / name, quiet=True)
    return load_state(paths["final"])


def test_stages_equal_the_stages_run_one_by_one(staged, tmp_path):
    got = assert_valid_output(staged["out"])
    expected = _one_by_one(staged["documents"], tmp_path)
    assert got.keys() == expected.keys()
    for name, tensor in got.items():
        assert tensor.dtype == expected[name].dtype and tensor.equal(expected[name]), name
    folder = staged["root"] / "out.stages"
    assert sorted(p.name for p in folder.iterdir()) == ["soup", "ta"]


def test_out_records_the_whole_graph(staged):
    recipe = json.loads((staged["out"] / "surgery_recipe.json").read_text())
    graph = {entry["name"]: entry for entry in recipe["stages"]}
    assert list(graph) == ["soup", "ta", None]
    assert graph["ta"]["needs"] == ["soup"] and graph[None]["needs"] == ["soup", "ta"]
    assert graph["soup"]["path"] == str(staged["root"] / "out.stages" / "soup")
    soup_models = [m["model"] for m in graph["ta"]["config"]["models"]]
    assert soup_models[0] == graph["soup"]["path"]
    assert all(len(entry["fingerprint"]) == 64 for entry in graph.values())


@pytest.mark.slow
def test_stages_equal_mergekit_multi(staged, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    multi = Path(sys.executable).parent / "mergekit-multi"
    out = tmp_path / "mergekit"
    command = [multi, staged["config"], "--out-path", out, "-I", tmp_path / "mk-stages"]
    subprocess.run([str(c) for c in command], check=True, env=env, capture_output=True)
    ours, theirs = load_state(staged["out"]), load_state(out)
    assert ours.keys() == theirs.keys()
    ulps = {name: ulp_distance(ours[name], theirs[name]) for name in ours}
    assert max(ulps.values()) <= 1, {k: v for k, v in ulps.items() if v}


def _identity(path: Path) -> list[tuple[str, int, int]]:
    return sorted((p.name, p.stat().st_ino, p.stat().st_mtime_ns) for p in path.iterdir())


def _shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.safetensors"))}


def test_a_run_stopped_in_its_second_stage_reuses_the_first(staged, tmp_path, monkeypatch):
    config = _write(staged["documents"], tmp_path / "stages.yml")
    out = tmp_path / "out"
    expected = api.merge(config, out, quiet=True)
    expected_bytes = _shard_bytes(expected)
    shutil.rmtree(out)
    shutil.rmtree(tmp_path / "out.stages")
    write_plan = surgery.api.write_plan

    def stop_at_ta(plan, target, write, *files):
        if Path(target).name == "ta":
            raise KeyboardInterrupt
        return write_plan(plan, target, write, *files)

    monkeypatch.setattr(surgery.api, "write_plan", stop_at_ta)
    with pytest.raises(KeyboardInterrupt):
        api.merge(config, out, quiet=True)
    monkeypatch.undo()
    soup = tmp_path / "out.stages" / "soup"
    assert not out.exists() and not (tmp_path / "out.stages" / "ta").exists()
    before = _identity(soup)
    api.merge(config, out, quiet=True)
    assert _identity(soup) == before  # not rewritten: same inodes, same times
    assert _shard_bytes(out) == expected_bytes


def test_a_changed_stage_or_input_is_rewritten(staged, tmp_path):
    documents = staged["documents"]
    config = _write(documents, tmp_path / "stages.yml")
    api.merge(config, tmp_path / "out", quiet=True)
    folder = tmp_path / "out.stages"
    soup, ta = _identity(folder / "soup"), _identity(folder / "ta")
    documents[2]["models"][0]["parameters"]["weight"] = 3.0
    _write(documents, config)
    api.merge(config, tmp_path / "out", force=True, quiet=True)
    # The soup changed, so did what it feeds.
    assert _identity(folder / "soup") != soup and _identity(folder / "ta") != ta
    documents[2]["models"][0]["parameters"]["weight"] = 1.0
    _write(documents, config)
    api.merge(config, tmp_path / "again", quiet=True)
    assert load_state(tmp_path / "again").keys() == load_state(staged["out"]).keys()
    for name, tensor in load_state(tmp_path / "again").items():
        assert tensor.equal(load_state(staged["out"])[name]), name


def test_clean_and_intermediate_dir(staged, tmp_path):
    folder = tmp_path / "elsewhere" / "stages"
    args = ["merge", "--clean", "--intermediate-dir", str(folder), str(staged["config"])]
    result = CliRunner().invoke(cli, [*args, str(tmp_path / "out"), "-q"])
    assert result.exit_code == 0, result.output
    assert not folder.exists() and folder.parent.exists()  # only what the stages wrote goes
    assert_valid_output(tmp_path / "out")


def _refused(tmp_path: Path, text: str, message: str, *extra: str) -> None:
    config = tmp_path / "bad.yml"
    config.write_text(text)
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["merge", *extra, str(config), str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists() and not (tmp_path / "out.stages").exists()


DOC = "merge_method: linear\nmodels: [{model: %s}]\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: a\n" + DOC % "b" + "---\nname: b\n" + DOC % "a" + "---\n" + DOC % "a", "cycle"),
        ("name: a\n" + DOC % "a" + "---\n" + DOC % "a", "stages form a cycle: a -> a"),
        (DOC % "x" + "---\n" + DOC % "y", "has 2 documents without a name"),
        ("name: a\n" + DOC % "x", "has 0 documents without a name"),
        ("name: a\n" + DOC % "x" + "---\nname: a\n" + DOC % "x" + "---\n" + DOC % "a", "two"),
        ("name: a/b\n" + DOC % "x" + "---\n" + DOC % "x", "must be a folder name"),
        ("name: a\n" + DOC % "x" + "---\n" + "merge_method: linear\n", "exactly one of"),
    ],
)
def test_bad_graphs_are_one_line_errors(tmp_path, text, message):
    _refused(tmp_path, text, message)


def test_the_intermediate_folder_is_never_inside_an_input(staged, tmp_path):
    inside = staged["family"]["experts"][0] / "stages"
    text = staged["config"].read_text()
    _refused(tmp_path, text, "lies inside the input", "--intermediate-dir", str(inside))
    assert not inside.exists()


def _revert_stage(name: str, expert: Path, base: Path) -> dict:
    """docs/merging.md's revert as a passthrough stage: layers 1 and 2 of 4 from the base."""
    ranges = [(expert, [0, 1]), (base, [1, 3]), (expert, [3, 4])]
    slices = [{"sources": [{"model": str(m), "layer_range": r}]} for m, r in ranges]
    return {"name": name, "merge_method": "passthrough", "slices": slices}


def test_revert_each_expert_then_soup_is_revert_then_soup(families, tmp_path):
    family = families("llama")
    base, experts = family["base"], family["experts"][:2]
    soup = {
        "merge_method": "linear",
        "models": [{"model": f"r{i}", "parameters": {"weight": 1.0}} for i in range(2)],
    }
    stages = [soup, *(_revert_stage(f"r{i}", e, base) for i, e in enumerate(experts))]
    got = load_state(api.merge(_write(stages, tmp_path / "g.yml"), tmp_path / "out", quiet=True))
    reverts = [
        api.revert(base, e, tmp_path / f"revert{i}", "1:3", quiet=True)
        for i, e in enumerate(experts)
    ]
    expected = load_state(api.soup(reverts, tmp_path / "soup", quiet=True))
    assert got.keys() == expected.keys()
    assert all(tensor.equal(expected[name]) for name, tensor in got.items())
    assert not load_state(reverts[0])["model.layers.1.mlp.up_proj.weight"].equal(
        load_state(experts[0])["model.layers.1.mlp.up_proj.weight"]
    )


def _perturbed(base: Path, seed: int, path: Path) -> Path:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    return tiny_models.save(tiny_models.perturb(model, seed), path, "20MB")


@pytest.mark.slow
def test_a_run_killed_by_a_signal_in_its_second_stage_reuses_the_first(tmp_path):
    # Models large enough (45 MB) that the TIES stage lasts past the poll that sees stage 1.
    base = tiny_models.random_llama(tmp_path / "base", hidden=512, layers=4, vocab=16384)
    e1, e2 = (_perturbed(base, seed, tmp_path / f"e{seed}") for seed in (1, 2))
    weights = {"weight": 1.0, "density": 0.5}
    documents = [
        {"merge_method": "linear", "models": [{"model": "s2", "parameters": {"weight": 1.0}}]},
        {
            "name": "s2",
            "merge_method": "ties",
            "base_model": str(base),
            "models": [{"model": m, "parameters": weights} for m in ("s1", str(e2))],
        },
        {
            "name": "s1",
            "merge_method": "linear",
            "models": [{"model": str(m), "parameters": {"weight": 1.0}} for m in (e1, e2)],
        },
    ]
    config = _write(documents, tmp_path / "g.yml")
    out, folder = tmp_path / "out", tmp_path / "out.stages"
    expected = _shard_bytes(api.merge(config, out, quiet=True))  # OUT's recipe names its paths
    shutil.rmtree(out)
    shutil.rmtree(folder)
    command = [Path(sys.executable).parent / "surgery", "merge", "-q", config, out]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    process = subprocess.Popen([str(c) for c in command], env=env, stderr=subprocess.DEVNULL)
    while not (folder / "s1").is_dir() and process.poll() is None:
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert (folder / "s1").is_dir() and not (folder / "s2").exists() and not out.exists()
    before = _identity(folder / "s1")
    api.merge(config, out, quiet=True)
    assert _identity(folder / "s1") == before
    assert sorted(p.name for p in folder.iterdir()) == ["s1", "s2"]  # no partial folder left
    assert _shard_bytes(out) == expected


def test_a_bad_last_stage_writes_nothing(staged, tmp_path):
    documents = [dict(d) for d in staged["documents"]]
    documents[0] = {**documents[0], "merge_method": "ties"}  # TIES needs a base_model
    config = _write(documents, tmp_path / "bad.yml")
    result = CliRunner().invoke(cli, ["merge", str(config), str(tmp_path / "out")])
    assert result.exit_code == 2 and "ties needs a base_model" in result.output, result.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.stages").exists()

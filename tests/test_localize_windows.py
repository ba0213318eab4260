"""localize's sliding windows and boundary bands: which layers they revert, that they find the
layers a tiny model changed, that a band scores as `surgery revert` + `surgery eval` of that band,
and that impossible ones are refused before any model loads."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM

from cli import cli
from eval.scorer import TaskScorer
from surgery.core.errors import LayerSpecError
from surgery.diagnostics.blocks import parse_block_plan, parse_boundaries
from surgery.diagnostics.localize import run_localize
from tests.support.tiny_models import make_tokenizer, random_llama

DATA = "tests/data/eval"
PPL = f"ppl:{DATA}/held_out.txt"
LAYERS = 6
CHANGED = (2, 3)


def layers_of(plan: str, **options) -> list[list[int]]:
    return [block.layers for block in parse_block_plan(**{plan: options.pop(plan)}, **options)
            .resolve(LAYERS)]  # fmt: skip


def test_windows_slide_over_the_stack():
    assert layers_of("window", window=3) == [[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5]]
    assert layers_of("window", window=2, stride=2) == [[0, 1], [2, 3], [4, 5]]
    assert layers_of("window", window=4, stride=3) == [[0, 1, 2, 3]]  # 3:7 does not fit
    assert layers_of("window", window=6) == [list(range(6))]
    blocks = parse_block_plan(window=2, stride=3).resolve(LAYERS)
    assert [b.fields for b in blocks] == [{"start": 0, "end": 2}, {"start": 3, "end": 5}]


def test_boundaries_keep_the_first_and_last_layers():
    assert parse_boundaries("9,6;6,6; 12,6;") == ((9, 6), (6, 6), (12, 6))
    assert layers_of("boundaries", boundaries="2,1;0,0;5,0") == [[2, 3, 4], list(range(6)), [5]]
    (band,) = parse_block_plan(boundaries="1,2").resolve(LAYERS)
    assert band.label == "1:4" and band.fields == {"first": 1, "last": 2}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"window": 7}, "--window 7 is wider than the stack's 6 layers"),
        ({"boundaries": "3,3"}, "leaves no band of the stack's 6 layers"),
        ({"boundaries": "4,5"}, "leaves no band"),
    ],
)
def test_impossible_for_this_stack(options, message):
    plan = parse_block_plan(**options)  # the syntax is fine: the stack decides
    with pytest.raises(LayerSpecError, match=message):
        plan.resolve(LAYERS)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"window": 2, "stride": 0}, "--stride must be at least 1"),
        ({"window": 0}, "--window must be at least 1"),
        ({"stride": 2, "blocks": "0:2"}, "--stride goes with --window"),
        ({"window": 2, "boundaries": "1,1"}, "not --window and --boundaries"),
        ({}, "give one of --blocks"),
        ({"boundaries": "9;6"}, "'9' is not FIRST,LAST"),
        ({"boundaries": "9,-1"}, "negative"),
        ({"boundaries": ";"}, "no FIRST,LAST pair"),
    ],
)
def test_bad_syntax(options, message):
    with pytest.raises(LayerSpecError, match=message):
        parse_block_plan(**options)


@pytest.fixture(scope="module")
def changed_in_two_layers(tmp_path_factory):
    """A 6-layer Llama BASE and a TRAINED trained on the held-out text with only layers 2 and 3
    free (the final norm, which trains too, put back to BASE's): it differs from BASE in those
    two layers only, beyond the noise of two documents."""
    from tests.support.train_helpers import tiny_config
    from train.api import train

    root = tmp_path_factory.mktemp("two_layers")
    base = random_llama(root / "base", hidden=32, layers=LAYERS)
    data = [f"{DATA}/held_out.txt"]
    train(tiny_config(base, root / "run", data, freeze="0:2,4:6", freeze_embeddings=True))
    model = AutoModelForCausalLM.from_pretrained(root / "run", dtype=torch.bfloat16)
    original = dict(AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16).state_dict())
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if not any(f".layers.{layer}." in name for layer in CHANGED):
                tensor.copy_(original[name])
    model.save_pretrained(root / "trained", max_shard_size="40KB")
    make_tokenizer().save_pretrained(root / "trained")
    return base, root / "trained"


def test_window_localization_finds_the_changed_layers(changed_in_two_layers, tmp_path):
    base, trained = changed_in_two_layers
    out = tmp_path / "loc"
    result = run_localize(base, trained, TaskScorer.of([PPL]), window=2, out_dir=out, quiet=True)
    metric = "ppl/held_out/ppl"
    assert metric in result.metrics and metric not in result.within_noise
    recovered = {row["block"]: row[f"recovery/{metric}"] for row in result.rows}
    assert list(recovered) == ["0:2", "1:3", "2:4", "3:5", "4:6"]
    # Reverting unchanged layers changes nothing; reverting both changed ones gives BASE back.
    assert recovered["0:2"] == 0.0 and recovered["4:6"] == 0.0
    assert recovered["2:4"] == 1.0
    assert 0.0 < recovered["1:3"] < 1.0 and 0.0 < recovered["3:5"] < 1.0  # one changed layer
    assert result.best()[metric] == "2:4 @ alpha 0"
    saved = json.loads((out / "localize.json").read_text())
    assert saved["config"]["blocks"] == "window"
    assert [(r["start"], r["end"]) for r in saved["rows"]] == [(i, i + 2) for i in range(5)]
    assert (out / "localize.png").stat().st_size > 10_000  # the window curve


def test_band_localization_finds_the_changed_layers(changed_in_two_layers):
    base, trained = changed_in_two_layers
    result = run_localize(
        base, trained, TaskScorer.of([PPL]), boundaries="2,2;0,4;4,0;1,1", quiet=True
    )
    metric = "ppl/held_out/ppl"
    recovered = {(r["first"], r["last"]): r[f"recovery/{metric}"] for r in result.rows}
    assert recovered[2, 2] == 1.0 and recovered[1, 1] == 1.0  # both hold layers 2 and 3
    assert recovered[0, 4] == 0.0 and recovered[4, 0] == 0.0
    assert result.best()[metric].startswith("2:4 (first 2, last 2) @ alpha 0")


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_boundary_perplexities_equal_revert_then_eval(families, tmp_path):
    """Each band's perplexity in the sweep equals `surgery revert --layers F:N-L` written to
    disk and scored by `surgery eval` (Gemma-3: 4 layers, perturbed everywhere)."""
    paths = families("gemma3")
    pairs = [(1, 1), (0, 2), (2, 0), (0, 0)]
    boundaries = ";".join(f"{first},{last}" for first, last in pairs)
    out = tmp_path / "loc"
    result = run(
        "localize", "-q", "--boundaries", boundaries, "-t", PPL, "-o", out,
        paths["base"], paths["trained"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = json.loads((out / "localize.json").read_text())["rows"]
    assert [(r["first"], r["last"]) for r in rows] == pairs
    for row, (first, last) in zip(rows, pairs, strict=True):
        reverted = tmp_path / f"revert_{first}_{last}"
        done = run(
            "revert", "-q", "--layers", f"{first}:{4 - last}",
            paths["base"], paths["trained"], reverted,
        )  # fmt: skip
        assert done.exit_code == 0, done.output
        scored = tmp_path / f"eval_{first}_{last}.json"
        done = run("eval", reverted, "-t", PPL, "-o", scored, "-q")
        assert done.exit_code == 0, done.output
        metrics = json.loads(scored.read_text())["metrics"]
        for name in ("ppl/held_out/ppl", "ppl/held_out/bits_per_byte"):
            assert row[name] == metrics[name], (first, last, name)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--window", "5"], "--window 5 is wider than the stack's 4 layers"),
        (["--boundaries", "2,2"], "leaves no band of the stack's 4 layers"),
        (["--window", "2", "--stride", "0"], "--stride must be at least 1"),
        (["--boundaries", "1,x"], "is not FIRST,LAST"),
    ],
)
def test_impossible_ones_exit_2_before_any_model_loads(
    families, tmp_path, monkeypatch, options, message
):
    paths = families("llama")

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(TaskScorer, "load", no_loading)
    out = tmp_path / "loc"
    args = ["localize", *options, "-t", PPL, "-o", out, paths["base"], paths["trained"]]
    result = run(*args)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert message in line
    assert not out.exists()

"""--attention-only against the paper's attention_only, per parameter.

The reference (sanchit-ahuja/scaling-multilingual-experts, `regularization.py`) is written here
again from its source, independently of train/ and surgery/: `_extract_layer_idx`,
`_is_mlp_param`, `LayerRangeL2SPRegularizer._should_regularize` and `_get_layer_lambda`,
`LayerFreezer._should_freeze` and `WeightReverter._should_revert`, with `attention_only=True`.
Its `train.py` sets `first_layer_end = first_layers` and `last_layer_start = N - last_layers`,
and loads a multimodal Gemma-3's text model alone (`utils.load_model`), so a vision tower never
reaches the freezer, the regularizer or the reverter.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
import yaml
from click.testing import CliRunner
from transformers import TrainerCallback

from cli import cli
from surgery import api
from tests.support.checks import load_state, same_bits
from tests.support.tiny_models import NUM_LAYERS, build_model
from tests.support.train_helpers import load_tensors, tiny_config, write_corpus

# The reference's setting scaled to the tiny 4-layer models: first_layers 1, last_layers 1
# (middle: layers 1 and 2), lambda_first = lambda_last = 0.5, lambda_middle = 5.
FIRST, LAST, LAMBDA_OUTER, LAMBDA_MIDDLE = 1, 1, 0.5, 5.0
OUR_L2SP, OUR_LAYERS = "1:3=5,*=0.5", "1:3"  # the same in our layer specs


def reference_layer(name: str) -> int | None:
    """`_extract_layer_idx`."""
    match = re.search(r"layers\.(\d+)\.", name)
    return int(match.group(1)) if match else None


def reference_is_mlp(name: str) -> bool:
    """`_is_mlp_param`."""
    return any(p in name for p in ["mlp", "gate_proj", "up_proj", "down_proj", "fc1", "fc2"])


def reference_lambda(name: str, num_layers: int) -> float:
    """The lambda `LayerRangeL2SPRegularizer(attention_only=True)` gives a parameter (0: none)."""
    if "vision_tower" in name or "multi_modal_projector" in name:
        return 0.0
    if reference_is_mlp(name):  # attention_only: MLPs are not regularized
        return 0.0
    index = reference_layer(name)
    if index is None:
        return LAMBDA_OUTER  # lambda_first, for embeddings, final norm, head
    if index < FIRST:
        return LAMBDA_OUTER
    if index >= num_layers - LAST:
        return LAMBDA_OUTER
    return LAMBDA_MIDDLE


def reference_middle_mlp(name: str, num_layers: int) -> bool:
    """What `LayerFreezer` freezes and `WeightReverter` reverts with attention_only=True."""
    if "vision_tower" in name or "multi_modal_projector" in name:
        return False  # not in the text model the reference loads
    index = reference_layer(name)
    if index is None:
        return False
    return FIRST <= index < num_layers - LAST and reference_is_mlp(name)


class RecordTrainable(TrainerCallback):
    """requires_grad of every parameter as training starts."""

    trainable: dict[str, bool]

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.trainable = {n: p.requires_grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_train_applies_the_reference_lambdas_and_freezing(families, tmp_path, monkeypatch, arch):
    """Per parameter: the L2-SP lambda and requires_grad after setup equal the reference's, and
    the frozen parameters end bit-identical to BASE."""
    from train.api import train
    from train.strategies.l2sp import L2SP

    made = []
    original = L2SP.from_model.__func__

    def capture(cls, *args, **kwargs):
        made.append(original(cls, *args, **kwargs))
        return made[-1]

    monkeypatch.setattr(L2SP, "from_model", classmethod(capture))
    record = RecordTrainable()
    corpus = str(write_corpus(tmp_path / "data" / "sk.jsonl", docs=80))
    base = families(arch)["base"]
    config = tiny_config(
        base, tmp_path / "out", [corpus], freeze=OUR_LAYERS, l2sp=OUR_L2SP, attention_only=True
    )
    out = train(config, callbacks=[record])
    lambdas = {t.name: t.strength for t in made[0].terms}
    names = [n for n, _ in build_model(arch).named_parameters()]
    assert sorted(record.trainable) == sorted(names)
    wrong_lambda = {
        n: (lambdas.get(n, 0.0), reference_lambda(n, NUM_LAYERS))
        for n in names
        if lambdas.get(n, 0.0) != reference_lambda(n, NUM_LAYERS)
    }
    assert not wrong_lambda
    wrong_frozen = [n for n in names if record.trainable[n] == reference_middle_mlp(n, NUM_LAYERS)]
    assert not wrong_frozen
    frozen = [n for n in names if reference_middle_mlp(n, NUM_LAYERS)]
    assert frozen and any(reference_lambda(n, NUM_LAYERS) == LAMBDA_MIDDLE for n in names)
    before, after = load_tensors(base), load_tensors(out)
    assert all(same_bits(before[n], after[n]) for n in frozen)
    assert all(not same_bits(before[n], after[n]) for n in names if n not in frozen)
    saved = json.loads((out / "surgery_train.json").read_text())
    assert saved["config"]["attention_only"] is True


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gemma3mm"])
def test_revert_writes_what_the_weight_reverter_reverts(families, tmp_path, arch):
    """Each tensor bit-equal to BASE's where the reference reverts it, else to TRAINED's."""
    paths = families(arch)
    base, trained = load_state(paths["base"]), load_state(paths["trained"])
    out = api.revert(
        paths["base"], paths["trained"], tmp_path / "o", OUR_LAYERS, attention_only=True, quiet=True
    )
    got = load_state(out)
    assert sorted(got) == sorted(trained)
    reverted = [n for n in trained if reference_middle_mlp(n, NUM_LAYERS)]
    assert reverted
    for name in trained:
        assert same_bits(got[name], base[name] if name in reverted else trained[name]), name
        assert not torch.equal(base[name], trained[name])
    recipe = json.loads((out / "surgery_recipe.json").read_text())
    assert recipe["attention_only"] is True and "modules" not in recipe


def test_the_mergekit_config_of_an_attention_only_revert_reproduces_it(families, tmp_path):
    from tests.test_merge import max_ulps, mergekit_run

    paths = families("llama")
    out = tmp_path / "out"
    args = ["revert", "--layers", OUR_LAYERS, "--attention-only", "-q"]
    result = CliRunner().invoke(cli, [*args, str(paths["base"]), str(paths["trained"]), str(out)])
    assert result.exit_code == 0, result.output
    config = yaml.safe_load((out / "mergekit_config.yml").read_text())
    ulps = max_ulps(load_state(out), mergekit_run(config, tmp_path / "mergekit"))
    assert max(ulps.values()) == 0, {k: v for k, v in ulps.items() if v}


def test_the_dry_run_counts_what_attention_only_trains_and_regularizes(families, tmp_path):
    from train.memory_plan import count_parameters

    base = families("llama")["base"]
    sizes = {n: p.numel() for n, p in build_model("llama").named_parameters()}
    config = tiny_config(
        base, tmp_path / "o", [], freeze=OUR_LAYERS, l2sp=OUR_L2SP, attention_only=True
    )
    counts = count_parameters(build_model("llama"), config)
    frozen = sum(v for n, v in sizes.items() if reference_middle_mlp(n, NUM_LAYERS))
    regularized = sum(v for n, v in sizes.items() if reference_lambda(n, NUM_LAYERS))
    assert (counts.trained, counts.regularized) == (counts.total - frozen, regularized)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["revert", "--layers", "1:3", "--attention-only", "--modules", "mlp"],
            "--attention-only and --modules both choose modules",
        ),
        (
            ["train", "--max-steps", "1", "--freeze", "1:3", "--attention-only", "--modules", "a"],
            "--attention-only and --modules both choose modules",
        ),
        (
            ["train", "--max-steps", "1", "--freeze", "1", "--attention-only", "--lora", "r=2"],
            "--attention-only does not apply to --lora",
        ),
        (
            ["train", "--max-steps", "1", "--attention-only"],
            "--attention-only acts on --freeze and --l2sp",
        ),
    ],
)
def test_contradictions_are_one_line_errors_that_write_nothing(families, tmp_path, args, message):
    paths = families("llama")
    out = tmp_path / "out"
    corpus = write_corpus(tmp_path / "data" / "sk.jsonl", docs=10)
    if args[0] == "revert":
        inputs = [str(paths["base"]), str(paths["trained"]), str(out)]
    else:
        inputs = [str(paths["base"]), str(out), "--data", str(corpus)]
    result = CliRunner().invoke(cli, [*args, *inputs])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_attention_only_refuses_a_model_whose_names_it_does_not_know(families, tmp_path):
    """BERT's feed-forward is `intermediate`/`output`: the reference's rule finds no MLP."""
    paths = families("bert")
    out = tmp_path / "out"
    args = ["revert", "--layers", "1:3", "--attention-only"]
    result = CliRunner().invoke(cli, [*args, str(paths["base"]), str(paths["trained"]), str(out)])
    assert result.exit_code == 2, result.output
    assert "--attention-only (the MLP tensors" in result.stderr and not out.exists()


def test_help_names_the_option():
    for command in ("train", "revert"):
        result = CliRunner().invoke(cli, [command, "--help"])
        assert "--attention-only" in result.output and "attention_only" in result.output

"""--early-stopping: transformers' EarlyStoppingCallback and best-model reload on the periodic
scores, stopping where the patience implies and saving the best scored step's weights."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import TrainerCallback

from tests.support.train_helpers import load_tensors, tiny_config, write_corpus
from train.api import train
from train.errors import TrainConfigError
from train.strategies.early_stopping import parse_early_stopping


class Weights(TrainerCallback):
    """The trainable weights at the end of each step (after its optimizer update)."""

    def __init__(self) -> None:
        self.by_step: dict[int, dict[str, torch.Tensor]] = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.by_step[state.global_step] = {
            n: p.detach().clone() for n, p in model.named_parameters()
        }


def scripted(values: list[float]):
    """A scorer giving the next value of `values` at each call (one call per scored step)."""
    calls = []

    def score(model, tokenizer):
        calls.append(len(calls))
        return {"probe/acc": values[len(calls) - 1]}

    return score, calls


def _stopping(families, tmp_path, corpus, max_steps: int, patience: int, threshold: float):
    """A tiny run scored every step on the scripted probe/acc, stopping early on it."""
    return tiny_config(
        families("llama")["base"],
        tmp_path / "out",
        [corpus],
        max_steps=max_steps,
        eval_every=1,
        eval_tasks=["probe"],
        early_stopping="probe/acc",
        patience=patience,
        early_stopping_threshold=threshold,
    )


@pytest.fixture
def corpus(tmp_path):
    return str(write_corpus(tmp_path / "data" / "sk.jsonl", docs=80))


def test_stops_at_the_patience_and_saves_the_best_step(families, tmp_path, corpus):
    # Scores at steps 1..4: best at step 2, then two scores without improvement: stop at 4.
    score, calls = scripted([0.1, 0.3, 0.2, 0.25, 0.9, 0.9])
    weights = Weights()
    config = _stopping(families, tmp_path, corpus, max_steps=6, patience=2, threshold=0.0)
    out = train(config, [weights], score)
    assert len(calls) == 4  # scored once per step, the Trainer's evaluation reuses the scores
    record = json.loads((out / "surgery_train.json").read_text())
    assert record["steps"] == 4
    assert record["early_stopping"] == {
        "metric": "probe/acc",
        "best_step": 2,
        "best_value": 0.3,
        "stopped_at": 4,
        "stopped_early": True,
    }
    saved = load_tensors(out)
    best, last = weights.by_step[2], weights.by_step[4]
    name = "model.layers.1.mlp.down_proj.weight"
    assert torch.equal(saved[name], best[name].to(saved[name].dtype))
    assert not torch.equal(saved[name], last[name].to(saved[name].dtype))
    assert not (out / "checkpoints").exists()


def test_threshold_counts_small_gains_as_no_improvement(families, tmp_path, corpus):
    # 0.32 beats 0.3 by less than the threshold: no improvement for the patience (it stops at 3),
    # though the Trainer's best is then step 3's (it compares without the threshold).
    score, _ = scripted([0.1, 0.3, 0.32, 0.9])
    config = _stopping(families, tmp_path, corpus, max_steps=4, patience=1, threshold=0.05)
    record = json.loads((train(config, [], score) / "surgery_train.json").read_text())
    assert record["early_stopping"]["stopped_at"] == 3


@pytest.mark.parametrize(
    ("spec", "metric", "greater"),
    [
        ("ppl/sk/ppl", "ppl/sk/ppl", False),
        ("eval/belebele/acc", "belebele/acc", True),
        ("flores/chrf", "flores/chrf", True),
        ("copain/max/score:min", "copain/max/score", False),
    ],
)
def test_direction_from_the_metric_kind(spec, metric, greater):
    early = parse_early_stopping(spec, patience=6, threshold=0.005)
    assert (early.metric, early.greater_is_better) == (metric, greater)


def test_bad_requests_are_one_line_errors(families, tmp_path, corpus):
    base = families("llama")["base"]
    with pytest.raises(TrainConfigError, match="add :max or :min"):
        parse_early_stopping("probe/score", 6, 0.0)
    with pytest.raises(TrainConfigError, match="needs --eval-every"):
        train(tiny_config(base, tmp_path / "o", [corpus], early_stopping="ppl/ppl"))
    options = dict(eval_every=3, eval_tasks=["probe"], ema=0.9, ema_every=2)
    with pytest.raises(TrainConfigError, match="multiple of --ema-every"):
        tiny_config(base, tmp_path / "o", [corpus], early_stopping="ppl/ppl", **options).validate()
    assert not (tmp_path / "o").exists()

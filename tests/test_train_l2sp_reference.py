"""L2-SP against the paper's reference formula, implemented here independently of train/.

The reference (sanchit-ahuja/scaling-multilingual-experts, `regularization.py`) adds
`sum_p lambda_p * sum((w - w0)^2)` to the loss in `compute_loss`, on every micro-batch; a
parameter's region comes from `layers.(\\d+).` (first if idx < first, last if idx >= N - last,
else middle) and parameters outside the layers get lambda_first. What that amounts to per
optimizer step depends on transformers' Trainer: it divides each micro-batch's loss by the
accumulation steps only when the model's loss is not already normalized by `num_items_in_batch`
(`model_accepts_loss_kwargs`). Llama (and Gemma3ForCausalLM, which the reference trains)
accept loss kwargs, so the penalty is counted once per micro-batch: `grad_accum` times per step.
"""

from __future__ import annotations

import re

import pytest
import torch
from transformers import TrainerCallback

from tests.support.train_helpers import tiny_config, write_corpus
from train.api import train
from train.trainer import SurgeryTrainer

# The reference's setting, scaled to the tiny 4-layer Llama: first 1 and last 1 layer outer.
FIRST, LAST, LAMBDA_OUTER, LAMBDA_MIDDLE = 1, 1, 0.5, 5.0
OURS = "1:3=5,*=0.5"  # the same lambdas in our layer spec


def reference_lambda(name: str, num_layers: int) -> float:
    """The reference's lambda of one parameter (LayerRangeL2SPRegularizer._get_layer_lambda)."""
    match = re.search(r"layers\.(\d+)\.", name)
    if match is None:
        return LAMBDA_OUTER  # lambda_first for embeddings, final norm
    index = int(match.group(1))
    if index < FIRST or index >= num_layers - LAST:
        return LAMBDA_OUTER
    return LAMBDA_MIDDLE


class ReferenceTrainer(SurgeryTrainer):
    """The training run of `train()` with the reference's penalty added to each micro-batch's
    loss (and no L2-SP of ours)."""

    accepts_loss_kwargs: bool | None = None  # None: as the Trainer decides from the model

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.accepts_loss_kwargs is not None:
            self.model_accepts_loss_kwargs = self.accepts_loss_kwargs
        layers = self.model.config.num_hidden_layers
        self.anchor = [
            (reference_lambda(name, layers), param, param.detach().clone())
            for name, param in self.model.named_parameters()
            if param.requires_grad
        ]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        penalty = sum(lam * (p - w0).pow(2).sum() for lam, p, w0 in self.anchor)
        if return_outputs:
            return loss[0] + penalty, loss[1]
        return loss + penalty


class Final(TrainerCallback):
    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.weights = {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture
def corpus(tmp_path):
    return str(write_corpus(tmp_path / "data" / "sk.jsonl", docs=80))


def _run(families, tmp_path, corpus, name, monkeypatch, trainer=None, **overrides) -> dict:
    if trainer is not None:
        monkeypatch.setattr("train.trainer.SurgeryTrainer", trainer)
    final = Final()
    config = tiny_config(families("llama")["base"], tmp_path / name, [corpus], **overrides)
    train(config, callbacks=[final])
    monkeypatch.setattr("train.trainer.SurgeryTrainer", SurgeryTrainer)
    return final.weights


def _distance(a: dict, b: dict) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in a)


@pytest.mark.parametrize(
    ("accepts_loss_kwargs", "per_step"),
    [(None, 2), (False, 1)],
    ids=["loss-normalized-model", "loss-divided-by-accumulation"],
)
def test_l2sp_equals_the_reference_formula(
    families, tmp_path, corpus, monkeypatch, accepts_loss_kwargs, per_step
):
    # Two accumulated micro-batches per optimizer step. With a model whose loss takes
    # num_items_in_batch (Llama), the reference's per-micro-batch penalty counts twice per
    # step, so our per-step lambdas must be twice the reference's; where the Trainer divides
    # the loss by the accumulation steps (a model that does not accept loss kwargs, as
    # Gemma3ForConditionalGeneration in transformers 4.57), once.
    common = dict(batch_size=1, grad_accum=2, max_steps=5)
    reference_cls = type("Reference", (ReferenceTrainer,), {})
    reference_cls.accepts_loss_kwargs = accepts_loss_kwargs
    reference = _run(families, tmp_path, corpus, "ref", monkeypatch, reference_cls, **common)
    scaled = f"1:3={LAMBDA_MIDDLE * per_step:g},*={LAMBDA_OUTER * per_step:g}"
    ours = _run(families, tmp_path, corpus, "ours", monkeypatch, l2sp=scaled, **common)
    other = 3 - per_step  # the other accumulation rule's lambdas: must not match
    wrong = f"1:3={LAMBDA_MIDDLE * other:g},*={LAMBDA_OUTER * other:g}"
    mismatch = _run(families, tmp_path, corpus, "wrong", monkeypatch, l2sp=wrong, **common)
    assert _distance(ours, reference) < 1e-5
    assert _distance(mismatch, reference) > 100 * _distance(ours, reference)


def test_half_form_is_the_sum_form_at_half_strength(families, tmp_path, corpus, monkeypatch):
    full = _run(families, tmp_path, corpus, "sum", monkeypatch, l2sp=OURS)
    half = _run(
        families, tmp_path, corpus, "half", monkeypatch, l2sp="1:3=10,*=1", l2sp_form="half"
    )
    assert all(torch.equal(full[n], half[n]) for n in full)

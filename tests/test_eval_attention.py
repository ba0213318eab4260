"""Grouped-query attention on a CPU (eval/attention.py): scoring copies no key/value head, and
scores as the copying path does."""

from __future__ import annotations

import os
import random

import pytest
import torch
import transformers.integrations.sdpa_attention as sdpa

from eval.attention import FLAG, grouped_query_attention
from eval.scoring import ChoiceRequest, choice_loglikelihoods
from tests.support import tiny_models
from tests.support.tolerances import LL_TOL


def _requests() -> list[ChoiceRequest]:
    rng = random.Random(3)
    vocab = tiny_models.vocab_size()
    shared = [1, *(rng.randrange(3, vocab) for _ in range(20))]
    contexts = [
        shared + [rng.randrange(3, vocab) for _ in range(rng.randint(1, 9))] for _ in range(5)
    ]
    return [ChoiceRequest(c, [[rng.randrange(3, vocab)] for _ in range(3)]) for c in contexts]


def test_scoring_reads_grouped_heads_without_copies(monkeypatch):
    """The tiny Llama has 2 query heads on 1 key/value head: outside the block SDPA's path
    copies the heads (`repeat_kv`), inside it never does; the scores agree."""
    monkeypatch.delenv(FLAG, raising=False)
    model = tiny_models.build_model("llama").float().eval()
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    copies = []
    repeat = sdpa.repeat_kv
    monkeypatch.setattr(sdpa, "repeat_kv", lambda *a: copies.append(1) or repeat(*a))
    requests = _requests()
    with torch.no_grad():  # the copying path, as a plain forward with padding takes it
        ids = torch.tensor([requests[0].context])
        mask = torch.ones_like(ids)
        mask[0, 0] = 0
        model(input_ids=ids, attention_mask=mask)
    assert copies
    copies.clear()
    got = choice_loglikelihoods(model, requests, batch_size=2)
    assert not copies
    assert FLAG not in os.environ
    with monkeypatch.context() as patched:  # the copying path: a GPU's
        patched.setattr("eval.scoring.grouped_query_attention", _unchanged)
        copied = choice_loglikelihoods(model, requests, batch_size=2)
    assert copies
    for x, y in zip(got, copied, strict=True):
        assert x == pytest.approx(y, abs=LL_TOL)


def _unchanged(device: torch.device):
    return grouped_query_attention(torch.device("meta"))


def test_the_flag_is_left_alone_off_a_cpu_and_when_set(monkeypatch):
    monkeypatch.delenv(FLAG, raising=False)
    with grouped_query_attention(torch.device("meta")):
        assert FLAG not in os.environ
    monkeypatch.setenv(FLAG, "0")
    with grouped_query_attention(torch.device("cpu")):
        assert os.environ[FLAG] == "0"
    assert os.environ[FLAG] == "0"

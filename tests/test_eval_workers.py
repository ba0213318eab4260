"""Batches scored side by side on a CPU's threads (eval.workers) give the scores of batches
scored one at a time, in the order given, and leave torch's thread count as it was."""

from __future__ import annotations

import random

import pytest
import torch

from eval.scoring import ChoiceRequest, choice_loglikelihoods
from eval.workers import map_batches
from tests.support import tiny_models


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_map_batches_keeps_order_shares_threads_and_restores_them(two_threads):
    seen = list(
        map_batches(
            lambda b: (b, torch.get_num_threads(), torch.is_inference_mode_enabled()),
            [3, 1, 2],
            torch.device("cpu"),
        )
    )
    assert seen == [(3, 1, True), (1, 1, True), (2, 1, True)]
    assert torch.get_num_threads() == 2


def test_map_batches_raises_a_batch_error_and_restores_threads(two_threads):
    def fail(batch: int) -> int:
        if batch == 2:
            raise ValueError("batch 2")
        return batch

    with pytest.raises(ValueError, match="batch 2"):
        list(map_batches(fail, [1, 2, 3], torch.device("cpu")))
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_side_by_side_batches_score_as_one_at_a_time(arch, two_threads):
    """Twelve items sharing a prefix, in batches of 3 (four batches, two at a time), against
    the same call on one thread (batches in order): equal to the last bit."""
    model = tiny_models.build_model(arch).float().eval()
    rng = random.Random(arch)
    vocab = tiny_models.vocab_size()

    def tokens(low: int, high: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(rng.randint(low, high))]

    shared = [1, *tokens(20, 20)]
    requests = [
        ChoiceRequest(shared + tokens(1, 30), [tokens(1, 5) for _ in range(rng.randint(1, 4))])
        for _ in range(12)
    ]
    side_by_side = choice_loglikelihoods(model, requests, batch_size=3)
    torch.set_num_threads(1)
    one_at_a_time = choice_loglikelihoods(model, requests, batch_size=3)
    assert side_by_side == one_at_a_time


@pytest.mark.parametrize("threads", [1, 2])
def test_a_failing_prefix_encoding_fails_the_call(threads, monkeypatch):
    """The prefix is encoded beside the contexts that do not share it; batches waiting for it
    get its error, and the call raises it rather than waiting forever."""
    import eval.scoring as scoring

    def fail(model, contexts):
        raise RuntimeError("out of memory in the prefix")

    monkeypatch.setattr(scoring, "encode_shared_prefix", fail)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = tiny_models.build_model("llama").float().eval()
        shared = list(range(3, 23))
        requests = [ChoiceRequest([*shared, 30 + i], [[5]]) for i in range(6)]
        requests.append(ChoiceRequest([40, 41], [[5]]))  # shares nothing: runs beside it
        with pytest.raises(RuntimeError, match="out of memory in the prefix"):
            choice_loglikelihoods(model, requests, batch_size=2)
    finally:
        torch.set_num_threads(before)

"""The shared-prefix KV cache (eval/prefix_cache.py): same scores as whole contexts, run once.

Per-item log-likelihoods with and without the cache agree within 1e-5 (float32) on tiny Llama,
Gemma-3 (16-token sliding window, far shorter than the prefix), Gemma-3 multimodal and GPT-2,
at 0 and 2 shots, batch sizes 1 and several; the prefix is chosen as a brute force would, and
the model really runs it once (its input tokens are counted).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from cli import cli
from eval.api import evaluate
from eval.kinds.mc import score_items
from eval.kinds.templates import TARGET_DELIMITER
from eval.prefix_cache import (
    MIN_GROUP_TOKENS,
    encode_shared_prefix,
    shared_groups,
    shared_prefix,
)
from eval.scoring import ChoiceRequest, choice_loglikelihoods, make_request
from eval.tasks import Settings, load_task, parse_task
from eval.tokens import TextEncoder
from tests.support import eval_reference as ref
from tests.support import tiny_models
from tests.support.tolerances import LL_TOL

ARCHS = ["llama", "gemma3", "gemma3mm", "gpt2"]
# GPT-2's learned positions stop at 128: the rows below keep 2-shot prompts within that.
MAX_LENGTH = 128
# The cached and the whole forward round differently (4 float32 ulps of a 40-nat score, 3.8e-6,
# on one CPU, so 1e-5 held there only): the tolerance of every log-likelihood comparison.
TOLERANCE = LL_TOL
ROWS = 6


@pytest.fixture(scope="module", params=ARCHS)
def model(request):
    return tiny_models.build_model(request.param).float().eval()


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_models.make_tokenizer()


def _write_rows(folder: Path) -> dict[str, Path]:
    """Short Belebele rows and classic PIQA rows (multi-token choices), ROWS of each."""
    rng = random.Random(20)
    letters = "abcdefgh"
    belebele, piqa = folder / "belebele.jsonl", folder / "piqa.jsonl"
    with belebele.open("w") as out:
        for n in range(ROWS):
            row = {
                "flores_passage": letters[n] + rng.choice(letters),
                "question": rng.choice(letters),
                **{f"mc_answer{k}": rng.choice(letters) for k in range(1, 5)},
                "correct_answer_num": str(rng.randint(1, 4)),
            }
            out.write(json.dumps(row) + "\n")
    with piqa.open("w") as out:
        for n in range(ROWS):
            sols = ["".join(rng.choices(letters, k=rng.randint(2, 6))) for _ in range(2)]
            row = {"goal": letters[n], "sol1": sols[0], "sol2": sols[1], "label": n % 2}
            out.write(json.dumps(row) + "\n")
    return {"belebele": belebele, "piqa": piqa}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return _write_rows(tmp_path_factory.mktemp("prefix_rows"))


def _task(files, kind: str, shots: int):
    # Classic PIQA with first_n: the 2-token-plus choices run a second forward from the cache.
    sampler = ",sampler=first_n" if kind == "piqa" else ""
    return load_task(parse_task(f"{kind}:{files[kind]}:shots={shots}{sampler}"))


def _score(model, tokenizer, task, batch_size: int, prefix_cache: bool):
    contexts = task.contexts(len(task.items), 0)
    settings = Settings(
        batch_size=batch_size, max_length=MAX_LENGTH, progress=False, prefix_cache=prefix_cache
    )
    encoder = TextEncoder(tokenizer, True)
    scores, truncated = score_items(model, encoder, contexts, task.items, settings)
    assert truncated == 0
    return scores


def _requests(task, tokenizer) -> list[ChoiceRequest]:
    encoder = TextEncoder(tokenizer, True)
    contexts = task.contexts(len(task.items), 0)
    return [
        make_request(encoder, context, [TARGET_DELIMITER + c for c in item.choices], MAX_LENGTH)[0]
        for context, item in zip(contexts, task.items, strict=True)
    ]


@pytest.mark.parametrize("kind", ["belebele", "piqa"])
@pytest.mark.parametrize("shots", [0, 2])
def test_prefix_cache_gives_the_scores_of_whole_contexts(model, tokenizer, files, kind, shots):
    task = _task(files, kind, shots)
    length, members = shared_prefix([r.context for r in _requests(task, tokenizer)])
    if shots == 2:
        # first_n: items 0 and 1 skip themselves; the other rows share both demonstrations.
        assert members == list(range(2, ROWS))
        assert length > sum(len(task.items[j].demonstration()) for j in (0, 1)) - 2
    else:
        assert length > 0 and len(members) >= 2  # BOS and the prompt's first letters
    whole = torch.tensor(_score(model, tokenizer, task, 3, prefix_cache=False))
    for batch_size in (1, 3):  # one item per batch; ragged batches (6 items in 3s: 4 + 2)
        cached = torch.tensor(_score(model, tokenizer, task, batch_size, prefix_cache=True))
        assert (cached - whole).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("arch", ARCHS)
def test_ragged_requests_from_the_prefix_cache_equal_plain_forwards(arch):
    """Random ids: nine contexts share 30 tokens (past Gemma-3's window) and then differ in
    length (1..40 more), three share nothing; 1 to 4 choices of 1..20 tokens; batches of 4 mix
    lengths, so rows re-run part of the prefix."""
    model = tiny_models.build_model(arch).float().eval()
    rng = random.Random(arch)
    vocab = tiny_models.vocab_size()

    def tokens(low: int, high: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(rng.randint(low, high))]

    shared = [1, *tokens(29, 29)]
    contexts = [shared + tokens(1, 40) for _ in range(9)] + [[1, *tokens(2, 60)] for _ in range(3)]
    requests = [
        ChoiceRequest(c, [tokens(1, 20) for _ in range(rng.randint(1, 4))]) for c in contexts
    ]
    prefix = encode_shared_prefix(model, contexts)
    assert prefix is not None and prefix.length >= len(shared)
    assert set(range(9)) <= set(prefix.members)
    got = choice_loglikelihoods(model, requests, batch_size=4)
    whole = choice_loglikelihoods(model, requests, batch_size=4, prefix_cache=False)
    # Whole contexts are checked against plain forwards in test_eval_scores.py.
    difference = max(
        abs(a - b) for x, y in zip(got, whole, strict=True) for a, b in zip(x, y, strict=True)
    )
    assert difference <= TOLERANCE
    # One plain forward per item still, for the longest choice: the cache is not just
    # consistent with itself.
    for request, item_scores in zip(requests, got, strict=True):
        longest = max(range(len(item_scores)), key=lambda k: len(request.continuations[k]))
        expected = ref.logprob_after(model, request.context, request.continuations[longest])
        assert item_scores[longest] == pytest.approx(expected, abs=LL_TOL)


def _brute_force(contexts: list[list[int]]) -> int:
    """Most tokens saved by any prefix: its length x (contexts starting with it - 1), every
    context keeping one token of its own."""
    best = 0
    for context in contexts:
        for length in range(1, len(context)):
            head = context[:length]
            starting = [c for c in contexts if c[:length] == head and len(c) > length]
            best = max(best, length * (len(starting) - 1))
    return best


def test_shared_prefix_saves_as_many_tokens_as_a_brute_force():
    rng = random.Random(0)
    for _ in range(300):
        stems = [[rng.randrange(3) for _ in range(rng.randint(0, 6))] for _ in range(3)]
        contexts = [
            rng.choice(stems) + [rng.randrange(3) for _ in range(rng.randint(0, 4))]
            for _ in range(rng.randint(1, 7))
        ]
        contexts = [c for c in contexts if c] or [[0]]
        length, members = shared_prefix(contexts)
        assert length * max(len(members) - 1, 0) == _brute_force(contexts)
        for index in members:  # every member starts with the prefix and keeps a token
            assert contexts[index][:length] == contexts[members[0]][:length]
            assert len(contexts[index]) > length
        assert len(members) == len(set(members))


def test_shared_prefix_of_duplicates_and_nested_contexts():
    # Identical contexts still keep their last token to run; one context inside another too.
    assert shared_prefix([[1, 2, 3], [1, 2, 3]]) == (2, [0, 1])
    assert shared_prefix([[1, 2, 3], [1, 2, 3, 4]]) == (2, [0, 1])
    assert shared_prefix([[5]]) == (0, [])
    assert shared_prefix([[1, 2], [3, 4]]) == (0, [])


def _count_input_tokens(model) -> tuple[list[int], object]:
    seen: list[int] = []

    def hook(_module, _args, kwargs):
        seen.append(kwargs["input_ids"].numel())

    return seen, model.register_forward_pre_hook(hook, with_kwargs=True)


def test_the_shared_prefix_runs_once(tokenizer, files):
    """With batch size 1 the model sees the prefix once, then each context's own tokens, then
    each item's choices but their last token (the tiny tokenizer spells " A" in two tokens)."""
    model = tiny_models.build_model("llama").float().eval()
    task = _task(files, "belebele", 2)
    requests = _requests(task, tokenizer)
    length, members = shared_prefix([r.context for r in requests])
    seen, handle = _count_input_tokens(model)
    try:
        choice_loglikelihoods(model, requests, batch_size=1)
    finally:
        handle.remove()
    own = [len(r.context) - (length if i in members else 0) for i, r in enumerate(requests)]
    tails = [len(r.continuations) * (max(map(len, r.continuations)) - 1) for r in requests]
    assert sorted(seen) == sorted([length, *own, *tails])
    assert sum(seen) < sum(len(r.context) for r in requests) - (len(members) - 2) * length


def test_models_without_a_plain_cache_run_whole_contexts(tokenizer, files, monkeypatch):
    """A stateful model (recurrent state, no per-token keys) gets no prefix cache: it runs
    exactly the forwards of whole contexts, with the same scores."""
    model = tiny_models.build_model("llama").float().eval()
    task = _task(files, "belebele", 2)
    requests = _requests(task, tokenizer)
    assert encode_shared_prefix(model, [r.context for r in requests]) is not None
    seen_whole, handle = _count_input_tokens(model)
    try:
        whole = _score(model, tokenizer, task, 3, prefix_cache=False)
    finally:
        handle.remove()
    monkeypatch.setattr(model, "_is_stateful", True, raising=False)
    assert encode_shared_prefix(model, [r.context for r in requests]) is None
    seen, handle = _count_input_tokens(model)
    try:
        assert _score(model, tokenizer, task, 3, prefix_cache=True) == whole
    finally:
        handle.remove()
    # Batches may run side by side on a CPU's threads (eval/workers.py): the order of forwards
    # is not fixed, the forwards are.
    assert sorted(seen) == sorted(seen_whole)


def test_evaluate_and_cli_switch_the_cache_off(tokenizer, files, tmp_path, monkeypatch):
    """`prefix_cache=False` (CLI: --no-prefix-cache) reaches the scorer; metrics unchanged."""
    model = tiny_models.build_model("llama").float().eval()
    text = f"belebele:{files['belebele']}:shots=2"
    calls: list[bool] = []
    import eval.scoring as scoring

    real = scoring.encode_shared_prefix

    def spy(*args, **kwargs):
        calls.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(scoring, "encode_shared_prefix", spy)
    on = evaluate(model, tokenizer, [text], max_length=MAX_LENGTH, progress=False)
    off = evaluate(
        model, tokenizer, [text], max_length=MAX_LENGTH, progress=False, prefix_cache=False
    )
    assert calls == [True]
    assert on["metrics"] == off["metrics"]


def test_brute_force_oracle_is_not_trivial():
    # The oracle above must see real sharing, or the comparison with it proves nothing.
    contexts = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6], [7, 8]]
    assert _brute_force(contexts) == 4  # [1, 2] x 2 others beats [1, 2, 3] x 1
    assert shared_prefix(contexts) == (2, [0, 1, 2])


@pytest.mark.parametrize(("flag", "expected"), [([], True), (["--no-prefix-cache"], False)])
def test_cli_flag_reaches_evaluate(files, monkeypatch, tmp_path, flag, expected):
    import eval.api

    seen = {}

    def fake_evaluate(model, tokenizer, tasks, **kwargs):
        seen.update(kwargs)
        return {"metrics": {"belebele/acc": 0.5, "belebele/n": 6}, "config": {}}

    monkeypatch.setattr(eval.api, "evaluate", fake_evaluate)
    monkeypatch.setattr(eval.api, "load_model", lambda *a, **k: (None, None))  # score_checkpoint's
    task = f"belebele:{files['belebele']}:shots=2"
    checkpoint = tmp_path / "ckpt"  # checked to exist before anything loads
    checkpoint.mkdir()
    result = CliRunner().invoke(cli, ["eval", str(checkpoint), "-t", task, "-q", *flag])
    assert result.exit_code == 0, result.output
    assert seen["prefix_cache"] is expected


def _passage_requests(seed: str, passages: int = 5, most: int = 3) -> list[ChoiceRequest]:
    """Random ids: every context starts with 30 shared tokens (past Gemma-3's window), then one
    of `passages` passages (10..30 tokens) asked 1 to `most` questions (1..15 tokens each),
    then four one-token choices; two contexts share nothing."""
    rng = random.Random(seed)
    vocab = tiny_models.vocab_size()

    def tokens(low: int, high: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(rng.randint(low, high))]

    shared = [1, *tokens(29, 29)]
    contexts = []
    for _ in range(passages):
        passage = tokens(10, 30)
        contexts += [shared + passage + tokens(1, 15) for _ in range(rng.randint(1, most))]
    contexts += [[1, *tokens(2, 60)] for _ in range(2)]
    return [ChoiceRequest(c, [[rng.randrange(3, vocab)] for _ in range(4)]) for c in contexts]


@pytest.mark.parametrize("arch", ARCHS)
def test_items_sharing_a_passage_score_as_whole_contexts(arch):
    """Questions on one passage run it once per batch (a second forward for their own tokens):
    the scores of whole contexts, and of a plain forward per choice, at batch sizes that
    split groups, hold one, or hold several."""
    model = tiny_models.build_model(arch).float().eval()
    requests = _passage_requests(arch)
    contexts = [r.context for r in requests]
    prefix = encode_shared_prefix(model, contexts)
    assert prefix is not None
    groups = shared_groups(contexts, prefix.length, prefix.members, 8)
    assert any(len(indices) > 1 for indices, _ in groups)  # the grouped path runs
    _assert_scores_as_whole_and_plain(model, requests, (1, 2, 8), choice=-1)


@pytest.mark.parametrize("arch", ARCHS)
def test_passages_asked_once_run_after_the_prefix_columns(arch):
    """One question per passage (no groups): every row of a batch reads the prefix's own keys
    and values (views, nothing copied) and runs its own tokens right-padded after them. The
    scores of whole contexts and of a plain forward per choice, at batch sizes that mix
    lengths."""
    model = tiny_models.build_model(arch).float().eval()
    requests = _passage_requests(arch + "/once", passages=9, most=1)
    contexts = [r.context for r in requests]
    prefix = encode_shared_prefix(model, contexts)
    assert prefix is not None and len(prefix.members) == 9
    groups = shared_groups(contexts, prefix.length, prefix.members, 8)
    assert all(len(indices) == 1 for indices, _ in groups)
    cache = prefix.expanded(3)
    for (keys, _), layer in zip(prefix.layers, cache.layers, strict=True):
        if keys is not None:
            assert layer.keys.shape[0] == 3 and layer.keys.data_ptr() == keys.data_ptr()
    _assert_scores_as_whole_and_plain(model, requests, (1, 3, 8), choice=0)


def test_shared_groups_partition_the_members_into_contexts_sharing_a_head():
    rng = random.Random(1)
    for _ in range(300):
        stems = [[rng.randrange(3) for _ in range(rng.randint(0, 12))] for _ in range(3)]
        contexts = [
            [7, 7] + rng.choice(stems) + [rng.randrange(3) for _ in range(rng.randint(1, 4))]
            for _ in range(rng.randint(1, 9))
        ]
        most = rng.randint(1, 4)
        groups = shared_groups(contexts, 2, range(len(contexts)), most)
        assert sorted(i for indices, _ in groups for i in indices) == list(range(len(contexts)))
        for indices, length in groups:
            assert len(indices) <= most
            head = contexts[indices[0]][:length]
            assert all(contexts[i][:length] == head and len(contexts[i]) > length for i in indices)
            if len(indices) > 1:
                assert length >= 2 + MIN_GROUP_TOKENS
            else:  # alone: all but its last token
                assert length == len(contexts[indices[0]]) - 1


def test_shared_groups_of_passages_asked_twice():
    passage = list(range(10, 10 + MIN_GROUP_TOKENS))
    contexts = [[1, 2, *passage, 3], [1, 2, *passage, 4, 5], [1, 2, 9, 3], [1, 2, *passage[:-1]]]
    # The last context shares two tokens too few with the first two (it keeps one): alone.
    assert shared_groups(contexts, 2, [0, 1, 2, 3], 8) == [
        ([2], 3),
        ([3], MIN_GROUP_TOKENS),
        ([0, 1], 2 + MIN_GROUP_TOKENS),
    ]
    # Groups of at most one: each alone.
    assert shared_groups(contexts, 2, [0, 1], 1) == [
        ([0], 2 + MIN_GROUP_TOKENS),
        ([1], 3 + MIN_GROUP_TOKENS),
    ]


def test_a_passage_runs_once_per_batch():
    """Batches of two hold one passage's two questions: the model sees the prefix once, then
    per batch the passage's tokens past the prefix once and each question's own tokens."""
    model = tiny_models.build_model("llama").float().eval()
    shared = [1, *range(3, 23)]
    passages = [list(range(30 + 20 * p, 42 + 20 * p)) for p in range(3)]
    contexts = [shared + p + [80 + q, 90 + q, 95] for p in passages for q in range(2)]
    requests = [ChoiceRequest(c, [[5], [6]]) for c in contexts]
    seen, handle = _count_input_tokens(model)
    try:
        got = choice_loglikelihoods(model, requests, batch_size=2)
    finally:
        handle.remove()
    assert shared_prefix(contexts) == (len(shared), list(range(6)))
    # The prefix, then per batch: one passage (a row of 12), two questions (2 rows of 3).
    assert sorted(seen) == sorted([len(shared)] + [12, 6] * 3)
    whole = choice_loglikelihoods(model, requests, batch_size=2, prefix_cache=False)
    pairs = zip(got, whole, strict=True)
    assert max(abs(a - b) for x, y in pairs for a, b in zip(x, y, strict=True)) <= TOLERANCE


def _assert_scores_as_whole_and_plain(model, requests, batch_sizes, choice: int) -> None:
    """At each batch size, the prefix cache's scores are whole contexts' (within TOLERANCE);
    each item's `choice` is a plain forward's."""
    whole = choice_loglikelihoods(model, requests, batch_size=8, prefix_cache=False)
    for batch_size in batch_sizes:
        got = choice_loglikelihoods(model, requests, batch_size=batch_size)
        difference = max(
            abs(a - b) for x, y in zip(got, whole, strict=True) for a, b in zip(x, y, strict=True)
        )
        assert difference <= TOLERANCE
    for request, item_scores in zip(requests, got, strict=True):
        expected = ref.logprob_after(model, request.context, request.continuations[choice])
        assert item_scores[choice] == pytest.approx(expected, abs=LL_TOL)

"""The greedy decoding loop (`eval.generation.greedy`) against transformers' `model.generate`.

Tiny real architectures, prompts of ragged lengths, rows that stop at different steps (a line
end, EOS, the token limit, a stop string across token boundaries): the same tokens as greedy
`generate` on each prompt alone and on the prompts left-padded together, whatever the batches.
Batches are sized by memory unless a batch size is given. A slow test compares the generations
of SmolLM2-135M with lm-eval's HF `generate_until` on the same prompt strings, 0- and 2-shot.
"""

from __future__ import annotations

import json
import os
import threading

import click
import pytest
import torch
from click.testing import CliRunner

from eval import drafts, generation
from eval.batching import left_pad
from eval.drafts import accepted, draft_length, lookup
from eval.generation import (
    _greedy_config,
    cache_bytes_per_token,
    generate,
    generate_until,
    generation_batches,
    greedy,
    newline_token_ids,
    row_bytes,
)
from eval.options import DEFAULT_BATCH_SIZE, ScoringOptions, batch_size_given, scoring_options
from tests.support.tiny_models import build_model, make_tokenizer

PROMPTS = [
    "the cat sat",
    "English sentence: hello world.\nTarget sentence:",
    "a",
    "numbers: 1 2 3 4 5 6 7 8 9 0 and letters a b c d e f g h",
    "Belebele asks a question about a passage; answer",
    "the dog ran in the park. the cat sat on the",
    "halo",
]
NEW = 12
# How much each architecture's head favours newline and EOS: every kind of stop among PROMPTS.
SCALES = {"llama": (3.0, 2.5), "gemma3": (3.0, 2.5), "gpt2": (2.5, 3.5)}


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="module", params=["llama", "gemma3", "gpt2"])
def model(request, tokenizer):
    """A tiny random model whose head favours newline and EOS: some rows end their line, some
    stop at EOS, others run to the token limit, each at its own step."""
    built = build_model(request.param, seed=3).float().eval()
    newline_scale, eos_scale = SCALES[request.param]
    with torch.no_grad():
        head = built.get_output_embeddings().weight
        (newline,) = tokenizer.encode("\n", add_special_tokens=False)
        head[newline] *= newline_scale
        head[tokenizer.eos_token_id] *= eos_scale
    return built


def _stop_at(tokens: list[int], eos: set[int], ended) -> tuple[list[int], str]:
    """A generation run to the limit, cut where our loop must stop it."""
    for step, token in enumerate(tokens):
        if token in eos:
            return tokens[:step], "eos"
        if ended([tokens[: step + 1]])[0]:
            return tokens[: step + 1], "newline"
    return tokens, "limit"


def reference_runs(model, tokenizer, prompts, ended, new=NEW, batched=False):
    """transformers' greedy `generate` to the limit (EOS aside), then cut: each prompt alone,
    or all of them left-padded in one batch (as lm-eval's HF `generate_until` runs them)."""
    config = _greedy_config(model, tokenizer, new)
    eos = {int(config.eos_token_id)}
    encoded = [tokenizer.encode(p) for p in prompts]
    groups = [encoded] if batched else [[e] for e in encoded]
    runs = []
    for group in groups:
        ids, mask = left_pad(group, torch.device("cpu"), config.pad_token_id)
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        runs += [_stop_at(row[ids.shape[1] :], eos, ended) for row in out.tolist()]
    return runs


def _line_end(tokenizer):
    newlines = newline_token_ids(tokenizer)
    return lambda rows: [row[-1] in newlines for row in rows]


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, so one batch at a time and the forwards counted are one batch's;
    tests of batches side by side (one per thread) set two."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def references(model, tokenizer):
    """`reference_runs` of PROMPTS to their line ends, each prompt alone and all together."""
    ended = _line_end(tokenizer)
    alone = reference_runs(model, tokenizer, PROMPTS, ended)
    return alone, reference_runs(model, tokenizer, PROMPTS, ended, batched=True)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch_size", [None, 1, 3])
def test_greedy_equals_generate_token_for_token(
    model, tokenizer, references, batch_size, threads, monkeypatch
):
    """The same tokens whatever the batches, with the prompts' parts (a row each) one at a time
    or side by side (two threads: two workers run them, where the model runs parts)."""
    from transformers import DynamicCache

    torch.set_num_threads(threads)
    monkeypatch.setattr(generation, "PREFILL_TOKENS", 1)
    workers = set()
    forward = model.forward

    def noted(*args, **kwargs):
        workers.add(threading.current_thread().name)
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", noted)
    ours = greedy(model, tokenizer, PROMPTS, _line_end(tokenizer), NEW, 256, None,
                  batch_size=batch_size, progress=False, desc="")  # fmt: skip
    workers.discard(threading.current_thread().name)
    parts = generation._full_attention(DynamicCache(config=model.config)) and batch_size != 1
    assert len(workers) == (threads if parts and threads > 1 else 0)
    alone, together = references
    assert ours == alone
    assert ours == together
    # Not vacuous: rows stop for every reason, after different numbers of tokens.
    assert {stop for _, stop in ours} == {"newline", "eos", "limit"}
    assert len({len(tokens) for tokens, _ in ours}) >= 3


def _forwards(model, monkeypatch) -> list[tuple[int, int]]:
    """The `(rows, width)` of every forward the model runs from now on."""
    shapes: list[tuple[int, int]] = []
    forward = model.forward

    def counted(*args, **kwargs):
        shapes.append(tuple(kwargs["input_ids"].shape))
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", counted)
    return shapes


def test_drafts_and_prompt_parts_change_no_token(model, tokenizer, references, monkeypatch):
    """Guessed tokens at every step (up to 8 per row) and prompts run one row per part: the same
    tokens as `generate`. A sliding-window model (Gemma 3) does neither."""
    from transformers import DynamicCache

    def run(draft_tokens: int, prefill_tokens: int) -> tuple[list, list]:
        monkeypatch.setattr(drafts, "DRAFT_TOKENS", draft_tokens)
        monkeypatch.setattr(generation, "PREFILL_TOKENS", prefill_tokens)
        shapes = _forwards(model, monkeypatch)
        runs = greedy(model, tokenizer, PROMPTS, _line_end(tokenizer), NEW, 256, None,
                      batch_size=None, progress=False, desc="")  # fmt: skip
        monkeypatch.undo()
        return runs, shapes

    plain, plain_shapes = run(0, 1 << 20)
    drafted, drafted_shapes = run(1 << 20, 1 << 20)
    parts, parts_shapes = run(0, 1)
    both, _ = run(1 << 20, 1)
    alone, together = references
    assert plain == drafted == parts == both == alone == together
    if generation._full_attention(DynamicCache(config=model.config)):
        assert max(width for _, width in drafted_shapes[1:]) > 2  # it guessed
        assert len(parts_shapes) == len(plain_shapes) + len(PROMPTS) - 1  # a part a row
    else:  # a sliding window: plain steps, whole batches
        assert drafted_shapes == parts_shapes == plain_shapes


def test_guesses_save_steps(model, tokenizer, monkeypatch):
    """With a prompt that invites a loop, 24 new tokens: guessed tokens hold (fewer forwards;
    a sliding-window model never guesses) and the tokens stay `generate`'s."""
    from transformers import DynamicCache

    prompts = [*PROMPTS, "one two one two one two one two"]
    ended = _line_end(tokenizer)
    expected = reference_runs(model, tokenizer, prompts, ended, new=24, batched=True)
    counts = []
    for draft_tokens in (0, drafts.DRAFT_TOKENS):
        monkeypatch.setattr(drafts, "DRAFT_TOKENS", draft_tokens)
        shapes = _forwards(model, monkeypatch)
        runs = greedy(model, tokenizer, prompts, ended, 24, 256, None, batch_size=None,
                      progress=False, desc="")  # fmt: skip
        monkeypatch.undo()
        assert runs == expected
        counts.append(len(shapes))
    if generation._full_attention(DynamicCache(config=model.config)):
        assert counts[1] < counts[0]
    else:  # a sliding window never guesses: the same forwards
        assert counts[1] == counts[0]


def test_lookup_guesses_what_followed():
    assert lookup([5, 6, 7, 1, 5, 6], 3) == [7, 1, 5]  # the latest match of the longest suffix
    assert lookup([1, 2, 9, 2, 9, 3, 2], 2) == [9, 3]  # one token: the latest occurrence
    assert lookup([4, 8, 8, 8], 5) == [8, 8, 8, 8, 8]  # a loop is copied on
    assert lookup([1, 2, 3], 4) == [] and lookup([], 4) == [] and lookup([3, 3], 0) == []


def test_accepted_keeps_the_models_own_tokens():
    assert accepted([], [7]) == [7]
    assert accepted([7, 8, 9], [7, 8, 9, 4]) == [7, 8, 9, 4]
    assert accepted([7, 5, 9], [7, 8, 9, 4]) == [7, 8]  # the guess after a miss never counts
    assert accepted([6, 8], [7, 8, 9]) == [7]


def test_draft_length_shrinks_with_rows():
    lengths = [draft_length(rows) for rows in (1, 2, 4, 8, 16, 32, 64)]
    assert lengths == sorted(lengths, reverse=True)
    assert lengths[0] == drafts.MOST_GUESSED and lengths[-1] == 0
    assert all(rows * (length + 1) <= max(drafts.DRAFT_TOKENS, rows)
               for rows, length in zip((1, 2, 4, 8, 16, 32, 64), lengths, strict=True))  # fmt: skip


def test_token_limit(model, tokenizer, references):
    """At a lower limit, each generation is the first tokens of the one at NEW."""
    new = 3
    ours = greedy(model, tokenizer, PROMPTS, _line_end(tokenizer), new, 256, None,
                  batch_size=None, progress=False, desc="")  # fmt: skip
    for run, (full, stop) in zip(ours, references[0], strict=True):
        # Stopped within `new` tokens (a newline may be the last), else cut at the limit.
        within = len(full) < new or (len(full) == new and stop == "newline")
        assert run == ((full, stop) if within else (full[:new], "limit"))
    assert {stop for _, stop in ours} >= {"limit", "newline"}


def test_stop_strings_across_token_boundaries(model, tokenizer):
    """Stop strings taken from the generated texts themselves, two characters long, most of
    them across two tokens: each text is cut at the first one, as a run to the limit is."""
    runs = reference_runs(model, tokenizer, PROMPTS, lambda rows: [False] * len(rows), new=16)
    texts = [tokenizer.decode(tokens, skip_special_tokens=True) for tokens, _ in runs]
    stops = sorted({text[3:5] for text in texts if len(text) >= 5 and text[3:5].strip()})[:2]
    assert len(stops) >= 2
    cut = 0
    for stop in stops:
        ours = generate_until(model, tokenizer, PROMPTS, stop=stop, max_new_tokens=16,
                              max_length=256)  # fmt: skip
        assert ours == [text.split(stop, 1)[0] for text in texts], stop
        cut += sum(stop in text for text in texts)
    assert cut >= len(stops)  # the stop strings did cut


def test_generate_gives_the_lines_and_stops(model, tokenizer, references):
    generations = generate(model, tokenizer, PROMPTS, max_new_tokens=NEW, max_length=256)
    for (tokens, stop), made in zip(references[0], generations, strict=True):
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        assert (made.text, made.line, made.stop) == (text, generation.first_line(text), stop)


def test_prompts_cut_from_the_left(model, tokenizer):
    """A prompt longer than max_length - max_new_tokens keeps its last tokens."""
    ended = _line_end(tokenizer)
    long = PROMPTS[3] * 4
    ours = greedy(model, tokenizer, [long], ended, 4, 20, None, batch_size=None,
                  progress=False, desc="")  # fmt: skip
    kept = tokenizer.decode(tokenizer.encode(long)[-16:])
    assert tokenizer.encode(kept) == tokenizer.encode(long)[-16:]
    assert ours == reference_runs(model, tokenizer, [kept], ended, new=4)


def test_batches_sized_by_memory_unless_given(model, monkeypatch):
    lengths = [5, 40, 12, 40, 7, 30, 1]
    order = [1, 3, 5, 2, 4, 0, 6]  # longest first, ties in input order
    assert generation_batches(model, lengths, 8, 3) == [order[:3], order[3:6], order[6:]]
    assert generation_batches(model, lengths, 8, DEFAULT_BATCH_SIZE) == [order]
    assert generation_batches(model, lengths, 8) == [order]
    # A budget of two rows of the longest prompt: the batches follow the prompts' widths.
    monkeypatch.setattr(generation, "GENERATION_BUDGET", 2 * row_bytes(model, 40, 8))
    batches = generation_batches(model, lengths, 8)
    assert [i for batch in batches for i in batch] == order
    assert batches[0] == order[:2]
    for batch in batches:
        assert len(batch) * row_bytes(model, lengths[batch[0]], 8) <= generation.GENERATION_BUDGET
        assert len(batch) == min(
            generation.GENERATION_BUDGET // row_bytes(model, lengths[batch[0]], 8),
            len(order) - order.index(batch[0]),
        )


def test_cache_bytes_per_token_is_the_cache(model, tokenizer):
    """What the cache holds after a prompt: exactly the bound, or less where sliding-window
    layers keep only their window (Gemma 3)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicSlidingWindowLayer

    from eval.model_loading import cache_argument

    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    ids = torch.tensor([tokenizer.encode(PROMPTS[3])] * 2)
    with torch.no_grad():
        model(input_ids=ids, use_cache=True, **{cache_argument(model): cache})
    held = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    bound = cache_bytes_per_token(model) * ids.numel()
    sliding = any(isinstance(layer, DynamicSlidingWindowLayer) for layer in cache.layers)
    assert 0 < held < bound if sliding else held == bound


def test_the_default_batch_size_is_told_from_a_given_one():
    @click.command()
    @scoring_options("batch_size")
    def show(scoring: ScoringOptions) -> None:
        click.echo(f"{scoring.batch_size} {batch_size_given(scoring.batch_size)}")

    runner = CliRunner()
    assert runner.invoke(show, []).output == "8 False\n"
    assert runner.invoke(show, ["--batch-size", "8"]).output == "8 True\n"
    assert runner.invoke(show, ["--batch-size", "3"]).output == "3 True\n"
    # Recorded as 8, equal to 8: results and resumed runs see no difference.
    assert json.dumps({"batch_size": DEFAULT_BATCH_SIZE}) == '{"batch_size": 8}'
    assert ScoringOptions().config()["batch_size"] == 8 == DEFAULT_BATCH_SIZE


# --- SmolLM2 against lm-eval ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("shots", [0, 2])
def test_real_model_generations_equal_lm_eval(tmp_path, shots):
    """SmolLM2-135M-Instruct: FLORES-style prompts greedy until a newline, and (2-shot) sums
    until a blank line, generated by `surgery eval` and by lm-eval's `HFLM.generate_until` on
    the same prompt strings: equal item by item."""
    pytest.importorskip("lm_eval")
    from bench.bench_generation import lm_eval_generations, ours, tasks
    from bench.fetch_smollm2 import DEFAULT_CACHE, smollm2
    from eval.api import load_model
    from eval.tasks import load_task, parse_task

    folder = DEFAULT_CACHE / "SmolLM2-135M-Instruct-f32"
    if not folder.is_dir() and os.environ.get("SURGERY_REQUIRE_EXTRAS") != "1":
        pytest.skip(f"no SmolLM2 at {folder} (python bench/fetch_smollm2.py builds it)")
    from lm_eval.models.huggingface import HFLM

    model, tok = load_model(smollm2(), progress=False)
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=8, max_length=2048)
    chosen = [t for t in tasks(tmp_path, 24) if t[0].endswith(f"{shots}-shot")]
    for label, task, stop, tokens in chosen:
        prompts = load_task(parse_task(task)).prompts(24, 0)
        _, logged, mine = ours(model, tok, task, tmp_path / "samples.jsonl", None)
        assert logged == prompts
        _, theirs = lm_eval_generations(lm, prompts, stop, tokens)
        different = [i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b]
        assert not different, (label, [(mine[i], theirs[i]) for i in different])
        assert len(set(mine)) > 3  # the generations are not all alike

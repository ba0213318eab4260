"""Eval scores on tiny models, each checked against a plain computation (eval_reference.py)."""

from __future__ import annotations

import json
import math
import random
import re
import statistics
from pathlib import Path

import pytest
import sacrebleu
import torch
from click.testing import CliRunner

from cli import cli
from eval.api import evaluate, load_model
from eval.errors import ModelError
from eval.kinds import copain
from eval.kinds.flores import chrf
from eval.kinds.mc import score_items
from eval.scoring import (
    ChoiceRequest,
    choice_loglikelihoods,
    rolling_windows,
    window_loglikelihoods,
)
from eval.tasks import Settings, load_task, parse_task
from eval.tokens import TextEncoder
from surgery.core.errors import CheckpointError
from tests.support import eval_reference as ref
from tests.support import tiny_models
from tests.support.tolerances import LL_TOL, near_tie

DATA = Path(__file__).parent / "data" / "eval"
MC_FILES = {"belebele": DATA / "belebele.jsonl", "piqa": DATA / "piqa.jsonl"}
FLORES = f"flores:{DATA / 'flores'}:src=eng_Latn,tgt=ind_Latn,shots=1,max_new_tokens=6"
# Long enough that no fixture prompt is cut: the references below see whole prompts.
LONG = 1024


@pytest.fixture(scope="module")
def llama(families):
    return load_model(families("llama")["base"], progress=False)


@pytest.fixture(scope="module")
def gemma3mm(families):
    return load_model(families("gemma3mm")["base"], progress=False)


@pytest.fixture(params=["llama", "gemma3mm"])
def model_and_tokenizer(request):
    return request.getfixturevalue(request.param)


def _run(model, tokenizer, tasks, **kwargs):
    return evaluate(model, tokenizer, tasks, progress=False, **kwargs)["metrics"]


# --- multiple choice --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["belebele", "piqa"])
def test_multiple_choice_equals_per_choice_forwards(model_and_tokenizer, kind):
    model, tok = model_and_tokenizer
    text = f"{kind}:{MC_FILES[kind]}:shots=1,add_bos=true"
    task = load_task(parse_task(text))
    items = task.items
    contexts = task.contexts(len(items), 0)
    settings = Settings(batch_size=4, max_length=LONG, progress=False)  # 6 items: a ragged batch
    scores, truncated = score_items(model, TextEncoder(tok, True), contexts, items, settings)
    expected = [
        [ref.choice_logprob(model, tok, context, " " + choice) for choice in item.choices]
        for context, item in zip(contexts, items, strict=True)
    ]
    assert truncated == 0
    assert torch.allclose(torch.tensor(scores), torch.tensor(expected), atol=LL_TOL, rtol=0)

    hits = {"acc": [], "acc_norm": [], "acc_bytes": []}
    for row, item in zip(expected, items, strict=True):
        for metric, size in (("acc", lambda c: 1), ("acc_norm", len), ("acc_bytes", _n_bytes)):
            sizes = [size(c) for c in item.choices]
            # The scores agree within LL_TOL only: the exact accuracies below hold on any CPU
            # only where no two choices are that close (a fixture item that is would be
            # decided by rounding).
            assert not near_tie(row, sizes), (metric, row)
            normed = [score / n for score, n in zip(row, sizes, strict=True)]
            hits[metric].append(float(normed.index(max(normed)) == item.label))
    metrics = _run(model, tok, [text], batch_size=4, max_length=LONG)
    reported = ("acc", "acc_norm", "acc_bytes") if kind == "piqa" else ("acc", "acc_norm")
    expected_metrics = {f"{kind}/n": len(items)}
    for metric in reported:
        expected_metrics[f"{kind}/{metric}"] = statistics.mean(hits[metric])
        sem = statistics.stdev(hits[metric]) / math.sqrt(len(items))
        expected_metrics[f"{kind}/{metric}_stderr"] = pytest.approx(sem, abs=1e-12)
    assert metrics == expected_metrics


def _n_bytes(text: str) -> int:
    return len(text.encode("utf-8"))


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
def test_shared_context_engine_on_ragged_requests(arch):
    """Random ids: contexts 2..40 tokens, 1 to 4 choices of 1..30 tokens (past Gemma-3's
    16-token sliding window), batches mixing them all."""
    model = tiny_models.build_model(arch).float().eval()
    rng = random.Random(arch)
    vocab = model.config.vocab_size

    def tokens(low: int, high: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(rng.randint(low, high))]

    requests = [
        ChoiceRequest([1, *tokens(1, 39)], [tokens(1, 30) for _ in range(rng.randint(1, 4))])
        for _ in range(7)
    ]
    got = choice_loglikelihoods(model, requests, batch_size=3)
    for request, item_scores in zip(requests, got, strict=True):
        for cont, score in zip(request.continuations, item_scores, strict=True):
            whole = request.context + cont
            table = ref.logprobs(model, whole)
            n = len(request.context)
            expected = sum(table[n - 1 + j, cont[j]].item() for j in range(len(cont)))
            assert score == pytest.approx(expected, abs=LL_TOL)


def test_contexts_too_long_are_cut_from_the_left(llama):
    model, tok = llama
    task = load_task(parse_task(f"belebele:{MC_FILES['belebele']}:shots=1"))
    contexts = task.contexts(2, 0)
    settings = Settings(max_length=48, progress=False)
    encoder = TextEncoder(tok, True)
    scores, truncated = score_items(model, encoder, contexts, task.items[:2], settings)
    assert truncated == 2
    for context, item, item_scores in zip(contexts, task.items[:2], scores, strict=True):
        choices = [ref.ids_of(tok, " " + choice) for choice in item.choices]
        # As lm-eval: at most max_length + 1 tokens of context and continuation are kept.
        kept = [tok.bos_token_id, *ref.ids_of(tok, context)][-(48 + 1 - max(map(len, choices))) :]
        expected = [ref.logprob_after(model, kept, choice) for choice in choices]
        assert item_scores == pytest.approx(expected, abs=LL_TOL)


# --- perplexity -------------------------------------------------------------------------------


def _expected_ppl(model, tok, documents, window=None):
    nll = count = 0
    for doc in documents:
        doc_nll, doc_count = ref.document_nll(model, tok, doc, window)
        nll, count = nll + doc_nll, count + doc_count
    n_bytes = sum(len(doc.encode("utf-8")) for doc in documents)
    words = sum(len(re.split(r"\s+", doc)) for doc in documents)
    return {
        "ppl": math.exp(nll / count),
        "word_perplexity": math.exp(nll / words),
        "byte_perplexity": math.exp(nll / n_bytes),
        "bits_per_byte": nll / math.log(2) / n_bytes,
        "tokens": count,
        "n": len(documents),
    }


def _texts(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines()]


def test_perplexity_equals_direct_forward(model_and_tokenizer):
    model, tok = model_and_tokenizer
    metrics = _run(model, tok, [f"ppl:{DATA / 'madlad'}"], batch_size=2, max_length=LONG)
    for lang in ("eng", "ind"):
        docs = _texts(DATA / "madlad" / "data" / lang / f"{lang}_clean_0000.jsonl")
        for key, value in _expected_ppl(model, tok, docs).items():
            assert metrics[f"ppl/{lang}/{key}"] == pytest.approx(value, rel=1e-5)


def test_perplexity_windows_and_limit(llama):
    model, tok = llama
    path = DATA / "held_out.txt"
    metrics = _run(model, tok, [f"ppl:{path}:lang=eng"], max_length=8, limit=1, batch_size=3)
    expected = _expected_ppl(model, tok, ["The cat sat on the mat.\nIt was warm there."], window=8)
    for key, value in expected.items():
        assert metrics[f"ppl/eng/{key}"] == pytest.approx(value, rel=1e-5)


# --- translation ------------------------------------------------------------------------------


def test_translation_equals_plain_greedy_and_sacrebleu(model_and_tokenizer):
    model, tok = model_and_tokenizer
    task = load_task(parse_task(FLORES))
    prompts = task.prompts(4, seed=0)
    assert prompts[2].endswith("\n\nEnglish sentence: Hello world.\nIndonesian sentence:")
    hypotheses = [ref.greedy_line(model, tok, prompt, max_new_tokens=6) for prompt in prompts]
    assert any(hypotheses)  # the comparison below is not between empty strings
    references = [tgt for _, tgt in task.pairs[:4]]

    result = evaluate(model, tok, [FLORES], limit=4, batch_size=3, progress=False)
    assert result["metrics"]["flores/n"] == 4
    expected = sacrebleu.corpus_chrf(hypotheses, [references]).score
    assert result["metrics"]["flores/chrf"] == pytest.approx(expected, abs=1e-9)
    signature = result["config"]["tasks"]["flores"]["signature"]
    assert "nc:6|nw:0" in signature and "version:" in signature


def test_chrf_on_known_strings():
    hyps = ["the cat sat on the mat", "a dog ran in a park", "hello"]
    refs = ["the cat sat on a mat", "the dog runs in the park", "halo dunia"]
    score, signature = chrf(hyps, refs)
    assert score == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score, abs=1e-12)
    assert signature.startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0")
    plus, plus_signature = chrf(hyps, refs, word_order=2)
    expected_plus = sacrebleu.corpus_chrf(hyps, [refs], word_order=2).score
    assert plus == pytest.approx(expected_plus, abs=1e-12)
    assert "nw:2" in plus_signature and plus != score
    assert chrf(refs, refs)[0] == pytest.approx(100.0)


# --- Copain -----------------------------------------------------------------------------------


def test_copain_scores_exact_matches(monkeypatch, llama):
    """Answers right for `max` only, wrong elsewhere: max/acc 1, others 0, overall 1/7."""
    model, tok = llama
    spec = "copain:n=6,shots=2"
    per_task = load_task(parse_task(spec)).prompts(Settings(seed=0))
    right = dict(zip(*per_task["max"], strict=True))

    def fake_generate(model, tokenizer, prompts, **kwargs):
        return [right.get(prompt, "?") for prompt in prompts]  # "?" is no task's answer

    monkeypatch.setattr("eval.generation.generate_lines", fake_generate)
    metrics = _run(model, tok, [spec])
    assert metrics["copain/max/acc"] == 1.0 and metrics["copain/max/n"] == 6
    assert all(metrics[f"copain/{task}/acc"] == 0.0 for task in copain.TASKS if task != "max")
    assert metrics["copain/acc"] == pytest.approx(1 / 7) and metrics["copain/n"] == 42


def test_copain_answers_are_the_greedy_lines(llama):
    model, tok = llama
    settings = Settings(seed=0, limit=2)
    per_task = load_task(parse_task("copain:n=4,shots=2")).prompts(settings)
    lines = {
        task: [ref.greedy_line(model, tok, p, max_new_tokens=3) for p in prompts]
        for task, (prompts, _) in per_task.items()
    }
    metrics = _run(model, tok, ["copain:n=4,shots=2,max_new_tokens=3"], limit=2)
    for task, (_, answers) in per_task.items():
        hits = sum(line == answer for line, answer in zip(lines[task], answers, strict=True))
        assert metrics[f"copain/{task}/acc"] == hits / 2


# --- the command and the API together ---------------------------------------------------------


def test_cli_runs_every_task_deterministically_and_agrees_with_the_api(tmp_path, families, llama):
    path = str(families("llama")["base"])
    tasks = [
        f"ppl:{DATA / 'madlad'}",
        f"belebele:{MC_FILES['belebele']}",
        f"piqa:{MC_FILES['piqa']}",
        FLORES,
        "copain:n=4,shots=2,max_new_tokens=3",
    ]
    args = ["--limit", "3", "--batch-size", "2", "--max-length", str(LONG), "-q"]
    outputs = []
    for run in ("a", "b"):
        out = tmp_path / f"{run}.json"
        argv = ["eval", path, *[x for t in tasks for x in ("-t", t)], *args, "-o", str(out)]
        result = CliRunner().invoke(cli, argv)
        assert result.exit_code == 0, result.output
        assert "belebele/acc" in result.output and "ppl/ind/bits_per_byte" in result.output
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]

    saved = json.loads(outputs[0])
    assert saved["config"]["model"] == path
    assert saved["config"]["dtype"] == "float32" and saved["config"]["seed"] == 0
    bos = saved["config"]["tasks"]["belebele"]["bos"]
    assert bos == "add_bos=auto (as the tokenizer encodes): no special token before texts"
    model, tok = llama
    api = evaluate(model, tok, tasks, limit=3, batch_size=2, max_length=LONG, progress=False)
    assert saved["metrics"] == api["metrics"]


def test_evaluate_restores_training_mode(llama):
    model, tok = llama
    model.train()
    try:
        _run(model, tok, ["copain:n=2,shots=1,max_new_tokens=1"], limit=1)
        assert model.training
    finally:
        model.eval()


# --- loading ----------------------------------------------------------------------------------


def test_load_model_handles_gemma3_multimodal_and_dtypes(families):
    model, _ = load_model(families("gemma3mm")["base"], progress=False)
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"
    assert model.dtype == torch.float32 and not model.training
    model, _ = load_model(families("gemma3mm")["base"], dtype="bf16", progress=False)
    assert model.dtype == torch.bfloat16


def test_load_model_refuses_what_it_cannot_score(tmp_path):
    tiny_models.save(tiny_models.build_model("bert"), tmp_path / "bert")
    with pytest.raises(ModelError, match="BertForMaskedLM checkpoint"):
        load_model(tmp_path / "bert")
    with pytest.raises(CheckpointError, match="missing: no such file or folder"):
        load_model(tmp_path / "missing")  # as every command says it, never a Hub request
    with pytest.raises(ModelError, match="unknown dtype"):
        load_model(tmp_path / "bert", dtype="float8")


# --- bounded logits and per-item output -------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_perplexity_slices_give_the_same_scores(arch):
    """A budget of a few positions per forward (KV cache between slices, past Gemma-3's 16-token
    sliding window) scores every window as one whole forward does."""
    model = tiny_models.build_model(arch).float().eval()
    rng = random.Random(arch)
    vocab = model.config.vocab_size
    pairs = []
    for _ in range(5):
        tokens = [rng.randrange(3, vocab) for _ in range(rng.randint(30, 60))]
        pairs += rolling_windows(tokens, 1, 40)
    whole = window_loglikelihoods(model, pairs, batch_size=3)
    sliced = window_loglikelihoods(model, pairs, batch_size=3, budget=3 * 4 * vocab * 5)
    assert sliced == pytest.approx(whole, abs=LL_TOL)
    for (context, cont), score in zip(pairs, whole, strict=True):
        expected = ref.logprob_after(model, context, cont) if context else None
        if expected is not None:
            assert score == pytest.approx(expected, abs=LL_TOL)


def test_log_samples_writes_one_line_per_item(llama, tmp_path):
    model, tok = llama
    out = tmp_path / "samples.jsonl"
    tasks = [f"belebele:{MC_FILES['belebele']}:shots=1", f"ppl:{DATA / 'held_out.txt'}", FLORES]
    metrics = evaluate(model, tok, tasks, limit=3, progress=False, log_samples=out)["metrics"]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    by_task = {name: [x for x in lines if x["task"] == name] for name in ("belebele", "ppl")}
    assert len(by_task["belebele"]) == metrics["belebele/n"] == 3
    assert len(by_task["ppl"]) == metrics["ppl/held_out/n"] == 2
    first = by_task["belebele"][0]
    assert set(first) >= {"context", "choices", "loglikelihoods", "lengths", "pred", "gold"}
    assert len(first["loglikelihoods"]) == 4 and first["choices"][0] == " A"
    nll = -sum(x["loglikelihood"] for x in by_task["ppl"])
    n_bytes = sum(x["bytes"] for x in by_task["ppl"])
    assert nll / math.log(2) / n_bytes == pytest.approx(metrics["ppl/held_out/bits_per_byte"])
    assert len([x for x in lines if x["task"] == "flores"]) == metrics["flores/n"]

"""Our defaults against stock lm-evaluation-harness on the same local data and the same model.

A tiny Llama, scored by `surgery eval`'s code and by lm-eval's own Belebele, Global-PIQA and
PIQA configs (included from the installed package, pointed at local files) and a rolling
perplexity task: same acc / acc_norm / acc_bytes at 0 and 2 shots, per-item log-likelihoods
within 1e-4 (the table is printed per item), same bits per byte with a 16-token window; with a
tokenizer that adds BOS (as Llama's and Gemma's do) and one that adds nothing (GPT-2, SmolLM).

Every tolerance on a derived figure comes from the per-item one (`LL_TOL`), so a CPU that rounds
float32 differently (within `LL_TOL`) passes too: an accuracy is compared item by item except
where the choices are within the tolerance of a tie, and a perplexity in log space within the
bound of a sum of per-document differences.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is in the dev extra: pip install -e '.[dev]'")

from tokenizers.processors import TemplateProcessing

from eval.api import evaluate
from eval.data import read_documents
from tests.support import tiny_models
from tests.support.lmeval_runner import run_lm_eval, write_jsonl, write_task_yamls
from tests.support.tolerances import LL_TOL, near_tie

DATA = Path(__file__).parent / "data" / "eval"
FILES = {
    "belebele": DATA / "belebele.jsonl",
    "global_piqa": DATA / "piqa.jsonl",
    "piqa": DATA / "piqa_classic.jsonl",
}
KIND = {"belebele": "belebele", "global_piqa": "piqa", "piqa": "piqa"}
# Long enough that no prompt is cut (RoPE models take positions past their config's).
MAX_LENGTH = 1024


def _tokenizer(adds_bos: bool):
    tok = tiny_models.make_tokenizer()
    if adds_bos:
        tok.backend_tokenizer.post_processor = TemplateProcessing(
            single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", tok.bos_token_id)]
        )
    return tok


@pytest.fixture(scope="module")
def model():
    return tiny_models.perturb(tiny_models.build_model("llama"), seed=7, scale=0.5).float().eval()


def _ours(model, tok, tasks, tmp_path, **kwargs):
    samples = tmp_path / "samples.jsonl"
    result = evaluate(model, tok, tasks, progress=False, log_samples=samples, **kwargs)
    import json

    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    return result["metrics"], lines


def _same_accuracy(metric: str, mine: list[dict], theirs: list[dict], ours: dict, results: dict):
    """Each item's outcome as lm-eval's except near ties (their LLs within `LL_TOL` of ours may
    pick either choice), so the accuracy within (near ties) / n and equal when there are none."""
    sizes = {"acc": lambda s: [1] * len(s["lengths"]), "acc_norm": lambda s: s["lengths"]}
    sizes["acc_bytes"] = lambda s: s["byte_lengths"]
    ties = 0
    for item, their in zip(mine, theirs, strict=True):
        if near_tie([r[0][0] for r in their["resps"]], sizes[metric](item)):
            ties += 1
        else:
            assert item[metric] == their[metric], (metric, their["doc_id"])
    kind, n = mine[0]["task"], len(mine)
    if ties:
        assert abs(ours[f"{kind}/{metric}"] - results[f"{metric},none"]) <= ties / n, metric
        return
    assert ours[f"{kind}/{metric}"] == results[f"{metric},none"], metric
    # The standard error is a function of the accuracy and n alone.
    ours_err, their_err = ours[f"{kind}/{metric}_stderr"], results[f"{metric}_stderr,none"]
    assert ours_err == pytest.approx(their_err, abs=1e-12), metric


def _table(rows: list[tuple]) -> str:
    return "\n".join(
        "  ".join(f"{c:>12}" if not isinstance(c, float) else f"{c:12.6f}" for c in r) for r in rows
    )


@pytest.mark.parametrize("adds_bos", [True, False], ids=["bos-tokenizer", "no-bos-tokenizer"])
@pytest.mark.parametrize("shots", [0, 2])
def test_multiple_choice_matches_lm_eval(model, tmp_path, adds_bos, shots):
    tok = _tokenizer(adds_bos)
    names = write_task_yamls(tmp_path / "tasks", FILES)
    theirs = run_lm_eval(model, tok, tmp_path / "tasks", list(names.values()), shots, MAX_LENGTH)
    tasks = [f"{KIND[k]}:{path}:shots={shots},name={k}" for k, path in FILES.items()]
    metrics, samples = _ours(model, tok, tasks, tmp_path, max_length=MAX_LENGTH)
    for kind, name in names.items():
        results = theirs["results"][name]
        ours_items = [s for s in samples if s["task"] == kind]
        theirs_items = sorted(theirs["samples"][name], key=lambda s: s["doc_id"])
        rows = [("item", "choice", "lm-eval", "ours", "diff")]
        worst = 0.0
        for mine, their in zip(ours_items, theirs_items, strict=True):
            assert mine["context"] == their["arguments"][0][0]
            for c, (ll, (their_ll, _)) in enumerate(
                zip(mine["loglikelihoods"], [r[0] for r in their["resps"]], strict=True)
            ):
                rows.append((their["doc_id"], c, their_ll, ll, abs(ll - their_ll)))
                worst = max(worst, abs(ll - their_ll))
        print(f"\n{kind}, {shots}-shot, adds_bos={adds_bos}\n{_table(rows)}")
        assert worst < LL_TOL, _table(rows)
        reported = [m.split(",")[0] for m in results if m.endswith(",none") and "stderr" not in m]
        assert reported, results
        for metric in reported:
            _same_accuracy(metric, ours_items, theirs_items, metrics, results)
        assert len(ours_items) == metrics[f"{kind}/n"] == len(theirs_items)


@pytest.mark.parametrize("adds_bos", [True, False], ids=["bos-tokenizer", "no-bos-tokenizer"])
def test_rolling_perplexity_matches_lm_eval(model, tmp_path, adds_bos):
    tok = _tokenizer(adds_bos)
    docs = [*read_documents(DATA / "held_out.txt"), "short one", "  spaces  around\tand tabs  "]
    data = write_jsonl(tmp_path / "held.jsonl", [{"text": d} for d in docs])
    names = write_task_yamls(tmp_path / "tasks", {"ppl": data})
    window = 16  # far shorter than the documents: several windows, a partial last one
    theirs = run_lm_eval(model, tok, tmp_path / "tasks", [names["ppl"]], 0, window)
    metrics, samples = _ours(model, tok, [f"ppl:{data}:lang=x"], tmp_path, max_length=window)
    results = theirs["results"][names["ppl"]]
    rows = [("doc", "lm-eval", "ours", "diff")]
    their_docs = sorted(theirs["samples"][names["ppl"]], key=lambda s: s["doc_id"])
    for mine, their in zip(samples, their_docs, strict=True):
        their_ll = their["resps"][0][0]
        rows.append(
            (
                their["doc_id"],
                their_ll,
                mine["loglikelihood"],
                abs(mine["loglikelihood"] - their_ll),
            )
        )
    print(f"\nrolling log-likelihood, window {window}, adds_bos={adds_bos}\n{_table(rows)}")
    assert all(row[-1] < LL_TOL for row in rows[1:]), _table(rows)
    # Each document's log-likelihood within LL_TOL, so their sum within len(docs) * LL_TOL; word
    # and byte perplexity are exp(-sum / count), so their logs agree within that over the count
    # (lm-eval's counts), and bits per byte (-sum / (ln 2 * bytes)) within it over ln 2 * bytes.
    # (A relative tolerance on the perplexity itself, 1.87e16 here, held on one CPU only.)
    words = sum(len(re.split(r"\s+", doc)) for doc in docs)
    n_bytes = sum(len(doc.encode("utf-8")) for doc in docs)
    bound = len(docs) * LL_TOL
    for metric, count in (("word_perplexity", words), ("byte_perplexity", n_bytes)):
        ours, theirs_value = metrics[f"ppl/x/{metric}"], results[f"{metric},none"]
        assert math.log(ours) == pytest.approx(math.log(theirs_value), abs=bound / count), metric
    bpb = results["bits_per_byte,none"]
    assert metrics["ppl/x/bits_per_byte"] == pytest.approx(bpb, abs=bound / n_bytes / math.log(2))
    assert not math.isnan(metrics["ppl/x/ppl"])


@pytest.mark.slow
def test_real_model_matches_lm_eval(tmp_path):
    """SmolLM2-135M-Instruct (bench/fetch_smollm2.py: GGUF Q4_1 -> float32 safetensors), the same
    comparison on the same local rows; prints the agreement table with each tool's wall time."""
    import time

    from bench.fetch_smollm2 import smollm2
    from eval.api import load_model

    model, tok = load_model(smollm2(), progress=False)
    names = write_task_yamls(tmp_path / "tasks", FILES)
    docs = [
        row["text"] for row in _jsonl(DATA / "madlad" / "data" / "eng" / "eng_clean_0000.jsonl")
    ]
    data = write_jsonl(tmp_path / "held.jsonl", [{"text": d} for d in docs])
    names["ppl"] = write_task_yamls(tmp_path / "tasks", {"ppl": data})["ppl"]
    rows = [("metric", "lm-eval", "ours", "lm-eval s", "ours s")]
    for shots in (0, 2):
        start = time.perf_counter()
        mc = [names[k] for k in FILES]
        theirs = run_lm_eval(model, tok, tmp_path / "tasks", mc, shots, 2048)
        their_s = time.perf_counter() - start
        start = time.perf_counter()
        tasks = [f"{KIND[k]}:{path}:shots={shots},name={k}" for k, path in FILES.items()]
        metrics, _ = _ours(model, tok, tasks, tmp_path, max_length=2048)
        our_s = time.perf_counter() - start
        for kind, name in names.items():
            if kind == "ppl":
                continue
            for key, value in theirs["results"][name].items():
                metric = key.split(",")[0]
                if key.endswith(",none") and "stderr" not in metric:
                    rows.append(
                        (
                            f"{kind} {shots}-shot {metric}",
                            value,
                            metrics[f"{kind}/{metric}"],
                            their_s,
                            our_s,
                        )
                    )
                    assert metrics[f"{kind}/{metric}"] == value
    start = time.perf_counter()
    theirs = run_lm_eval(model, tok, tmp_path / "tasks", [names["ppl"]], 0, 64)
    their_s = time.perf_counter() - start
    start = time.perf_counter()
    metrics, _ = _ours(model, tok, [f"ppl:{data}:lang=eng"], tmp_path, max_length=64)
    our_s = time.perf_counter() - start
    bpb = theirs["results"][names["ppl"]]["bits_per_byte,none"]
    rows.append(("bits_per_byte, window 64", bpb, metrics["ppl/eng/bits_per_byte"], their_s, our_s))
    print("\n" + _table(rows))
    assert metrics["ppl/eng/bits_per_byte"] == pytest.approx(bpb, rel=1e-5)


def _jsonl(path: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_global_piqa_first_n_matches_the_reference_template(model, tmp_path):
    """The reference's Global-PIQA tasks are lm-eval's template with ``fewshot_config: sampler:
    first_n`` (its scripts/make_rs_tasks.py rewrites exactly that line). The template names no
    few-shot split, so lm-eval takes the first rows as they are: the first two items are among
    their own demonstrations."""
    from tests.support.lmeval_runner import lm_eval_tasks_root

    tok = _tokenizer(adds_bos=True)
    folder = tmp_path / "tasks"
    folder.mkdir()
    template = lm_eval_tasks_root() / "global_piqa/nonparallel_cloze/_template"
    (folder / "reference_piqa.yaml").write_text(
        f"include: {template}\ntask: reference_piqa\ndataset_path: json\ndataset_name: null\n"
        f"dataset_kwargs:\n  data_files:\n    test: {FILES['global_piqa']}\n"
        "fewshot_config:\n  sampler: first_n\n",
        encoding="utf-8",
    )
    theirs = run_lm_eval(model, tok, folder, ["reference_piqa"], 2, MAX_LENGTH)
    task = f"piqa:{FILES['global_piqa']}:shots=2,sampler=first_n,name=global_piqa"
    metrics, mine = _ours(model, tok, [task], tmp_path, max_length=MAX_LENGTH)
    their_items = sorted(theirs["samples"]["reference_piqa"], key=lambda s: s["doc_id"])
    for item, their in zip(mine, their_items, strict=True):
        assert item["context"] == their["arguments"][0][0], item["index"]
        their_lls = [r[0][0] for r in their["resps"]]
        diffs = [abs(a - b) for a, b in zip(item["loglikelihoods"], their_lls, strict=True)]
        assert max(diffs) < LL_TOL, diffs
    for metric in ("acc", "acc_norm", "acc_bytes"):
        _same_accuracy(metric, mine, their_items, metrics, theirs["results"]["reference_piqa"])

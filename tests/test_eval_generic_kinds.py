"""The generic kinds: benchmarks with their own field names scored without new code.

`multiple_choice` against stock lm-evaluation-harness given the same rows and the same template
keys (per-item log-likelihoods within `LL_TOL`, the same contexts, acc and acc_norm item by item),
by field names and by lm-eval's keys; `exact_match` against a hand computation (prompts built
here, each generated alone by `model.generate`, cut at the stop string and compared).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is in the dev extra: pip install -e '.[dev]'")

import torch

from eval.api import evaluate
from eval.errors import EvalDataError, TaskSpecError
from eval.tasks import build_spec, load_task, parse_task
from tests.support import tiny_models
from tests.support.lmeval_runner import run_lm_eval, write_custom_yaml, write_jsonl
from tests.test_eval_lmeval_parity import MAX_LENGTH, _same_accuracy, _table, _tokenizer

QUESTIONS = [
    ("which is a pet?", ["cat", "rock", "cloud", "spoon"], "A"),
    ("which one sat on the mat?", ["the dog", "a cat", "the park", "nothing at all"], "B"),
    ("what do numbers count?", ["letters", "words", "things", "a b c"], "C"),
    ("which is a letter?", ["1", "2", "z", "the mat"], "C"),
    ("where did a dog run?", ["in the park", "on the mat", "at sea", "up"], "A"),
    ("which is a number?", ["cat", "dog", "park", "7"], "D"),
    ("what is hello in Indonesian?", ["halo", "dunia", "kucing", "anjing"], "A"),
    ("which is a sentence?", ["the", "cat", "the cat sat on the mat.", "sat"], "C"),
]
# Two benchmarks of one shape under other names: a list field and a letter, or one field per
# choice and an integer label.
LISTED = [{"query": q, "options": o, "answer": a} for q, o, a in QUESTIONS]
SPREAD = [
    {"ask": q, **{f"opt_{k}": c for k, c in zip("abcd", o, strict=True)}, "gold": "ABCD".index(a)}
    for q, o, a in QUESTIONS
]
# (rows, our options, lm-eval's keys for the same prompt)
CASES = {
    "fields-listed": (
        LISTED,
        {"context": "query", "choices": "options", "label": "answer"},
        {
            "doc_to_text": "query",
            "doc_to_choice": "options",
            "doc_to_target": "{{['A','B','C','D'].index(answer)}}",
        },
    ),
    "fields-spread": (
        SPREAD,
        {"context": "ask", "choices": ["opt_a", "opt_b", "opt_c", "opt_d"], "label": "gold"},
        {"doc_to_text": "ask", "doc_to_choice": "{{[opt_a, opt_b, opt_c, opt_d]}}"},
    ),
    "templates": (
        LISTED,
        {
            "doc_to_text": "Question: {{query}}\nAnswer:",
            "doc_to_choice": "{{options}}",
            "doc_to_target": "{{['A','B','C','D'].index(answer)}}",
            "target_delimiter": " ",
            "fewshot_delimiter": "\n###\n",
        },
        None,  # the same keys
    ),
}


@pytest.fixture(scope="module")
def model():
    return tiny_models.perturb(tiny_models.build_model("llama"), seed=7, scale=0.5).float().eval()


def _spec(path: Path, options: dict, shots: int):
    return build_spec("multiple_choice", path, {**options, "shots": shots, "name": "generic"}, "g")


def _ours(model, tok, spec, tmp_path, **kwargs):
    samples = tmp_path / "samples.jsonl"
    result = evaluate(model, tok, [spec], progress=False, log_samples=samples, **kwargs)
    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    return result["metrics"], lines


# lm-eval runs take ~20 s each on a busy CPU: 0 and 2 shots, each mapping once.
@pytest.mark.parametrize(
    ("case", "shots"), [("fields-listed", 2), ("fields-spread", 0), ("templates", 2)]
)
def test_multiple_choice_by_fields_or_templates_matches_lm_eval(model, tmp_path, case, shots):
    rows, options, keys = CASES[case]
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    tok = _tokenizer(adds_bos=True)
    keys = keys if keys is not None else options
    if "doc_to_target" not in keys:
        keys = {**keys, "doc_to_target": "gold"}
    name = write_custom_yaml(tmp_path / "tasks", "local_generic", data, keys)
    theirs = run_lm_eval(model, tok, tmp_path / "tasks", [name], shots, MAX_LENGTH)
    metrics, ours = _ours(model, tok, _spec(data, options, shots), tmp_path, max_length=MAX_LENGTH)
    their_items = sorted(theirs["samples"][name], key=lambda s: s["doc_id"])
    table = [("item", "choice", "lm-eval", "ours", "diff")]
    for mine, their in zip(ours, their_items, strict=True):
        assert mine["context"] == their["arguments"][0][0], (mine["index"], mine["context"])
        assert mine["choices"] == [arguments[1] for arguments in their["arguments"]]
        for c, (ll, (their_ll, _)) in enumerate(
            zip(mine["loglikelihoods"], [r[0] for r in their["resps"]], strict=True)
        ):
            table.append((their["doc_id"], c, their_ll, ll, abs(ll - their_ll)))
    print(f"\n{case}, {shots}-shot\n{_table(table)}")
    assert all(row[-1] < 1e-4 for row in table[1:]), _table(table)
    for metric in ("acc", "acc_norm"):
        _same_accuracy(metric, ours, their_items, metrics, theirs["results"][name])
    assert metrics["generic/n"] == len(rows)


def test_a_task_string_names_fields_and_a_letter_label(tmp_path):
    data = write_jsonl(tmp_path / "rows.jsonl", SPREAD)
    task = load_task(
        parse_task(f"multiple_choice:{data}:context=ask,choices=opt_a|opt_b|opt_c|opt_d,label=gold")
    )
    assert [item.label for item in task.items] == ["ABCD".index(a) for _, _, a in QUESTIONS]
    assert task.items[1].choices == QUESTIONS[1][1]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"choices": "options", "label": "answer"}, "give context= or doc_to_text="),
        (
            {"context": "query", "doc_to_text": "q", "choices": "options", "label": "answer"},
            "not both",
        ),
        ({"context": "missing", "choices": "options", "label": "answer"}, "missing field"),
        ({"context": "query", "choices": "options", "label": "query"}, "names none of the"),
        (
            {"context": "query", "doc_to_choice": "{{ nothing }}", "label": "answer"},
            "'nothing' is undefined (columns: query, options, answer)",
        ),
    ],
)
def test_mapping_mistakes_are_one_line(tmp_path, options, message):
    data = write_jsonl(tmp_path / "rows.jsonl", LISTED)
    with pytest.raises((TaskSpecError, EvalDataError), match=re.escape(message)):
        load_task(_spec(data, options, 0))


# --- exact match ---------------------------------------------------------------------------


INPUTS = ["58 3 91", "12 40 7 33", "25 66 14", "7 1 9", "4 4 8 2", "30 10 20", "5 55", "61 6 16"]


def _hand_prompts(rows: list[dict], shots: int, first: int) -> list[str]:
    """first_n demonstrations: the first `shots` rows other than the item, 'x -> y' lines."""
    prompts = []
    for i, row in enumerate(rows[first:], start=first):
        demos = [r for j, r in enumerate(rows) if j != i][:shots]
        prompts.append("".join(f"{d['seq']} -> {d['out']}\n" for d in demos) + f"{row['seq']} ->")
    return prompts


@torch.no_grad()
def _hand_generate(model, tok, prompt: str, stop: str, max_new_tokens: int) -> str:
    """One prompt alone, greedy, the new tokens decoded and cut at the stop string."""
    ids = torch.tensor([tok(prompt)["input_ids"]])
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=tok.pad_token_id or 0,
        eos_token_id=tok.eos_token_id,
    )
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True).split(stop, 1)[0]


def test_exact_match_equals_a_hand_computation(model, tmp_path):
    tok = _tokenizer(adds_bos=False)
    stop, max_new = "\n", 6
    # Items 3.. are prompted with rows 0 and 1 only (first_n), so their answers can be planted:
    # every other one is set to what the model generates, the rest to an answer it cannot give.
    rows = [{"seq": s, "out": str(max(map(int, s.split())))} for s in INPUTS]
    generated = [_hand_generate(model, tok, p, stop, max_new) for p in _hand_prompts(rows, 2, 3)]
    for k, text in enumerate(generated):
        rows[3 + k]["out"] = text.strip() if k % 2 == 0 else "never said"
    planted = sum(1 for k, text in enumerate(generated) if k % 2 == 0 and text.strip())
    assert planted >= 2, generated  # the check below must count hits
    prompts = _hand_prompts(rows, 2, 0)
    answers = [_hand_generate(model, tok, p, stop, max_new) for p in prompts]
    expected = [int(a.strip() == r["out"].strip()) for a, r in zip(answers, rows, strict=True)]
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    options = {
        "doc_to_text": "{{seq}} ->",  # the benchmark's own column names, its own line format
        "target": "out",
        "fewshot_delimiter": "\n",
        "shots": 2,
        "sampler": "first_n",
        "max_new_tokens": max_new,
    }
    spec = build_spec("exact_match", data, {**options, "name": "em"}, "em")
    samples = tmp_path / "samples.jsonl"
    result = evaluate(model, tok, [spec], progress=False, batch_size=3, log_samples=samples)
    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    assert [line["prompt"] for line in lines] == prompts
    assert [line["generation"] for line in lines] == answers
    assert [line["exact_match"] for line in lines] == expected
    assert sum(expected) >= 2
    assert result["metrics"]["em/exact_match"] == sum(expected) / len(rows)
    assert result["config"]["tasks"]["em"]["stop"] == "\n"


# --- CoPain, from its documented shape -------------------------------------------------------

# Built from what is documented of ahmedselhady/CoPain (a Hub dataset of language-free
# in-context tasks scored by accuracy, the lm-eval task icp_bench of its authors' fork), not
# from the released rows, which cannot be fetched here: one row per item, a text the model
# continues and its answer. The column names `input` and `output` stand for whatever the release
# uses; only the suite's mapping names them.
COPAIN_SUITE = """
families:
  f: {held_in: [eng_Latn], held_out: []}
root: .
tasks:
  copain_em:
    kind: exact_match
    path: copain/
    split: test
    input: input
    target: output
    fewshot_delimiter: "\\n"
    shots: 2
    max_new_tokens: 4
  copain_mc:
    kind: multiple_choice
    path: copain/
    split: test
    doc_to_text: input
    doc_to_choice: "{{ input.split(' ->')[0].split() }}"
    doc_to_target: "{{ input.split(' ->')[0].split().index(output) }}"
    fewshot_delimiter: "\\n"
    shots: 2
"""


def test_copain_shaped_rows_score_through_both_kinds(model, tmp_path):
    """Both kinds on CoPain-shaped rows in a snapshot folder, each against a hand computation:
    exact match of the logged generations, and the choice with the highest log-likelihood."""
    from click.testing import CliRunner

    import cli
    from tests.support import published

    rows = [{"input": f"{s} ->", "output": str(max(map(int, s.split())))} for s in INPUTS]
    folder = tmp_path / "copain"
    (folder / "data").mkdir(parents=True)
    write_jsonl(folder / "data/test.jsonl", rows)
    published.write_card(folder, {"default": {"test": "data/test.jsonl"}})
    (tmp_path / "suite.yml").write_text(COPAIN_SUITE, encoding="utf-8")
    tiny_models.save(model, tmp_path / "model")
    _tokenizer(adds_bos=False).save_pretrained(tmp_path / "model")
    argv = ["eval", str(tmp_path / "model"), "--suite", str(tmp_path / "suite.yml")]
    result = CliRunner().invoke(cli.cli, [*argv, "-o", str(tmp_path / "out"), "-q"])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "out/results.json").read_text(encoding="utf-8"))
    units = {unit["id"]: unit for unit in saved["units"]}

    def samples(unit: str) -> list[dict]:
        text = (tmp_path / "out" / units[unit]["samples"]).read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines()]

    generated = samples("copain_em")
    assert [line["prompt"].splitlines()[-1] for line in generated] == [r["input"] for r in rows]
    hits = [
        int(line["generation"].strip() == r["output"])
        for line, r in zip(generated, rows, strict=True)
    ]
    assert units["copain_em"]["metrics"]["exact_match"] == sum(hits) / len(rows)
    scored = samples("copain_mc")
    gold = [r["input"][:-3].split().index(r["output"]) for r in rows]
    assert [line["gold"] for line in scored] == gold
    picked = [line["loglikelihoods"].index(max(line["loglikelihoods"])) for line in scored]
    assert units["copain_mc"]["metrics"]["acc"] == pytest.approx(
        sum(p == g for p, g in zip(picked, gold, strict=True)) / len(rows)
    )

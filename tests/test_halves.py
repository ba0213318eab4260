"""A suite's items split into a search half and a report half (`surgery eval --suite --half`),
and a suite scored on a model in memory (what sweep, localize and search score with)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import cli
from eval.api import evaluate, load_model, load_task
from eval.errors import TaskSpecError
from eval.study import results as res
from eval.study.compare import compare
from eval.study.halves import half_of, split_items
from eval.study.memory import SuiteScorer, axis_name, prepare_suite
from eval.study.runner import SuiteRun
from eval.tasks import parse_task

DATA = Path(__file__).parent / "data" / "eval"
LANGS = ("ces_Latn", "slk_Latn", "eng_Latn")
SUITE = """\
families:
  slavic: {held_in: [ces_Latn], held_out: [slk_Latn]}
others: [eng_Latn]
tasks:
  ppl: {path: "ppl/{lang}/"}
  belebele: {path: "belebele/{lang}.jsonl", shots: 1}
  flores: {dir: "flores/", directions: ["eng_Latn-{lang}"], shots: 1, shots_split: dev,
           max_new_tokens: 3}
root: .
"""
ARGS = ["--batch-size", "4", "-q"]


def _write_data(root: Path) -> Path:
    """Perplexity documents, Belebele rows and FLORES dev and devtest for every language."""
    belebele = (DATA / "belebele.jsonl").read_text(encoding="utf-8").splitlines()
    english = (DATA / "flores/devtest/eng_Latn.devtest").read_text(encoding="utf-8").splitlines()
    for n, lang in enumerate(LANGS):
        (root / "ppl" / lang).mkdir(parents=True)
        docs = [{"text": f"{lang} document {i}: the river runs to the sea {i}."} for i in range(7)]
        (root / "ppl" / lang / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
        (root / "belebele").mkdir(exist_ok=True)
        rows = [
            json.loads(line) | {"question": f"{lang} {json.loads(line)['question']}"}
            for line in belebele
        ]
        (root / "belebele" / f"{lang}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows)
        )
        for split in ("dev", "devtest"):
            (root / "flores" / split).mkdir(parents=True, exist_ok=True)
            lines = [f"{line[: 10 + n]} {split}" for line in english]
            (root / "flores" / split / f"{lang}.{split}").write_text("\n".join(lines) + "\n")
    (root / "suite.yml").write_text(SUITE, encoding="utf-8")
    return root / "suite.yml"


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    return _write_data(tmp_path_factory.mktemp("halves"))


def test_split_items_is_a_stable_partition():
    items = list(range(3, 40))
    search, report = split_items(items, seed=0, key="ppl/ces_Latn")
    assert set(search).isdisjoint(report) and sorted(search + report) == items
    assert len(search) == len(report) + 1  # an odd count: the extra item is the search half's
    assert split_items(items, 0, "ppl/ces_Latn") == (search, report)  # stable for a seed
    assert split_items(items, 1, "ppl/ces_Latn") != (search, report)
    assert split_items(items, 0, "ppl/slk_Latn") != (search, report)  # each unit its own


def test_halves_leave_out_the_demonstrations(suite):
    root = suite.parent
    belebele = load_task(parse_task(f"belebele:{root}/belebele/ces_Latn.jsonl:shots=1"))
    flores = load_task(
        parse_task(f"flores:{root}/flores:src=eng_Latn,tgt=ces_Latn,shots=1,shots_split=dev")
    )
    ppl = load_task(parse_task(f"ppl:{root}/ppl/ces_Latn/"))
    *demonstration, item = flores.prompts(5, seed=0)[0].split("\n\n")
    assert demonstration[0].endswith(" dev") and item.splitlines()[0].endswith(" devtest")
    # first_n: row 0 is every other row's demonstration; it is in neither half (6 rows).
    # FLORES dev is the demonstration pool: all 5 devtest sentences are split.
    for task, free in ((belebele, range(1, 6)), (flores, range(5)), (ppl, range(7))):
        search = half_of(task, "unit/x", "search", 0, None, 0)
        report = half_of(task, "unit/x", "report", 0, None, 0)
        assert search.isdisjoint(report) and search | report == set(free)
        assert half_of(task, "unit/x/seed=3", "search", 0, None, 0) == search  # seed copies
    with_limit = half_of(ppl, "unit/x", "search", 0, 4, 0) | half_of(
        ppl, "unit/x", "report", 0, 4, 0
    )
    assert with_limit == {0, 1, 2, 3}


@pytest.mark.parametrize(
    ("text", "fix"),
    [
        ("flores:{root}/flores:src=eng_Latn,tgt=ces_Latn,shots=1", "shots_split=dev"),
        ("piqa:" + str(DATA / "piqa.jsonl") + ":shots=1", "sampler=first_n"),
        ("copain:n=4,shots=1", "shots=0"),
    ],
)
def test_demonstrations_drawn_from_the_items_cannot_be_halved(suite, text, fix):
    task = load_task(parse_task(text.format(root=suite.parent)))
    with pytest.raises(TaskSpecError, match=fix):
        half_of(task, "unit", "search", 0, None, 0)


def test_an_item_scores_the_same_in_a_half_as_in_the_whole(suite, families):
    """Prompts and demonstrations are those of the whole run: each line of a half equals the
    whole run's line for that item."""
    root = suite.parent
    model, tokenizer = load_model(families("llama")["base"], "cpu", None, progress=False)
    texts = [
        f"belebele:{root}/belebele/ces_Latn.jsonl:shots=1",
        f"flores:{root}/flores:src=eng_Latn,tgt=ces_Latn,shots=1,shots_split=dev,max_new_tokens=3",
        f"ppl:{root}/ppl/ces_Latn/",
    ]
    for text in texts:
        whole, half = [], []
        evaluate(model, tokenizer, [text], progress=False, log_samples=whole.append)
        evaluate(model, tokenizer, [text], progress=False, log_samples=half.append, items={1, 3})
        assert [line["doc_id"] for line in half] == [whole[1]["doc_id"], whole[3]["doc_id"]]
        for line, other in zip(half, [whole[1], whole[3]], strict=True):
            _same_line(line, other)


def _eval(*argv):
    return CliRunner().invoke(cli, ["eval", *map(str, argv)])


def _lines(folder: Path) -> dict[str, list[dict]]:
    saved = res.read_results(folder)
    return {unit.id: res.read_samples(folder, unit) for unit in saved.units}


def _same_line(line: dict, other: dict) -> None:
    """The same item, prompt and outcome; log-likelihoods equal up to float rounding (a half's
    batches hold other items, so a padded batch may round its last bits otherwise)."""
    assert line.keys() == other.keys()
    for key, value in line.items():
        if key in ("loglikelihood", "loglikelihoods"):
            assert value == pytest.approx(other[key], rel=1e-5, abs=1e-5)
        else:
            assert value == other[key], key


def test_eval_half_scores_disjoint_halves_of_the_items(suite, families, tmp_path):
    base = families("llama")["base"]
    for half in ("search", "report"):
        result = _eval(base, "--suite", suite, "-o", tmp_path / half, "--half", half, *ARGS)
        assert result.exit_code == 0, result.output
    whole = _eval(base, "--suite", suite, "-o", tmp_path / "whole", *ARGS)
    assert whole.exit_code == 0, whole.output
    search, report, every = (_lines(tmp_path / n) for n in ("search", "report", "whole"))
    for unit, lines in every.items():
        ids = {line["doc_id"] for line in lines}
        mine, theirs = ({line["doc_id"] for line in h[unit]} for h in (search, report))
        assert mine and theirs and mine.isdisjoint(theirs)
        first = next(line["doc_id"] for line in lines if line["index"] == 0)
        demonstrations = {first} if unit.startswith("belebele/") else set()
        assert mine | theirs == ids - demonstrations, unit
        by_id = {line["doc_id"]: line for line in lines}
        for line in search[unit] + report[unit]:
            _same_line(line, by_id[line["doc_id"]])
    settings = res.read_results(tmp_path / "report").settings
    assert settings["half"] == "report" and settings["split_seed"] == 0
    assert "half" not in res.read_results(tmp_path / "whole").settings
    again = _eval(base, "--suite", suite, "-o", tmp_path / "other", "--half", "search",
                  "--split-seed", "1", *ARGS)  # fmt: skip
    assert again.exit_code == 0
    assert _lines(tmp_path / "other") != search
    # Results of another half, or of all items, are never compared item by item.
    from eval.errors import CompareError

    with pytest.raises(CompareError, match="settings.half"):
        compare(tmp_path / "whole", [tmp_path / "report"], resamples=10)


def test_half_options_need_a_suite(suite, families):
    base = families("llama")["base"]
    result = _eval(base, "-t", "copain", "--half", "search")
    assert result.exit_code == 2 and "go with --suite" in result.output
    result = _eval(base, "--suite", suite, "-o", "x", "--split-seed", "1")
    assert result.exit_code == 2 and "--split-seed goes with --half" in result.output


def test_a_suite_scored_in_memory_equals_eval_and_compare(suite, families, tmp_path):
    """The suite scorer's averages are compare's values for `surgery eval --suite` folders."""
    base, trained = families("llama")["base"], families("llama")["trained"]
    for name, path in (("base", base), ("trained", trained)):
        argv = [path, "--suite", suite, "-o", tmp_path / name, "--half", "report", *ARGS]
        assert _eval(*argv).exit_code == 0
    comparison = compare(tmp_path / "base", [tmp_path / "trained"], resamples=10)
    options = SuiteRun(batch_size=4, progress=False, half="report")
    scorer = SuiteScorer(prepare_suite(suite, options, base))
    for model_path, name in ((base, "base"), (trained, "trained")):
        model, tokenizer = scorer.load(model_path)
        scores = scorer(model, tokenizer)
        assert set(scores) == {
            "ppl/held_in/ppl",
            "ppl/held_out/ppl",
            "ppl/others/ppl",
            "belebele/held_in/acc",
            "belebele/held_out/acc",
            "belebele/others/acc",
            "flores[eng_Latn-{lang}]/held_in/chrf",
            "flores[eng_Latn-{lang}]/held_out/chrf",
        }  # fmt: skip (a flores direction is named by its template)
        model_name = res.read_results(tmp_path / name).model.name
        for key, value in scores.items():
            task, split, metric = key.split("/")
            row = next(
                r
                for r in comparison.rows
                if (r["model"], axis_name(r), r["metric"], r["split"], r["scope"])
                == (model_name, task, metric, split, "overall")
            )
            assert value == pytest.approx(row["value"], rel=1e-12), key

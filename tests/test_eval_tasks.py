"""Eval wrapper without a model: task strings, data readers, malformed files, prompts, Copain."""

from __future__ import annotations

import gzip
import json
import random
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import cli
from eval.api import load_tasks
from eval.command import format_table
from eval.errors import EvalDataError, TaskSpecError
from eval.kinds.belebele import read_belebele
from eval.kinds.copain import TASKS, CopainTask, build_prompts, make_items
from eval.kinds.flores import align, find_language_file
from eval.kinds.mc import build_contexts
from eval.kinds.piqa import read_piqa
from eval.kinds.ppl import language_files, read_documents
from eval.kinds.shots import choose_shots
from eval.scoring import windows
from eval.tasks import Settings, check_unique_names, load_task, parse_task

DATA = Path(__file__).parent / "data" / "eval"
BAD = DATA / "bad"


# --- task strings -------------------------------------------------------------------------


def test_parse_task_fills_defaults_and_reads_options():
    spec = parse_task("belebele:data/eng_Latn.jsonl")
    assert (spec.kind, spec.path, spec.name) == (
        "belebele",
        Path("data/eng_Latn.jsonl"),
        "belebele",
    )
    assert spec.options["shots"] == 2

    spec = parse_task("flores:flores200:src=eng_Latn,tgt=ind_Latn,shots=0,metric=chrf++")
    assert spec.path == Path("flores200")
    assert (spec.options["src"], spec.options["tgt"]) == ("eng_Latn", "ind_Latn")
    assert (spec.options["shots"], spec.options["metric"], spec.options["split"]) == (
        0,
        "chrf++",
        "devtest",
    )

    spec = parse_task("copain:shots=3,n=20,name=icl")
    assert (spec.path, spec.name, spec.options["shots"], spec.options["n"]) == (None, "icl", 3, 20)
    assert parse_task("copain").options == {
        "name": "copain",
        "shots": 5,
        "n": 150,
        "max_new_tokens": 16,
        "add_bos": "auto",
    }


def test_parse_task_keeps_paths_that_contain_equals_or_colons():
    assert parse_task("ppl:runs/a=b.txt").path == Path("runs/a=b.txt")
    spec = parse_task("ppl:x:y/held.txt:lang=eng")
    assert (spec.path, spec.options["lang"]) == (Path("x:y/held.txt"), "eng")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mmlu:data.jsonl", "unknown kind 'mmlu'"),
        ("belebele", "belebele needs a path"),
        ("copain:data.jsonl", "copain takes no path"),
        ("piqa:p.jsonl:shot=2", "unknown option 'shot'"),
        ("piqa:p.jsonl:shots=two", "bad shots='two'"),
        ("piqa:p.jsonl:shots=-1", "must be at least 0"),
        ("flores:dir:src=eng_Latn", "flores needs tgt=..."),
        ("flores:dir:src=eng_Latn,tgt=ind_Latn,metric=bleu", "must be one of chrf, chrf++"),
        ("copain:shots=1,shots=2", "option 'shots' given twice"),
        ("copain:name=a/b", "bad name='a/b'"),
    ],
)
def test_parse_task_rejects_bad_strings_with_a_reason(text, message):
    with pytest.raises(TaskSpecError, match=message.replace("+", r"\+")):
        parse_task(text)


def test_two_tasks_with_one_name_are_refused():
    # Checked before any file is read: these files do not exist.
    with pytest.raises(TaskSpecError, match="share the name 'belebele'"):
        load_tasks(["belebele:a.jsonl", "belebele:b.jsonl"])
    with pytest.raises(TaskSpecError, match="no task given"):
        load_tasks([])
    specs = [parse_task("belebele:a.jsonl"), parse_task("belebele:b.jsonl:name=bele_ind")]
    check_unique_names(specs)
    assert [s.name for s in specs] == ["belebele", "bele_ind"]


# --- malformed data ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "file", "line", "message"),
    [
        ("belebele", "belebele_bad_json.jsonl", 2, "bad JSON"),
        ("belebele", "belebele_missing_field.jsonl", 2, "missing field 'question'"),
        ("belebele", "belebele_answer_out_of_range.jsonl", 3, "correct_answer_num 5 out of range"),
        ("piqa", "piqa_label_out_of_range.jsonl", 2, "label 2 out of range 0..1"),
        ("piqa", "piqa_not_an_object.jsonl", 2, "expected a JSON object"),
        ("ppl", "madlad_no_text.jsonl", 2, "no string 'text' field"),
        ("piqa", "empty.jsonl", None, "empty: no rows"),
        ("belebele", "no_such_file.jsonl", None, "no such file"),
    ],
)
def test_malformed_files_name_the_file_and_line(kind, file, line, message):
    where = f"{BAD / file}:{line}" if line else str(BAD / file)
    with pytest.raises(EvalDataError) as caught:
        options = ":shots=0" if kind != "ppl" else ""  # this check must not be about shots
        load_task(parse_task(f"{kind}:{BAD / file}{options}"))
    assert str(caught.value).startswith(f"{where}: ")
    assert message in str(caught.value)


def test_too_few_rows_for_the_shots_is_an_error():
    with pytest.raises(EvalDataError, match="6 rows; 6-shot needs at least 7"):
        load_task(parse_task(f"piqa:{DATA / 'piqa.jsonl'}:shots=6"))


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(EvalDataError, match=r"latin1\.jsonl:2: not UTF-8"):
        read_documents([path])


def test_cli_exits_2_on_bad_data_and_bad_task_strings(tmp_path):
    # Data is checked before the model loads: this folder need not hold a model (it must exist:
    # a mistyped path is refused first, before any data is read).
    model = tmp_path / "model"
    model.mkdir()
    model = str(model)
    bad = BAD / "belebele_answer_out_of_range.jsonl"
    result = CliRunner().invoke(cli, ["eval", model, "-t", f"belebele:{bad}:shots=0"])
    assert result.exit_code == 2
    assert f"error: {bad}:3: correct_answer_num 5 out of range" in result.output

    result = CliRunner().invoke(cli, ["eval", model, "-t", "piqa:x.jsonl:shot=2"])
    assert result.exit_code == 2
    assert "unknown option 'shot'" in result.output


# --- readers ----------------------------------------------------------------------------------


def test_gzipped_jsonl_reads_like_plain(tmp_path):
    plain = DATA / "madlad" / "data" / "eng" / "eng_clean_0000.jsonl"
    packed = tmp_path / "eng_clean_0001.jsonl.gz"
    with gzip.open(packed, "wb") as handle:
        handle.write(plain.read_bytes())
    assert read_documents([packed]) == read_documents([plain])
    assert language_files(packed) == {"eng": [packed]}


def test_empty_texts_are_skipped_but_not_all_of_them(tmp_path):
    path = tmp_path / "eng.jsonl"
    path.write_text('{"text": "one"}\n{"text": "  "}\n{"text": "two"}\n')
    assert read_documents([path]) == ["one", "two"]
    path.write_text('{"text": ""}\n')
    with pytest.raises(EvalDataError, match="no text to score"):
        read_documents([path])
    path.write_text('{"text": 3}\n')
    with pytest.raises(EvalDataError, match=r"eng\.jsonl:1: no string 'text' field"):
        read_documents([path])


def test_madlad_root_gives_one_language_per_folder():
    files = language_files(DATA / "madlad")
    assert list(files) == ["eng", "ind"]
    documents = read_documents(files["eng"])
    rows = (DATA / "madlad/data/eng/eng_clean_0000.jsonl").read_text().splitlines()
    assert documents == [json.loads(row)["text"] for row in rows]
    with pytest.raises(TaskSpecError, match="names one language"):
        language_files(DATA / "madlad", lang="eng")


def test_text_file_documents_are_blank_line_separated_paragraphs():
    assert read_documents([DATA / "held_out.txt"]) == [
        "The cat sat on the mat.\nIt was warm there.",
        "A dog ran in the park,\nchasing a red ball.",
    ]
    assert language_files(DATA / "held_out.txt", lang="eng") == {"eng": [DATA / "held_out.txt"]}


def test_windows_predict_every_token_once():
    ids = list(range(23))
    for length in (1, 4, 7, 22, 50):
        pairs = windows(ids, length)
        assert [t for _, cont in pairs for t in cont] == ids[1:]
        assert all(len(context) + len(cont) - 1 <= length for context, cont in pairs)
        # Every window but the first reads a full window (lm-eval's rule): context + targets.
        for context, cont in pairs:
            start = ids.index(context[0]) if context else ids.index(cont[0])
            assert context + cont == ids[start : start + len(context) + len(cont)]
        if len(ids) - 1 > length:
            assert len(pairs[-1][0]) + len(pairs[-1][1]) - 1 == length


def test_flores_files_are_found_and_aligned_by_id(tmp_path):
    root = DATA / "flores"
    src = find_language_file(root, "devtest", "eng_Latn")
    assert src == root / "devtest" / "eng_Latn.devtest"
    pairs = align(src, find_language_file(root, "devtest", "ind_Latn"))
    assert pairs[2] == ("Hello world.", "Halo dunia.")

    # jsonl with ids, in another order: matched by id, not by line.
    rows = [{"id": i + 1, "text": t} for i, t in enumerate(["A one.", "A two.", "A three."])]
    (tmp_path / "aaa_Latn.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    shuffled = [{"id": r["id"], "text": r["text"].replace("A", "B")} for r in reversed(rows)]
    (tmp_path / "bbb_Latn.jsonl").write_text("\n".join(json.dumps(r) for r in shuffled))
    pairs = align(tmp_path / "aaa_Latn.jsonl", tmp_path / "bbb_Latn.jsonl")
    assert pairs == [("A one.", "B one."), ("A two.", "B two."), ("A three.", "B three.")]

    (tmp_path / "ccc_Latn.jsonl").write_text("\n".join(json.dumps(r) for r in shuffled[:2]))
    with pytest.raises(EvalDataError, match="not aligned: id 1 is missing"):
        align(tmp_path / "aaa_Latn.jsonl", tmp_path / "ccc_Latn.jsonl")
    with pytest.raises(EvalDataError, match="no xxx_Latn file for split devtest"):
        find_language_file(root, "devtest", "xxx_Latn")


def test_flores_blank_line_is_an_error(tmp_path):
    shutil.copytree(DATA / "flores", tmp_path / "flores")
    path = tmp_path / "flores" / "devtest" / "ind_Latn.devtest"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines[:3], "", *lines[3:]]) + "\n")
    with pytest.raises(EvalDataError, match=r"ind_Latn\.devtest:4: empty line"):
        load_task(parse_task(f"flores:{tmp_path / 'flores'}:src=eng_Latn,tgt=ind_Latn"))


# --- prompts and demonstrations ---------------------------------------------------------------


def test_belebele_prompt_format():
    row = json.loads((DATA / "belebele.jsonl").read_text().splitlines()[1])
    item = read_belebele(DATA / "belebele.jsonl")[1]
    assert item.question == (
        f"P: {row['flores_passage']}\nQ: {row['question'].strip()}\nA: {row['mc_answer1']}\n"
        f"B: {row['mc_answer2']}\nC: {row['mc_answer3']}\nD: {row['mc_answer4']}\nAnswer:"
    )
    assert item.choices == ["A", "B", "C", "D"]
    assert item.label == int(row["correct_answer_num"]) - 1
    assert build_contexts([item], [[]], 1) == [item.question]


def test_piqa_is_a_cloze_in_either_schema():
    row = json.loads((DATA / "piqa.jsonl").read_text().splitlines()[3])
    item = read_piqa(DATA / "piqa.jsonl")[3]
    assert item.question == row["prompt"]
    assert item.choices == [row["solution0"], row["solution1"]]
    assert item.demonstration() == row["prompt"] + " " + row[f"solution{row['label']}"] + "\n\n"
    row = json.loads((DATA / "piqa_classic.jsonl").read_text().splitlines()[1])
    item = read_piqa(DATA / "piqa_classic.jsonl")[1]
    assert item.question == f"Question: {row['goal']}\nAnswer:"
    assert (item.choices, item.label) == ([row["sol1"], row["sol2"]], row["label"])


@pytest.mark.parametrize("sampler", ["first_n", "default", "random"])
@pytest.mark.parametrize("reader", [read_belebele, read_piqa])
def test_k_shot_never_includes_the_evaluated_item(reader, sampler):
    path = DATA / ("belebele.jsonl" if reader is read_belebele else "piqa.jsonl")
    items = reader(path)
    for shots in (1, 2, len(items) - 1):
        chosen = choose_shots([it.doc for it in items], len(items), shots, sampler, key="k/0")
        contexts = build_contexts(items, chosen, len(items))
        for index, context in enumerate(contexts):
            blocks = context.split("\n\n")
            assert len(blocks) == shots + 1
            assert blocks[-1] == items[index].question
            assert items[index].demonstration() not in [b + "\n\n" for b in blocks[:-1]]
            assert all(b + "\n\n" in {it.demonstration() for it in items} for b in blocks[:-1])


def test_first_n_takes_the_first_other_rows():
    docs = [{"q": i} for i in range(6)]
    assert choose_shots(docs, 3, 2, "first_n") == [[1, 2], [0, 2], [0, 1]]


def test_lm_eval_default_sampler_is_one_seeded_stream():
    docs = [{"q": i} for i in range(9)]
    rnd = random.Random(1234)
    expected = [rnd.sample(range(9), 2) for _ in range(4)]
    assert choose_shots(docs, 4, 2, "default", exclude_self=False) == expected
    assert choose_shots(docs, 4, 2, "default", fewshot_seed=1) != expected


def test_random_demonstrations_depend_on_the_seed_only():
    docs = [it.doc for it in read_belebele(DATA / "belebele.jsonl")]
    first = choose_shots(docs, len(docs), 2, "random", key="belebele/0")
    assert choose_shots(docs, len(docs), 2, "random", key="belebele/0") == first
    assert choose_shots(docs, len(docs), 2, "random", key="belebele/1") != first
    # Evaluating fewer items (--limit) does not change the prompts of those evaluated.
    assert choose_shots(docs, 2, 2, "random", key="belebele/0") == first[:2]


def test_task_options_choose_the_sampler_and_bos():
    task = load_task(parse_task(f"belebele:{DATA / 'belebele.jsonl'}"))
    assert (task.sampler, task.config()["add_bos"]) == ("first_n", "auto")
    task = load_task(parse_task(f"piqa:{DATA / 'piqa.jsonl'}:sampler=random,add_bos=false"))
    assert (task.sampler, task.config()["add_bos"], task.schema.name) == (
        "random",
        "false",
        "global_piqa",
    )
    with pytest.raises(TaskSpecError, match="bad sampler='last'"):
        parse_task("piqa:x.jsonl:sampler=last")


# --- Copain -----------------------------------------------------------------------------------


def _expected_answer(task: str, values: tuple[str, ...]) -> str:
    """Each task's answer, computed here without the module's code."""
    if task in ("first_char", "last_char"):
        ordered = sorted(values)
        return ordered[0] if task == "first_char" else ordered[-1]
    numbers = sorted(int(v) for v in values)
    if task == "max":
        return str(numbers[-1])
    if task == "min":
        return str(numbers[0])
    if task == "median":
        return str(numbers[len(numbers) // 2])
    if task == "parity":
        return str(numbers.count(1) % 2)
    assert task == "length"
    return str(len(numbers))


def test_copain_items_have_the_right_answers():
    assert len(TASKS) == 7
    for task in TASKS:
        items = make_items(task, 150, seed=0)
        assert len(items) == 150
        for item in items:
            assert item.answer == _expected_answer(task, item.values)
            if task == "median":
                assert len(item.values) % 2 == 1
            if task == "parity":
                assert set(item.values) <= {"0", "1"}


def test_copain_is_identical_for_a_seed_and_differs_across_seeds():
    task = CopainTask.from_spec(parse_task("copain:n=20,shots=5"))
    first = task.prompts(Settings(seed=0))
    assert task.prompts(Settings(seed=0)) == first
    other = task.prompts(Settings(seed=1))
    assert all(first[name] != other[name] for name in TASKS)
    prompts, answers = first["max"]
    assert len(prompts) == len(answers) == 20


def test_copain_prompt_format_and_no_leak():
    items = make_items("parity", 30, seed=3)  # short bit lists: duplicates are likely
    prompts = build_prompts(items, len(items), 5, "copain/3/parity")
    for item, prompt in zip(items, prompts, strict=True):
        lines = prompt.split("\n")
        assert len(lines) == 6
        assert lines[-1] == " ".join(item.values) + " ->"
        for demo in lines[:-1]:
            values, answer = demo.split(" -> ")
            assert values != " ".join(item.values)
            assert answer == _expected_answer("parity", tuple(values.split()))


def test_copain_n_must_exceed_shots():
    with pytest.raises(TaskSpecError, match="n must exceed shots"):
        load_task(parse_task("copain:n=5,shots=5"))


def test_format_table_shows_each_metric_with_its_n():
    table = format_table({"piqa/acc": 0.5, "piqa/n": 6, "ppl/eng/ppl": 12.25, "ppl/eng/n": 3})
    lines = table.splitlines()
    assert lines[0].split() == ["metric", "value", "n"]
    assert lines[1].split() == ["piqa/acc", "0.5000", "6"]
    assert lines[2].split() == ["ppl/eng/ppl", "12.2500", "3"]
    assert len(lines) == 3

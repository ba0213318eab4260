"""`-t lm-eval:TASK`: lm-evaluation-harness tasks on the model in memory, offline (local YAMLs
and local data files), inside `surgery eval` and inside an in-memory sweep."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import cli
from eval.api import evaluate, load_model, load_tasks
from eval.errors import TaskSpecError
from eval.scorer import TaskScorer
from surgery.diagnostics.sweep import run_sweep

DATA = Path(__file__).parent / "data" / "eval"


def test_without_lm_eval_the_task_is_a_one_line_error(monkeypatch, families):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval raises ImportError
    with pytest.raises(TaskSpecError, match=r"pip install \"checkpoint-surgery\[lm-eval\]\""):
        load_tasks(["lm-eval:piqa"])
    path = str(families("llama")["base"])
    result = CliRunner().invoke(cli, ["eval", path, "-t", "lm-eval:piqa", "-q"])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "lm-evaluation-harness" in result.stderr


pytest.importorskip("lm_eval", reason="lm-eval is in the dev extra: pip install -e '.[dev]'")

from tests.support.lmeval_runner import write_task_yamls  # noqa: E402


@pytest.fixture(scope="module")
def yamls(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lm_eval_tasks")
    files = {"belebele": DATA / "belebele.jsonl", "piqa": DATA / "piqa_classic.jsonl"}
    write_task_yamls(folder, files)
    return folder


def test_unknown_task_fails_before_any_model(yamls):
    with pytest.raises(TaskSpecError, match="lm-eval knows no task 'nope'"):
        load_tasks([f"lm-eval:local_piqa,nope:include={yamls},builtin=false"])


def test_harness_task_agrees_with_our_task_on_the_same_rows(families, yamls):
    model, tok = load_model(families("llama")["base"], progress=False)
    ours = f"belebele:{DATA / 'belebele.jsonl'}:shots=0"
    harness = f"lm-eval:local_belebele:include={yamls},builtin=false,shots=0"
    metrics = evaluate(model, tok, [ours, harness], progress=False, max_length=1024)["metrics"]
    for metric in ("acc", "acc_norm", "acc_stderr"):
        assert metrics[f"lm-eval/local_belebele/{metric}"] == metrics[f"belebele/{metric}"]
    assert metrics["lm-eval/local_belebele/n"] == metrics["belebele/n"] == 6


def test_harness_task_scores_blends_in_memory_in_a_sweep(families, yamls, tmp_path):
    paths = families("llama")
    harness = f"lm-eval:local_piqa:include={yamls},builtin=false,shots=0"
    ours = f"piqa:{DATA / 'piqa_classic.jsonl'}:shots=0"
    rows = run_sweep(
        paths["base"],
        paths["trained"],
        tmp_path / "sweep",
        [0.0, 0.5, 1.0],
        scorer=TaskScorer.of([harness, ours]),
        save=False,
        in_memory=True,
        quiet=True,
    )
    assert [row["alpha"] for row in rows] == [0.0, 0.5, 1.0]
    for row in rows:  # the harness and our own task see the same blend in memory
        assert row["lm-eval/local_piqa/acc_norm"] == row["piqa/acc_norm"]
        assert row["lm-eval/local_piqa/acc"] == row["piqa/acc"]
    for alpha, key in ((0.0, "base"), (1.0, "trained")):
        model, tok = load_model(paths[key], progress=False)
        expected = evaluate(model, tok, [harness], progress=False)["metrics"]
        row = next(r for r in rows if r["alpha"] == alpha)
        assert row["lm-eval/local_piqa/acc"] == expected["lm-eval/local_piqa/acc"]
    assert not any((tmp_path / "sweep").glob("alpha-*"))  # nothing written

"""Benchmarks in their published layouts (snapshot folders) read as today's files are."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import cli
from eval.errors import EvalDataError
from eval.kinds.belebele import read_belebele
from eval.kinds.piqa import read_piqa
from eval.kinds.ppl import language_files, read_documents
from eval.published import data_files
from eval.tasks import load_task, parse_task
from tests.support import published

DATA = Path(__file__).parent / "data" / "eval"


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


@pytest.fixture
def flores_plus(tmp_path) -> Path:
    languages = {lang: _lines(DATA / f"flores/devtest/{lang}.devtest") for lang in ("eng_Latn",)}
    languages["ind_Latn"] = _lines(DATA / "flores/devtest/ind_Latn.devtest")
    dev = {lang: [f"dev {s}" for s in sentences] for lang, sentences in languages.items()}
    return published.flores(tmp_path / "flores_plus", {"dev": dev, "devtest": languages})


def test_flores_plus_parquet_reads_as_the_text_files(flores_plus):
    options = "src=eng_Latn,tgt=ind_Latn,shots=1"
    parquet = load_task(parse_task(f"flores:{flores_plus}:{options}"))
    text = load_task(parse_task(f"flores:{DATA / 'flores'}:{options}"))
    assert parquet.pairs == text.pairs and len(parquet.pairs) == 5
    assert parquet.files == [
        flores_plus / "devtest/eng_Latn.parquet",
        flores_plus / "devtest/ind_Latn.parquet",
    ]
    assert parquet.prompts(5, 0) == text.prompts(5, 0)
    dev = load_task(parse_task(f"flores:{flores_plus}:{options},split=dev"))
    assert dev.pairs[0][0].startswith("dev ")


def test_belebele_snapshot_reads_a_config_as_its_file(tmp_path):
    rows = published.jsonl_rows(DATA / "belebele.jsonl")
    root = published.belebele(tmp_path / "belebele", {"eng_Latn": rows, "ces_Latn": rows[:3]})
    task = load_task(parse_task(f"belebele:{root}:config=eng_Latn,shots=1"))
    assert task.items == read_belebele(DATA / "belebele.jsonl")
    assert task.files == [root / "data/eng_Latn.jsonl"]
    assert task.config()["config"] == "eng_Latn"


def test_global_piqa_configs_and_a_missing_one_names_its_variants(tmp_path):
    rows = published.jsonl_rows(DATA / "piqa.jsonl")
    root = published.global_piqa(
        tmp_path / "gp", {"spa_latn_mexi": rows, "spa_latn_spai": rows[::-1], "eng_latn": rows}
    )
    task = load_task(parse_task(f"piqa:{root}:config=spa_latn_mexi"))
    assert task.items == read_piqa(DATA / "piqa.jsonl")
    assert task.schema.name == "global_piqa"
    with pytest.raises(EvalDataError) as error:
        load_task(parse_task(f"piqa:{root}:config=spa_latn"))
    assert str(error.value) == (
        f"dataset {root}: no config spa_latn; configs nearby: spa_latn_mexi, spa_latn_spai"
    )
    with pytest.raises(
        EvalDataError, match=r"config eng_latn: no split 'validation'; splits: test"
    ):
        load_task(parse_task(f"piqa:{root}:config=eng_latn,split=validation"))


def test_a_missing_column_or_language_names_what_is_there(flores_plus, tmp_path):
    rows = published.flores_rows("ces_Latn", ["a", "b"])
    published.write_parquet(
        flores_plus / "devtest/ces_Latn.parquet", [{"id": r["id"], "txt": r["text"]} for r in rows]
    )
    with pytest.raises(
        EvalDataError, match=r"ces_Latn\.parquet:1: missing field 'text' \(columns: id, txt\)"
    ):
        load_task(parse_task(f"flores:{flores_plus}:src=eng_Latn,tgt=ces_Latn"))
    with pytest.raises(EvalDataError, match=r"no ind_Latm file .*; languages nearby: ind_Latn"):
        load_task(parse_task(f"flores:{flores_plus}:src=eng_Latn,tgt=ind_Latm"))


def test_madlad_snapshot_reads_as_its_files(tmp_path):
    plain = read_documents(language_files(DATA / "madlad")["eng"])
    root = published.madlad(tmp_path / "madlad", {"eng": plain, "ind": ["satu"]})
    found = language_files(root)
    assert found == {
        "eng": [root / "data/eng/eng_clean_0000.jsonl.gz"],
        "ind": [root / "data/ind/ind_clean_0000.jsonl.gz"],
    }
    assert read_documents(found["eng"]) == plain


def test_a_card_without_configs_is_read_by_datasets_convention():
    files = ["README.md", "eng_latn/test-00000-of-00001.parquet", "eng_latn/train-0.parquet"]
    assert data_files("d", files, None, "eng_latn", "test") == [files[1]]
    with pytest.raises(EvalDataError, match="no config fra_latn; configs nearby: eng_latn"):
        data_files("d", files, "no front matter", "fra_latn", "test")


def test_cli_refuses_an_unknown_config_in_one_line_before_the_model(tmp_path):
    rows = published.jsonl_rows(DATA / "piqa.jsonl")
    root = published.global_piqa(tmp_path / "gp", {"spa_latn_mexi": rows})
    model = tmp_path / "model"  # data is read before the model: no model needed in the folder
    model.mkdir()
    result = CliRunner().invoke(cli, ["eval", str(model), "-t", f"piqa:{root}:config=spa_latn"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: dataset {root}: no config spa_latn; configs nearby: spa_latn_mexi"
    ]

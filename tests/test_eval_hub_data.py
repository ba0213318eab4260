"""Hub datasets in suites and task strings, on a local Hub serving the published layouts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eval.errors import TaskSpecError
from eval.tasks import parse_task
from surgery.hub.datasets import DatasetRef, parse_dataset_ref
from tests.support import published
from tests.support.hub_server import FakeHub, run_surgery

DATA = Path(__file__).parent / "data" / "eval"
SHA = {"belebele": "a" * 40, "flores": "b" * 40, "piqa": "c" * 40}
SUITE = """
families:
  f: {held_in: [ind_Latn], held_out: []}
others: [eng_Latn]
tasks:
  belebele: {dataset: test/belebele, config: "{lang}", split: test, shots: 1}
  piqa: {dataset: test/global-piqa, config: "{lang_lower}", split: test, shots: 1,
         configs: {ind_Latn: [ind_latn, ind_latn_jawa]}}
  flores: {dataset: test/flores_plus, split: devtest, directions: ["eng_Latn-{lang}"],
           shots: 1, max_new_tokens: 3}
  ppl: {dataset: test/madlad, files: "data/{lang2}/{lang2}_clean_0000.jsonl.gz", skip: 1, take: 3}
"""
ARGS = ["--limit", "2", "--batch-size", "4", "-q"]


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def repos(tmp_path_factory) -> Path:
    """Belebele, FLORES+ and Global-PIQA for eng_Latn, ind_Latn and ces_Latn (never asked)."""
    root = tmp_path_factory.mktemp("repos")
    rows = published.jsonl_rows(DATA / "belebele.jsonl")
    published.belebele(
        root / "belebele", {"eng_Latn": rows, "ind_Latn": rows[1:], "ces_Latn": rows}
    )
    piqa = published.jsonl_rows(DATA / "piqa.jsonl")
    published.global_piqa(
        root / "piqa",
        {"eng_latn": piqa, "ind_latn": piqa[::-1], "ind_latn_jawa": piqa[1:], "ces_latn": piqa},
    )
    sentences = {
        "eng_Latn": _lines(DATA / "flores/devtest/eng_Latn.devtest"),
        "ind_Latn": _lines(DATA / "flores/devtest/ind_Latn.devtest"),
    }
    sentences["ces_Latn"] = sentences["eng_Latn"]
    dev = {lang: [f"dev {s}" for s in texts] for lang, texts in sentences.items()}
    published.flores(root / "flores", {"dev": dev, "devtest": sentences})
    documents = [line for line in _lines(DATA / "held_out.txt") if line.strip()]
    published.madlad(root / "madlad", {"en": documents, "id": documents[::-1], "cs": documents})
    return root


def _serve(hub: FakeHub, repos: Path) -> None:
    hub.add_dataset("test/belebele", repos / "belebele", SHA["belebele"])
    hub.add_dataset("test/global-piqa", repos / "piqa", SHA["piqa"])
    hub.add_dataset("test/flores_plus", repos / "flores", SHA["flores"], gated=True)
    hub.add_dataset("test/madlad", repos / "madlad", "d" * 40)


def _env(hub_endpoint: str, home: Path, **more: str) -> dict[str, str]:
    return {"HF_ENDPOINT": hub_endpoint, "HF_HOME": str(home), "HF_HUB_OFFLINE": "0", **more}


def _hf_download(env: dict[str, str], repo: str, *patterns: str) -> None:
    """`hf download --repo-type dataset REPO --include PATTERN...`, as a user fetches data."""
    import shutil
    import subprocess

    hf = shutil.which("hf")
    assert hf is not None
    argv = [hf, "download", "--repo-type", "dataset", repo]
    for pattern in patterns:
        argv += ["--include", pattern]
    done = subprocess.run(argv, env={**env, "PATH": str(Path(hf).parent)}, capture_output=True)
    assert done.returncode == 0, done.stderr


def _files(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_the_grammar_of_hub_datasets():
    assert parse_dataset_ref("hub:a/b#c@test@v1") == DatasetRef("a/b", "c", "test", "v1")
    assert parse_dataset_ref("hub:a/b@@main") == DatasetRef("a/b", None, None, "main")
    assert str(DatasetRef("a/b", None, None, "main")) == "hub:a/b@@main"
    spec = parse_task("belebele:hub:facebook/belebele#eng_Latn@test:shots=0")
    assert spec.path is None and spec.dataset == DatasetRef("facebook/belebele", "eng_Latn", "test")
    with pytest.raises(TaskSpecError, match="does not read Hub datasets"):
        parse_task("copain:hub:allenai/MADLAD-400")
    with pytest.raises(TaskSpecError, match="not a Hub dataset id"):
        parse_task("belebele:hub:facebook")


def test_a_suite_on_hub_datasets_records_commits_and_reruns_offline_identically(
    repos, families, tmp_path
):
    base = families("llama")["base"]
    (tmp_path / "suite.yml").write_text(SUITE, encoding="utf-8")
    home = tmp_path / "home"
    with FakeHub() as hub:
        _serve(hub, repos)
        online = _env(hub.endpoint, home, HF_TOKEN="hf_test")
        result = run_surgery(
            "eval",
            base,
            "--suite",
            tmp_path / "suite.yml",
            "-o",
            tmp_path / "on",
            *ARGS,
            env=online,
        )
        assert result.returncode == 0, result.stderr
        served = {(repo, name) for repo, name, _, _ in hub.state.served}
        # A take streams its documents; offline reads the shards fetched beforehand.
        _hf_download(online, "test/madlad", "data/id/*", "data/en/*")
    # Only the files the units read (and the cards) were fetched: nothing of ces_Latn.
    assert not [name for _, name in served if "ces" in name]
    assert ("datasets/test/flores_plus", "devtest/ind_Latn.parquet") in served
    assert ("datasets/test/flores_plus", "dev/ind_Latn.parquet") not in served
    saved = json.loads((tmp_path / "on/results.json").read_text(encoding="utf-8"))
    data = {unit["id"]: unit["data"] for unit in saved["units"]}
    assert data["belebele/ind_Latn"] == {
        "path": "hub:test/belebele#ind_Latn@test",
        "sha256": data["belebele/ind_Latn"]["sha256"],
        "dataset": "test/belebele",
        "config": "ind_Latn",
        "split": "test",
        "commit": SHA["belebele"],
    }
    assert data["piqa/eng_Latn"]["config"] == "eng_latn"
    # Two configs of one language: a unit each, both in the family's mean (as bootstrap_ci.py).
    assert data["piqa/ind_Latn/ind_latn_jawa"]["config"] == "ind_latn_jawa"
    assert "piqa/ind_Latn" not in data
    assert data["flores/ind_Latn/eng_Latn-ind_Latn"]["commit"] == SHA["flores"]
    assert data["ppl/ind_Latn"]["commit"] == "d" * 40
    assert saved["units"][-1]["metrics"]["n"] == 2  # --limit 2 of the 3 taken

    # No network, the Hub cache only: the same bytes.
    offline = {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    result = run_surgery(
        "eval", base, "--suite", tmp_path / "suite.yml", "-o", tmp_path / "off", *ARGS, env=offline
    )
    assert result.returncode == 0, result.stderr
    assert _files(tmp_path / "off") == _files(tmp_path / "on")

    from eval.study.compare import compare

    comparison = compare(tmp_path / "on", [tmp_path / "off"], resamples=10)
    rows = [r for r in comparison.rows if r["task"] == "piqa" and r["metric"] == "acc"]
    rows = [r for r in rows if r["model"] == comparison.base]
    variants = [r for r in rows if r["scope"] == "language" and r["family"] == "f"]
    assert sorted(r["lang"] for r in variants) == ["ind_Latn/ind_latn", "ind_Latn/ind_latn_jawa"]
    (family,) = [r for r in rows if r["scope"] == "family" and r["family"] == "f"]
    assert family["n"] == 2
    assert family["value"] == pytest.approx(sum(r["value"] for r in variants) / 2)


def test_a_hub_task_string_scores_as_the_local_file(repos, families, tmp_path):
    base = families("llama")["base"]
    with FakeHub() as hub:
        _serve(hub, repos)
        env = _env(hub.endpoint, tmp_path / "home")
        task = "piqa:hub:test/global-piqa#eng_latn@test:shots=1"
        result = run_surgery(
            "eval", base, "-t", task, "--out", tmp_path / "hub.json", *ARGS, env=env
        )
        assert result.returncode == 0, result.stderr
    # The local file needs no Hub environment: scored in this process (no second start-up).
    from click.testing import CliRunner

    import cli

    local = f"piqa:{DATA / 'piqa.jsonl'}:shots=1"
    args = ["eval", str(base), "-t", local, "--out", str(tmp_path / "local.json"), *map(str, ARGS)]
    result = CliRunner().invoke(cli.cli, args)
    assert result.exit_code == 0, result.output
    hub_out, local_out = (
        json.loads((tmp_path / f"{n}.json").read_text()) for n in ("hub", "local")
    )
    assert hub_out["metrics"] == local_out["metrics"]
    assert hub_out["config"]["tasks"]["piqa"]["commit"] == SHA["piqa"]


@pytest.mark.parametrize(
    ("task", "env_more", "pattern"),
    [
        (
            "flores:hub:test/flores_plus@devtest:src=eng_Latn,tgt=ind_Latn",
            {},
            re.escape(
                "error: dataset test/flores_plus is gated: accept its terms on the Hub, then log in"
            ),
        ),
        (
            "piqa:hub:test/global-piqa#spa_latn@test",
            {},
            re.escape("error: dataset test/global-piqa: no config spa_latn; configs nearby:"),
        ),
        (
            "belebele:hub:test/belebele#eng_Latn@test",
            {"HF_HUB_OFFLINE": "1"},
            re.escape(
                "error: dataset test/belebele is not in the Hub cache and the Hub cannot be reached"
            ),
        ),
        (  # a column the rows lack: the file in the cache (dataset, config) and the columns
            "multiple_choice:hub:test/belebele#eng_Latn@test:context=passage,"
            "choices=mc_answer1|mc_answer2,label=correct_answer_num",
            {},
            r"error: \S*datasets--test--belebele\S*/data/eng_Latn\.jsonl:1: missing field "
            r"'passage' \(columns: link, question_number, flores_passage, ",
        ),
        (
            "ppl:hub:test/madlad:files=data/xx/xx_clean_0000.jsonl.gz",
            {},
            re.escape("error: dataset test/madlad has no file data/xx/xx_clean_0000.jsonl.gz"),
        ),
    ],
)
def test_hub_data_errors_are_one_line_before_the_model(repos, tmp_path, task, env_more, pattern):
    model = tmp_path / "model"  # no model inside: data is read first
    model.mkdir()
    with FakeHub() as hub:
        _serve(hub, repos)
        env = _env(hub.endpoint, tmp_path / "home", **env_more)
        result = run_surgery("eval", model, "-t", task, "--out", tmp_path / "out.json", env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and re.match(pattern, lines[0]), lines
    assert not (tmp_path / "out.json").exists()


MISSING_SUITE = """
families:
  f: {held_in: [ind_Latn, fra_Latn], held_out: []}
tasks:
  piqa: {dataset: test/global-piqa, config: "{lang_lower}", split: test, shots: 1}
  flores: {dataset: test/flores_plus, split: devtest, shots_split: dev,
           directions: ["eng_Latn-{lang}"], shots: 1, max_new_tokens: 3}
  ppl: {dataset: test/madlad, files: "data/{lang2}/{lang2}_clean_0000.jsonl.gz", skip: 1, take: 3}
"""


def test_what_the_hub_lacks_is_an_error_or_with_allow_missing_a_skipped_unit(
    repos, families, tmp_path
):
    """French is in none of the local Hub's datasets: a config, a FLORES+ file and a MADLAD
    shard that do not exist. Without --allow-missing the first is one line, exit 2, before the
    model loads, nothing written; with it each is one warning line and a missing unit."""
    (tmp_path / "suite.yml").write_text(MISSING_SUITE, encoding="utf-8")
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out"
    with FakeHub() as hub:
        _serve(hub, repos)
        env = _env(hub.endpoint, tmp_path / "home", HF_TOKEN="hf_test")
        refused = run_surgery("eval", empty, "--suite", tmp_path / "suite.yml", "-o", out, env=env)
        written = out.exists()
        argv = ["--suite", tmp_path / "suite.yml", "-o", out, "--allow-missing", *ARGS]
        result = run_surgery("eval", families("llama")["base"], *argv, env=env)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines() == [
        f"error: suite {tmp_path / 'suite.yml'}: task piqa, fra_Latn: dataset test/global-piqa: "
        "no config fra_latn; configs nearby: ind_latn, eng_latn, ces_latn ... "
        "(--allow-missing skips it)"
    ]
    assert not written
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: skipped piqa/fra_Latn: dataset test/global-piqa: no config fra_latn; "
        "configs nearby: ind_latn, eng_latn, ces_latn ...",
        "warning: skipped flores/fra_Latn: dataset test/flores_plus, split devtest: no fra_Latn "
        "file; languages nearby: ind_Latn, eng_Latn, ces_Latn",
        "warning: skipped ppl/fra_Latn: dataset test/madlad has no file "
        "data/fr/fr_clean_0000.jsonl.gz",
    ]
    saved = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert [unit["id"] for unit in saved["units"]] == [
        "piqa/ind_Latn",
        "flores/ind_Latn/eng_Latn-ind_Latn",
        "ppl/ind_Latn",
    ]
    assert [(m["task"], m["lang"]) for m in saved["missing"]] == [
        ("piqa", "fra_Latn"),
        ("flores", "fra_Latn"),
        ("ppl", "fra_Latn"),
    ]
    # FLORES+ demonstrations come from dev (shots_split), the translated sentences from devtest.
    samples = (out / "samples/flores__ind_Latn__eng_Latn-ind_Latn.jsonl").read_text("utf-8")
    prompt = json.loads(samples.splitlines()[0])["prompt"]
    demonstration, item = prompt.split("\n\n")
    assert demonstration.startswith("English sentence: dev ")
    assert not item.startswith("English sentence: dev ")


def _hub_data(commit: str):
    def change(results: dict) -> None:
        for unit in results["units"]:
            unit["data"].update(dataset="test/belebele", config="c", split="test", commit=commit)

    return change


def test_compare_warns_when_only_the_commit_differs(tmp_path):
    from click.testing import CliRunner

    from cli import cli
    from tests.support.study_dirs import Study, write_results

    spec = Study(families={"f": {"held_in": ["ces_Latn"], "held_out": ["pol_Latn"]}})
    base = write_results(tmp_path / "base", spec, "base", 0.0, seed=1)
    other = write_results(tmp_path / "other", spec, "other", 0.5, seed=2)
    for folder, commit in ((base, "a" * 40), (other, "b" * 40)):
        path = folder / "results.json"
        data = json.loads(path.read_text(encoding="utf-8"))
        _hub_data(commit)(data)
        path.write_text(json.dumps(data), encoding="utf-8")
    argv = ["compare", str(other), "--base", str(base), "-o", str(tmp_path / "r"), "-q"]
    result = CliRunner().invoke(cli, [*argv, "--resamples", "10"])
    assert result.exit_code == 0, result.output
    first = next(u["id"] for u in data["units"])
    assert (
        f"warning: {other}: unit {first} read test/belebele at commit {'b' * 40}, the base at "
        f"{'a' * 40} (same rows: sha256 equal)"
    ) in result.output


def _madlad_online(families, tmp_path, fetch: bool) -> tuple[dict, str, Path, Path]:
    """A MADLAD-style shard of several MiB on the local Hub, a `take` of it scored online.

    Returns the online results, the shard's name and local root, and the Hub home (holding
    the whole shard when `fetch`: what `hf download` leaves for offline runs).
    """
    import random

    rng = random.Random(0)
    # Random hex barely compresses: a shard of several MiB, of which a take needs a few %.
    texts = [" ".join(f"{rng.getrandbits(32):08x}" for _ in range(44)) for _ in range(12000)]
    root = published.madlad(tmp_path / "madlad", {"en": texts})
    name = "data/en/en_clean_0000.jsonl.gz"
    size = (root / name).stat().st_size
    home = tmp_path / "home"
    with FakeHub() as hub:
        hub.add_dataset("test/madlad", root, "d" * 40)
        env = _env(hub.endpoint, home)
        task = f"ppl:hub:test/madlad:files={name},skip=200,take=30"
        out = tmp_path / "on.json"
        result = run_surgery(
            "eval", families("llama")["base"], "-t", task, "--out", out, *ARGS, env=env
        )
        assert result.returncode == 0, result.stderr
        streamed = hub.state.bytes_served("datasets/test/madlad", name)
        assert 0 < streamed < size / 10, (streamed, size)
        if fetch:
            _hf_download(env, "test/madlad", name)
    return json.loads(out.read_text(encoding="utf-8")), name, root, home


def test_madlad_take_streams_a_prefix(families, tmp_path):
    online, _, _, _ = _madlad_online(families, tmp_path, fetch=False)
    assert online["config"]["tasks"]["ppl"]["commit"] == "d" * 40


@pytest.mark.slow  # three model runs in subprocesses: about 30 s
def test_madlad_take_offline_reads_the_cached_file_as_online(families, tmp_path):
    online, name, root, home = _madlad_online(families, tmp_path, fetch=True)
    base = families("llama")["base"]
    offline = {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    outs = {"on": online}
    for label, task in (
        ("off", f"ppl:hub:test/madlad:files={name},skip=200,take=30"),
        ("local", f"ppl:{root / name}:skip=200,take=30,lang=en"),
    ):
        out = tmp_path / f"{label}.json"
        result = run_surgery("eval", base, "-t", task, "--out", out, *ARGS, env=offline)
        assert result.returncode == 0, result.stderr
        outs[label] = json.loads(out.read_text(encoding="utf-8"))
    assert outs["on"]["metrics"] == outs["off"]["metrics"] == outs["local"]["metrics"]


def test_train_reads_a_hub_dataset_from_the_cache_offline(tmp_path):
    import subprocess
    import sys

    texts = ["first document", "  ", "second document"]
    root = tmp_path / "text"
    (root / "data/en").mkdir(parents=True)
    (root / "data/en/train.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8"
    )
    published.write_card(root, {"en": {"train": "data/en/*.jsonl"}})
    home = tmp_path / "home"
    with FakeHub() as hub:
        hub.add_dataset("test/text", root, "e" * 40)
        _hf_download(_env(hub.endpoint, home), "test/text", "data/en/*", "README.md")
    code = (
        "import json\nfrom train.sources import parse_data_source\n"
        "from train.data import check_source, iter_documents\n"
        "source = parse_data_source('en=hub:test/text#en@train@main:1.0')\n"
        "check_source(source)\nprint(json.dumps(list(iter_documents(source))))\n"
    )
    env = {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parents[1]), **env},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["first document", "second document"]


def test_a_flores_language_the_card_names_but_the_cache_lacks_is_no_missing_unit(repos):
    """Offline the file list is the cache's: a language FLORES+'s card names whose file was not
    fetched is an error saying so, not a language the dataset lacks (which a suite may skip)."""
    from eval.errors import EvalDataError, MissingDataError
    from eval.kinds.flores import _no_file

    card = (repos / "flores/README.md").read_text(encoding="utf-8")
    files = ["README.md", "devtest/eng_Latn.parquet"]
    with pytest.raises(EvalDataError, match="devtest/ind_Latn is not in the Hub cache") as caught:
        _no_file("test/flores_plus", files, card, "devtest", "ind_Latn")
    assert not isinstance(caught.value, MissingDataError)
    with pytest.raises(MissingDataError, match="no fra_Latn file; languages nearby: eng_Latn"):
        _no_file("test/flores_plus", files, card, "devtest", "fra_Latn")

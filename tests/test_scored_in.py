"""The device and dtype that scored a model: recorded (never null), checked on a resume and by
`surgery compare`, and read as "unknown" from results written before they were recorded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import cli
from eval.study import results as res
from eval.study.runner import SuiteRun
from tests.support.suite_data import write_suite_data

LANGS = ("ces_Latn", "deu_Latn")
SUITE = """\
families:
  slavic: {held_in: [ces_Latn], held_out: []}
  germanic: {held_in: [deu_Latn], held_out: []}
tasks:
  piqa: {path: "global_piqa/{lang}.jsonl", shots: 1}
root: data/
"""
ARGS = ("--limit", "2", "--batch-size", "4", "-q")


def run(*argv):
    return CliRunner().invoke(cli, [str(a) for a in argv])


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _settings(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text(encoding="utf-8"))["settings"]


def _edit_settings(folder: Path, change) -> None:
    """Rewrite results.json with `change(settings)` applied."""
    path = folder / "results.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data["settings"])
    path.write_text(json.dumps(data, sort_keys=True, indent=1) + "\n", encoding="utf-8")


def _legacy(folder: Path) -> None:
    """results.json as written before the device and dtype were recorded."""

    def unrecorded(settings: dict) -> None:
        del settings["device"]
        settings["eval_dtype"] = None

    _edit_settings(folder, unrecorded)


def _on_gpu(folder: Path) -> None:
    _edit_settings(folder, lambda settings: settings.update(device="cuda"))


@pytest.fixture(scope="module")
def study(tmp_path_factory, families):
    """The data of two languages, a suite of Global-PIQA, and `eval --suite` of the base (cpu, the
    default dtype) and of the trained model in bf16."""
    root = tmp_path_factory.mktemp("scored_in")
    write_suite_data(root / "data", LANGS)
    (root / "suite.yml").write_text(SUITE, encoding="utf-8")
    llama = families("llama")
    suite = root / "suite.yml"
    for name, model, extra in (
        ("base", llama["base"], ()),
        ("bf16", llama["trained"], ("--eval-dtype", "bf16")),
    ):
        result = run("eval", model, "--suite", suite, "-o", root / name, *ARGS, *extra)
        assert result.exit_code == 0, result.output
    return root, llama


def test_results_record_the_device_and_the_resolved_dtype(study):
    root, _llama = study
    assert _settings(root / "base")["device"] == "cpu"
    assert _settings(root / "base")["eval_dtype"] == "float32"  # the default on cpu, resolved
    assert _settings(root / "bf16")["eval_dtype"] == "bfloat16"
    saved = res.read_results(root / "base")
    assert (saved.device, saved.dtype) == ("cpu", "float32")


@pytest.mark.parametrize(
    ("device", "dtype", "recorded"),
    [
        ("cpu", None, ("cpu", "float32")),
        ("cuda", None, ("cuda", "bfloat16")),  # as the demo asks on a GPU: bf16 by default
        ("cuda:1", "fp16", ("cuda", "float16")),
        ("cpu", "bfloat16", ("cpu", "bfloat16")),
    ],
)
def test_settings_resolve_the_default_dtype_without_a_model(device, dtype, recorded):
    settings = SuiteRun(device=device, dtype=dtype).settings()
    assert (settings["device"], settings["eval_dtype"]) == recorded


def test_eval_json_records_the_device_and_dtype_used(study, tmp_path):
    root, llama = study
    out = tmp_path / "one.json"
    task = f"piqa:{root}/data/global_piqa/ces_Latn.jsonl:shots=1"
    result = run("eval", llama["base"], "-t", task, "-o", out, *ARGS)
    assert result.exit_code == 0, result.output
    config = json.loads(out.read_text())["config"]
    assert (config["device"], config["dtype"]) == ("cpu", "float32")


def test_a_resume_in_another_dtype_is_refused_and_the_same_dtype_named_otherwise_resumes(
    study, tmp_path
):
    root, llama = study
    folder = tmp_path / "base"
    shutil.copytree(root / "base", folder)
    before = _files(folder)
    argv = ["eval", llama["base"], "--suite", root / "suite.yml", "-o", folder, *ARGS]
    result = run(*argv, "--eval-dtype", "bf16")
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "another dtype (eval_dtype float32 there, eval_dtype bfloat16 now)" in result.output
    # fp32 named is the default resolved: the same dtype, the finished folder is left as it is.
    assert run(*argv, "--eval-dtype", "fp32").exit_code == 0
    assert _files(folder) == before


def test_a_resume_on_results_of_an_unknown_dtype_is_refused(study, tmp_path, monkeypatch):
    import eval.model_loading

    root, llama = study
    folder = tmp_path / "old"
    shutil.copytree(root / "base", folder)
    _legacy(folder)
    assert res.read_results(folder).dtype == res.UNKNOWN
    before = _files(folder)

    def no_model(*args, **kwargs):
        raise AssertionError("the model must not load")

    monkeypatch.setattr(eval.model_loading, "load_model", no_model)
    result = run("eval", llama["base"], "--suite", root / "suite.yml", "-o", folder, *ARGS)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "another dtype (eval_dtype unknown there, eval_dtype float32 now)" in result.output
    assert _files(folder) == before


def test_a_resume_on_another_device_is_refused(study, tmp_path):
    root, llama = study
    folder = tmp_path / "gpu"
    shutil.copytree(root / "base", folder)
    _on_gpu(folder)
    before = _files(folder)
    result = run("eval", llama["base"], "--suite", root / "suite.yml", "-o", folder, *ARGS)
    assert result.exit_code == 2, result.output
    assert "another device (device cuda there, device cpu now)" in result.output
    assert _files(folder) == before


def _compare(base: Path, other: Path, out: Path):
    return run("compare", other, "--base", base, "-o", out, "--resamples", 20, "--jobs", 1, "-q")


def test_compare_refuses_two_dtypes(study, tmp_path):
    root, _llama = study
    out = tmp_path / "report"
    result = _compare(root / "base", root / "bf16", out)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and 'settings.eval_dtype is "bfloat16", not "float32"' in lines[0]
    assert not out.exists()


def test_compare_records_devices_and_accepts_a_mix(study, tmp_path):
    root, _llama = study
    gpu = tmp_path / "gpu"
    shutil.copytree(root / "base", gpu)
    _on_gpu(gpu)
    result = _compare(root / "base", gpu, tmp_path / "report")
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr
    inputs = json.loads((tmp_path / "report/comparison.json").read_text())["inputs"]
    assert [(i["device"], i["dtype"]) for i in inputs] == [("cpu", "float32"), ("cuda", "float32")]


@pytest.mark.parametrize("old", ["base", "other", "both"])
def test_compare_warns_once_about_an_unknown_dtype_and_goes_on(study, tmp_path, old):
    root, _llama = study
    folders = {}
    for name in ("base", "other"):
        folders[name] = tmp_path / name
        shutil.copytree(root / "base", folders[name])
        if old in (name, "both"):
            _legacy(folders[name])
    result = _compare(folders["base"], folders["other"], tmp_path / "report")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning")]
    assert len(warnings) == 1 and "dtype unknown" in warnings[0], result.stderr
    unknown = [str(folders[name]) for name in ("base", "other") if old in (name, "both")]
    assert warnings[0].startswith(f"warning: {', '.join(unknown)}: dtype unknown")
    inputs = json.loads((tmp_path / "report/comparison.json").read_text())["inputs"]
    expected = [
        ("unknown", "unknown") if old in (name, "both") else ("cpu", "float32")
        for name in ("base", "other")
    ]
    assert [(i["device"], i["dtype"]) for i in inputs] == expected

"""Outputs that refactors must leave byte-identical, checked against recorded sha256 digests.

On tiny seeded Llama checkpoints (the session's `families("llama")`) this runs, through the
command line: revert, soup, interpolate, merge (a linear and a TIES config), `eval --suite` of
the base and of the trained model on a small suite of every built-in kind, and `compare` of the
two. Each output file's sha256 is compared with tests/data/outputs_unchanged.json:

- checkpoints: every tensor file (its header included), the shard index, config.json,
  surgery_recipe.json and mergekit_config.yml (README.md, the model card, is prose: left out);
- a suite eval: results.json and every samples file;
- compare: comparison.csv and comparison.json (report.md and the plots are left out).

Before hashing, text is normalized: the test's temporary folder becomes ``<ROOT>`` and the
toolkit's version ``<VERSION>``; JSON fields added after the digests were recorded and allowed
to differ are dropped (`ADDED_FIELDS`: results.json's device, dtype and threads, comparison.json's
inputs). A scoring change, a renamed key, a reordered unit or one more tensor byte fails.

The digests hold for one platform: a float32 forward rounds differently on another CPU or torch
(tests/support/tolerances.py), so the eval and compare digests are only comparable where the
recorded platform (torch and transformers versions, CPU capability) matches; elsewhere the test
skips and says why. To record the digests, run the code whose outputs are the reference:

    SURGERY_REGEN_GOLDEN=1 python -m pytest tests/test_outputs_unchanged.py

Only the commit before a refactor may regenerate them; a refactor that needs new digests has
changed an output.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from click.testing import CliRunner

from cli import cli
from tests.support.suite_data import write_suite_data

GOLDEN = Path(__file__).parent / "data" / "outputs_unchanged.json"
REGEN = os.environ.get("SURGERY_REGEN_GOLDEN") == "1"

# Fields a later version may add (results.json's settings, comparison.json's top level): dropped
# wherever they appear before hashing, so the digests say "the same apart from these".
ADDED_FIELDS = {
    "results.json": ("device", "dtype", "eval_dtype", "threads"),
    "comparison.json": ("inputs", "devices", "dtypes"),
    "surgery_recipe.json": ("threads",),  # the writer's threads, beside the shards' hashes
}
# How each writer indents the JSON files above (the rewrite must give its bytes back).
INDENTS = {"surgery_recipe.json": 2}

SUITE = """\
families:
  slavic: {held_in: [ces_Latn], held_out: [slk_Latn]}
  germanic: {held_in: [deu_Latn], held_out: [nld_Latn]}
tasks:
  ppl: {path: "madlad/{lang2}/"}
  belebele: {path: "belebele/{lang}.jsonl", shots: 1}
  piqa: {path: "global_piqa/{lang}.jsonl", shots: 1}
  flores: {dir: "flores_plus/", directions: ["eng_Latn-{lang}"], shots: 1, max_new_tokens: 3}
  copain: {n: 3, shots: 1, max_new_tokens: 2}
root: data/
"""
LANGS = ("ces_Latn", "slk_Latn", "deu_Latn", "nld_Latn")
EVAL_ARGS = ("--limit", "2", "-q")  # spellings no refactor renames
COMPARE_ARGS = ("--resamples", "200", "--seed", "3", "--jobs", "1", "-q")


def _platform() -> dict[str, str]:
    """What the float digests depend on besides the code."""
    return {
        # Without the build's local tag (+cpu, +cu128): their CPU kernels are one source.
        "torch": torch.__version__.split("+")[0],
        "transformers": importlib.metadata.version("transformers"),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
    }


def _merge_configs(llama: dict, root: Path) -> dict[str, Path]:
    experts = [str(path) for path in llama["experts"][:2]]
    linear = {
        "merge_method": "linear",
        "dtype": "float32",
        "out_dtype": "bfloat16",
        "models": [
            {"model": experts[0], "parameters": {"weight": 0.6}},
            {"model": experts[1], "parameters": {"weight": 0.4}},
        ],
    }
    ties = {
        "merge_method": "ties",
        "base_model": str(llama["base"]),
        "dtype": "float32",
        "out_dtype": "bfloat16",
        "models": [
            {"model": experts[0], "parameters": {"weight": 0.5, "density": 0.4}},
            {"model": experts[1], "parameters": {"weight": 0.8, "density": 0.6}},
        ],
    }
    paths = {}
    for name, config in (("linear", linear), ("ties", ties)):
        paths[name] = root / f"{name}.yml"
        paths[name].write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return paths


def _commands(llama: dict, root: Path) -> list[tuple[str, list[Any]]]:
    """(output name, surgery argv), in order; outputs are folders under root."""
    base, trained = llama["base"], llama["trained"]
    experts = llama["experts"][:2]
    merges = _merge_configs(llama, root)
    suite = root / "suite.yml"
    compared = [root / "compare", *COMPARE_ARGS]
    return [
        ("revert", ["revert", "--layers", "1:3", base, trained, root / "revert"]),
        ("soup", ["soup", *experts, "--weights", "2,1", root / "soup"]),
        (
            "interpolate",
            ["interpolate", "--alpha", "1:3=0.3,*=0.8", base, trained, root / "interp"],
        ),
        ("merge-linear", ["merge", merges["linear"], root / "merge-linear"]),
        ("merge-ties", ["merge", merges["ties"], root / "merge-ties"]),
        ("eval-base", ["eval", base, "--suite", suite, "-o", root / "eval-base", *EVAL_ARGS]),
        (
            "eval-trained",
            ["eval", trained, "--suite", suite, "-o", root / "eval-trained", *EVAL_ARGS],
        ),
        (
            "compare",
            ["compare", root / "eval-trained", "--base", root / "eval-base", "-o", *compared],
        ),
    ]


OUTPUT_FOLDERS = {"interpolate": "interp"}
HASHED = re.compile(
    r"(.*\.safetensors|model\.safetensors\.index\.json|config\.json|surgery_recipe\.json"
    r"|mergekit_config\.yml|results\.json|samples/.*\.jsonl|comparison\.(csv|json))"
)


def _drop(value: Any, keys: tuple[str, ...]) -> Any:
    """`value` without `keys` in any of its objects, recursively."""
    if isinstance(value, dict):
        return {k: _drop(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [_drop(v, keys) for v in value]
    return value


def _normalized(path: Path, root: Path, roots: tuple[str, ...]) -> bytes:
    """The file's bytes as hashed: binary files as they are; text with the test's folders as
    ``<ROOT>``, the toolkit's version as ``<VERSION>`` and `ADDED_FIELDS` dropped (the JSON
    rewritten as the writers write it, `INDENTS`)."""
    data = path.read_bytes()
    if path.suffix == ".safetensors":
        return data
    text = data.decode("utf-8")
    for folder in roots:
        text = text.replace(folder, "<ROOT>")
    version = importlib.metadata.version("checkpoint-surgery")
    text = text.replace(f'"version": "{version}"', '"version": "<VERSION>"')
    added = ADDED_FIELDS.get(path.name)
    if added:
        value = _drop(json.loads(text), added)
        ending = "\n" if text.endswith("\n") else ""
        indent = INDENTS.get(path.name, 1)
        text = json.dumps(value, sort_keys=True, indent=indent, ensure_ascii=False) + ending
    return text.encode("utf-8")


def _digests(folder: Path, root: Path, roots: tuple[str, ...]) -> dict[str, str]:
    found = {}
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if path.is_file() and HASHED.fullmatch(name):
            found[name] = hashlib.sha256(_normalized(path, root, roots)).hexdigest()
    return found


def _run_all(families, root: Path) -> dict[str, dict[str, str]]:
    llama = families("llama")
    write_suite_data(root / "data", LANGS)
    (root / "suite.yml").write_text(SUITE, encoding="utf-8")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one rounding order, whatever the machine's cores
    try:
        for name, argv in _commands(llama, root):
            # One thread by the commands' own rule too (they apply SURGERY_THREADS when run).
            result = CliRunner().invoke(cli, [str(a) for a in argv], env={"SURGERY_THREADS": "1"})
            assert result.exit_code == 0, (name, result.output, result.exception)
    finally:
        torch.set_num_threads(threads)
    family_root = Path(llama["base"]).parent
    roots = (str(root), str(family_root))
    return {
        name: _digests(root / OUTPUT_FOLDERS.get(name, name), root, roots)
        for name, _ in _commands(llama, root)
    }


@pytest.fixture(scope="module")
def digests(families, tmp_path_factory) -> dict[str, dict[str, str]]:
    return _run_all(families, tmp_path_factory.mktemp("unchanged"))


def test_outputs_are_byte_identical_to_the_recorded_digests(digests):
    if REGEN:
        record = {"platform": _platform(), "outputs": digests}
        GOLDEN.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        pytest.skip(f"recorded {GOLDEN}")
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    if golden["platform"] != _platform():
        pytest.skip(f"digests recorded on {golden['platform']}, this is {_platform()}")
    assert set(digests) == set(golden["outputs"])
    for name, files in golden["outputs"].items():
        assert digests[name] == files, name


def test_every_command_wrote_what_is_hashed(digests):
    """The digests cover real files: tensors in every checkpoint, every suite unit's samples,
    both comparison files."""
    for name in ("revert", "soup", "interpolate", "merge-linear", "merge-ties"):
        assert any(f.endswith(".safetensors") for f in digests[name]), name
        assert {"config.json", "surgery_recipe.json", "mergekit_config.yml"} <= set(digests[name])
    assert "model.safetensors.index.json" in digests["revert"]  # the inputs' three shards
    for name in ("eval-base", "eval-trained"):
        samples = [f for f in digests[name] if f.startswith("samples/")]
        assert "results.json" in digests[name] and len(samples) == 4 * 4 + 1
    assert set(digests["compare"]) == {"comparison.csv", "comparison.json"}
    assert digests["eval-base"]["results.json"] != digests["eval-trained"]["results.json"]

"""A suite's results folder: ``DIR/results.json`` and one ``DIR/samples/<unit>.jsonl`` per unit.

The format is the contract between the suite runner and the comparison (both read and write it
through this module only). results.json is UTF-8 JSON with sorted keys and indent 1, with no NaN
(null where a value is undefined), so the same run gives the same bytes. Every write replaces
its file atomically (a temporary file, then `os.replace`), so a run killed at any moment leaves
either the old file or the new one, never half of one: that is what makes a run resumable.

This module imports neither torch nor transformers.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eval.data import text_sha256
from eval.errors import SuiteError

FORMAT = "surgery-suite-results/1"
RESULTS_FILE = "results.json"
SAMPLES_DIR = "samples"
# The settings naming the device (its kind: cpu, cuda) and dtype the units were scored in, and
# what they read as in a results.json written before they were recorded (null or absent).
DEVICE, DTYPE = "device", "eval_dtype"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class ModelInfo:
    """The model a results folder scores: the path as given, its name and Hub revision."""

    path: str
    name: str
    revision: str | None = None


@dataclass(frozen=True)
class DataRef:
    """The data a unit read: a file or folder (or ``hub:ID...``) and the sha256 of its contents;
    for a Hub dataset also its id, config, split and the commit read (None otherwise, and then
    left out of results.json)."""

    path: str
    sha256: str
    dataset: str | None = None
    config: str | None = None
    split: str | None = None
    commit: str | None = None


@dataclass(frozen=True)
class UnitResult:
    """One scored (task, language[, direction][, few-shot seed]) unit and its metrics."""

    id: str
    task: str
    kind: str
    variant: str | None
    lang: str | None
    family: str | None
    split: str | None
    fewshot_seed: int | None
    metrics: dict[str, Any]
    samples: str
    data: DataRef | None


@dataclass(frozen=True)
class MissingUnit:
    """A unit skipped by ``--allow-missing``: its task, language and the path that was absent."""

    task: str
    lang: str | None
    path: str


@dataclass(frozen=True)
class SuiteResults:
    """A results folder as read (or about to be written)."""

    model: ModelInfo
    suite: dict[str, Any]
    suite_sha256: str
    settings: dict[str, Any]
    units: tuple[UnitResult, ...]
    missing: tuple[MissingUnit, ...]
    complete: bool
    # torch's CPU threads while the units were scored (the thread rule's choice); not a
    # setting: thread counts change scores by float rounding at most.
    threads: int | None = None
    format: str = FORMAT

    @property
    def device(self) -> str:
        """The kind of device that scored the units (cpu, cuda), or `UNKNOWN`."""
        return self.settings.get(DEVICE) or UNKNOWN

    @property
    def dtype(self) -> str:
        """The dtype the units were scored in (float32, bfloat16, float16), or `UNKNOWN`."""
        return self.settings.get(DTYPE) or UNKNOWN

    def unit(self, unit_id: str) -> UnitResult:
        """The unit with this id.

        Raises:
            KeyError: no such unit.
        """
        for unit in self.units:
            if unit.id == unit_id:
                return unit
        raise KeyError(unit_id)


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 text: the form hashed for `suite_sha256`."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def suite_sha256(suite: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a normalized suite."""
    return text_sha256(canonical_json(suite))


def samples_name(unit_id: str) -> str:
    """The samples file of a unit, relative to DIR: ``samples/<id, '/' as '__'>.jsonl``."""
    return f"{SAMPLES_DIR}/{unit_id.replace('/', '__')}.jsonl"


def _clean(value: Any) -> Any:
    """NaN and infinities as null (JSON has neither), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _clean(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(item) for item in value]
    return value


def replace_text(path: Path, text: str) -> None:
    """Atomically replace `path` with `text`. The partial file is named for this process and
    thread, so two writers of one file (search workers) never rename each other's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def to_json(results: SuiteResults) -> str:
    """results.json's text: sorted keys, indent 1, NaN as null, a final newline."""
    data = _clean(asdict(results))
    for unit in data["units"]:  # a local unit's data names no dataset, config, split or commit
        if unit["data"] is not None and unit["data"]["dataset"] is None:
            unit["data"] = {"path": unit["data"]["path"], "sha256": unit["data"]["sha256"]}
    return json.dumps(data, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def write_results(directory: Path, results: SuiteResults) -> None:
    """Write (atomically replace) ``directory/results.json``."""
    replace_text(Path(directory) / RESULTS_FILE, to_json(results))


def write_samples(directory: Path, unit_id: str, records: Iterable[dict[str, Any]]) -> str:
    """Write (atomically replace) a unit's samples file; returns its name relative to DIR."""
    name = samples_name(unit_id)
    lines = [json.dumps(_clean(r), ensure_ascii=False, allow_nan=False) + "\n" for r in records]
    replace_text(Path(directory) / name, "".join(lines))
    return name


def read_results(directory: Path) -> SuiteResults:
    """Read a results folder's results.json into typed values.

    Raises:
        SuiteError: no results.json, not JSON, another format, or a field missing.
    """
    path = Path(directory) / RESULTS_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SuiteError(f"{path}: no such file (not a suite results folder)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SuiteError(f"{path}: unreadable: {error}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise SuiteError(f"{path}: format {found!r}, expected {FORMAT!r}")
    try:
        return SuiteResults(
            model=ModelInfo(**data["model"]),
            suite=data["suite"],
            suite_sha256=data["suite_sha256"],
            settings=data["settings"],
            units=tuple(_unit(u) for u in data["units"]),
            missing=tuple(MissingUnit(**m) for m in data["missing"]),
            complete=data["complete"],
            threads=data.get("threads"),
        )
    except (KeyError, TypeError) as error:
        raise SuiteError(f"{path}: malformed ({type(error).__name__}: {error})") from None


def _unit(data: dict[str, Any]) -> UnitResult:
    ref = data["data"]
    return UnitResult(**{**data, "data": DataRef(**ref) if ref is not None else None})


def read_samples(directory: Path, unit: UnitResult) -> list[dict[str, Any]]:
    """A unit's samples: one dict per scored item, in scoring order.

    Raises:
        SuiteError: the file is missing or a line is not JSON.
    """
    path = Path(directory) / unit.samples
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise SuiteError(f"{path}: no such file (samples of unit {unit.id})") from None
    try:
        return [json.loads(line) for line in lines if line]
    except json.JSONDecodeError as error:
        raise SuiteError(f"{path}: not JSON lines: {error}") from None

"""`surgery compare`: strategies against a base, item by item, with paired bootstrap intervals.

Values per (model, task[+variant], language); per family the unweighted mean over its held-in
languages and, separately, over its held-out ones; overall the unweighted mean over families of
those family means (a macro of macros). Each language's items are resampled B times by a count
matrix shared by every model (the paired bootstrap); family and overall values are recomputed
on every resample from all their languages' resamples at once, so their intervals reflect every
language's sampling noise. Results must come from the same suite, settings, data and prompts:
anything else is refused with a line naming the difference.
"""

from __future__ import annotations

import json
import os
import signal
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eval.errors import CompareError
from eval.study.formatting import ALL_DIRECTIONS
from eval.study.measures import RATIO_METRICS, Measure, measure_for, primary_metric
from eval.study.outputs import translation_outputs
from eval.study.results import (
    DTYPE,
    UNKNOWN,
    SuiteResults,
    UnitResult,
    read_results,
    read_samples,
)
from eval.study.stats import (
    ALPHA,
    MIN_ITEMS,
    adjust_bh,
    bootstrap_p,
    cell_rng,
    percentile_interval,
    resampled_sums,
    sign_test,
    smallest_sign_test_p,
)
from eval.study.tokenizer_id import refuse_token_metrics

# Settings that change what is scored (batch size does not): the items (one half of them, by
# its split seed), their prompts and the precision they are scored in. An unknown dtype (results
# written before it was recorded) is compared with a warning; the device is recorded, never
# refused: a CPU and a GPU score the same items in one dtype alike, but for rounding.
SCORED_SETTINGS = (
    "seed",
    "limit",
    "max_length",
    "fewshot_seeds",
    DTYPE,
    "half",
    "split_seed",
)

# The split of a language in no family (the suite's `others:`): what a strategy forgets.
OTHERS = "others"

WEIGHTING = {
    "language": "all items of the language count equally: accuracy is the mean of per-item "
    "outcomes, perplexity-type metrics exp(-sum loglik / sum tokens|words|bytes) over "
    "documents, chrF the corpus chrF of summed sentence statistics; with several few-shot "
    "seeds, the mean over seeds (± their population std)",
    "family": "unweighted mean over the family's held-in (or held-out) languages",
    "overall": "unweighted mean over families of the family means (a macro of macros: each "
    "family counts once, whatever its number of languages)",
    "others": "unweighted mean over the suite's `others:` languages (in no family): what a "
    "strategy costs on languages it was not trained on and that are not its relatives",
    "task": "a task without languages (e.g. copain): all its items count equally",
}
# How the `ALL_DIRECTIONS` axis weighs, said where a comparison has one.
DIRECTIONS_WEIGHTING = (
    f"a task scored in several directions (flores) has an axis per direction and one named "
    f"`{ALL_DIRECTIONS}`, whose language value is the unweighted mean over the language's "
    "directions (its families and overall as on any axis)"
)


def weighting(comparison: Comparison) -> dict[str, str]:
    """`WEIGHTING`, with `directions` where the comparison has an `ALL_DIRECTIONS` axis."""
    if any(axis["variant"] == ALL_DIRECTIONS for axis in comparison.axes):
        return {**WEIGHTING, "directions": DIRECTIONS_WEIGHTING}
    return WEIGHTING


@dataclass
class Run:
    """One results folder: its path, its results.json and the name its rows carry; or a model
    scored in memory (`eval.study.memory`), whose per-unit samples are held in `samples`."""

    folder: Path
    results: SuiteResults
    name: str
    samples: dict[str, list[dict[str, Any]]] | None = None  # unit id -> lines, in memory

    def lines(self, unit_id: str) -> list[dict[str, Any]]:
        """A unit's samples lines, from memory or from the folder."""
        if self.samples is not None:
            return self.samples[unit_id]
        return read_samples(self.folder, self.results.unit(unit_id))


@dataclass(frozen=True)
class Cell:
    """One (task, variant, language) with its units, one per few-shot seed."""

    task: str
    kind: str
    variant: str | None
    lang: str | None
    family: str | None
    split: str | None
    units: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.task}|{self.variant}|{self.lang}"


@dataclass
class CellResult:
    """A cell's metrics: point values per (model, seed) and resampled values per model."""

    n: int
    higher: dict[str, bool]
    scale: str
    primary: str
    point: dict[str, np.ndarray]  # metric -> (models, seeds)
    boot: dict[str, np.ndarray]  # metric -> (resamples, models), mean over seeds


@dataclass
class Comparison:
    """Everything the report writes: long-format rows, sign tests and the run's settings."""

    base: str
    models: list[str]
    folders: list[str]
    resamples: int
    seed: int
    families: list[str]
    axes: list[dict[str, Any]]
    rows: list[dict[str, Any]] = field(default_factory=list)
    sign_tests: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # metrics left out, and why
    # Units whose rows are the same (sha256) but read at another commit of their Hub dataset.
    warnings: list[str] = field(default_factory=list)
    # Translation outputs per model (`eval.study.outputs`): stops, empty outputs, lengths.
    outputs: list[dict[str, Any]] = field(default_factory=list)
    # Per model, in order: its name and the device and dtype that scored it.
    inputs: list[dict[str, str]] = field(default_factory=list)


def _first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The dotted path of the first place two JSON values differ, with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            where = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:
                return f"{where} is {'missing' if key in a else 'not in the base'}"
            found = _first_difference(a[key], b[key], where)
            if found:
                return found
        return None
    if a != b:
        return f"{path or 'value'} is {json.dumps(b)}, not {json.dumps(a)}"
    return None


def load_runs(base: Path, others: list[Path]) -> list[Run]:
    """Read the base's and the strategies' results folders and check they are comparable.

    Raises:
        CompareError: a folder that is not complete results, or that differs from the base in
            suite, scored settings, units or data (the message names the difference).
    """
    folders = [Path(base)] + [Path(p) for p in others if Path(p).resolve() != Path(base).resolve()]
    if len(folders) < 2:
        raise CompareError("give at least one results folder besides --base")
    runs = [Run(f, read_results(f), "") for f in folders]
    for run in runs:
        if not run.results.complete:
            raise CompareError(
                f"{run.folder}: incomplete results (rerun `surgery eval --suite` on it to finish)"
            )
    reference = runs[0]
    for run in runs[1:]:
        _check_same(reference, run)
    names = [run.results.model.name or run.folder.name for run in runs]
    if len(set(names)) < len(names):  # same model name twice: the folders tell them apart
        names = [run.folder.name for run in runs]
    if len(set(names)) < len(names):
        names = [str(run.folder) for run in runs]
    for run, name in zip(runs, names, strict=True):
        run.name = name
    return runs


def _check_same(base: Run, run: Run) -> None:
    where = f"{run.folder} differs from the base {base.folder}"
    difference = _first_difference(base.results.suite, run.results.suite, "suite")
    if difference:
        raise CompareError(f"{where}: {difference}")
    settings = [base.results.settings, run.results.settings]
    for key in SCORED_SETTINGS:
        if key == DTYPE and UNKNOWN in (base.results.dtype, run.results.dtype):
            continue  # said once by `dtype_warnings`
        if settings[0].get(key) != settings[1].get(key):
            raise CompareError(
                f"{where}: settings.{key} is {json.dumps(settings[1].get(key))}, "
                f"not {json.dumps(settings[0].get(key))}"
            )
    units = [{u.id: u for u in r.results.units} for r in (base, run)]
    for unit_id in sorted(set(units[0]) ^ set(units[1])):
        side = f"the base {base.folder}" if unit_id in units[0] else str(run.folder)
        raise CompareError(f"{where}: unit {unit_id} is only in {side}")
    for unit_id, unit in units[0].items():
        digests = [u.data.sha256 if u.data else None for u in (unit, units[1][unit_id])]
        if digests[0] != digests[1]:
            raise CompareError(f"{where}: unit {unit_id} read other data (sha256 differs)")


def commit_warnings(runs: list[Run]) -> list[str]:
    """One line per unit whose rows match the base's (sha256) but came from another commit of
    its Hub dataset: the same items, so the comparison stands, but worth knowing."""
    base = {unit.id: unit for unit in runs[0].results.units}
    lines = []
    for run in runs[1:]:
        for unit in run.results.units:
            ours, theirs = unit.data, base[unit.id].data
            if ours and theirs and ours.commit != theirs.commit:
                lines.append(
                    f"{run.folder}: unit {unit.id} read {ours.dataset} at commit {ours.commit}, "
                    f"the base at {theirs.commit} (same rows: sha256 equal)"
                )
    return lines


def dtype_warnings(runs: list[Run]) -> list[str]:
    """One line naming the folders whose results.json does not say which dtype scored them
    (written before it was recorded): compared as they are, unchecked."""
    unknown = [str(run.folder) for run in runs if run.results.dtype == UNKNOWN]
    if not unknown:
        return []
    return [
        f"{', '.join(unknown)}: dtype unknown (results.json written before the dtype was "
        "recorded); compared without checking that every model was scored in one dtype"
    ]


def inputs_of(runs: list[Run]) -> list[dict[str, str]]:
    """Each run's name and the device and dtype that scored it (`UNKNOWN` where not recorded)."""
    return [
        {"model": run.name, "device": run.results.device, "dtype": run.results.dtype}
        for run in runs
    ]


def cells_of(results: SuiteResults) -> list[Cell]:
    """Group a results file's units into cells, in the order of the units."""
    groups: dict[tuple, list[UnitResult]] = {}
    for unit in results.units:
        # A language scored on several configs of its dataset (regional variants): a cell each.
        lang = unit.lang
        config = unit.data.config if unit.data else None
        if lang and config and unit.id.split("/seed=")[0] == f"{unit.task}/{lang}/{config}":
            lang = f"{lang}/{config}"
        groups.setdefault((unit.task, unit.kind, unit.variant, lang), []).append(unit)
    cells = []
    for (task, kind, variant, lang), units in groups.items():
        units.sort(key=lambda u: (u.fewshot_seed is not None, u.fewshot_seed or 0))
        family, split = units[0].family, units[0].split
        cells.append(Cell(task, kind, variant, lang, family, split, tuple(u.id for u in units)))
    return cells


def _prompt(line: dict[str, Any]) -> Any:
    """What identifies an item's prompt: `prompt_sha256`, or lm-eval's own `prompt_hash` (its
    sample records, which lm-eval units log, have no `prompt_sha256`)."""
    return line.get("prompt_sha256", line.get("prompt_hash"))


def _aligned(runs: list[Run], cell: Cell) -> list[list[dict[str, Any]]]:
    """Every (model, seed)'s lines in the base's item order, matched by doc_id and prompt.

    Raises:
        CompareError: duplicate doc ids, items only one side has, or a different prompt.
    """
    aligned = []
    order: list[str] | None = None
    for unit_id in cell.units:
        base_lines: dict[str, dict[str, Any]] | None = None
        for run in runs:
            lines = run.lines(unit_id)
            if not all(isinstance(line, dict) and "doc_id" in line for line in lines):
                raise CompareError(f"{run.folder}: unit {unit_id} has samples without a doc_id")
            by_id = {str(line["doc_id"]): line for line in lines}
            if len(by_id) < len(lines):
                raise CompareError(f"{run.folder}: unit {unit_id} repeats a doc_id")
            order = list(by_id) if order is None else order
            unmatched = sorted(set(by_id) ^ set(order))
            if unmatched:
                raise CompareError(
                    f"{run.folder}: unit {unit_id} has other items than the base "
                    f"(doc_id {unmatched[0]})"
                )
            base_lines = by_id if base_lines is None else base_lines
            for doc_id in order:
                if _prompt(by_id[doc_id]) != _prompt(base_lines[doc_id]):
                    raise CompareError(
                        f"{run.folder}: unit {unit_id}, doc_id {doc_id}: the prompt differs "
                        "from the base's (other shots, demonstrations or data)"
                    )
            aligned.append([by_id[d] for d in order])
    return aligned  # seed-major: index seed * models + model


def compute_cell(
    runs: list[Run], cell: Cell, resamples: int, seed: int
) -> tuple[Cell, CellResult | None]:
    """A cell's point values and its paired bootstrap resamples for every model.

    One count matrix C (resamples x items) for all models and seeds, drawn in blocks of rows;
    each metric is applied to C @ statistics, so the base and every strategy are scored on the
    same resampled items.
    """
    lines = _aligned(runs, cell)
    unit = runs[0].results.unit(cell.units[0])
    measure: Measure | None = measure_for(cell.kind, unit, lines[0][0] if lines[0] else {})
    if measure is None or not lines[0]:
        return cell, None
    models, seeds, n = len(runs), len(cell.units), len(lines[0])
    stats = measure.statistics(lines)  # (seeds * models, n, k)
    k = stats.shape[-1]
    flat = stats.transpose(1, 0, 2).reshape(n, seeds * models * k)
    sums = resampled_sums(cell_rng(seed, cell.key), flat, resamples)
    sums = sums.reshape(resamples, seeds, models, k)
    totals = stats.sum(axis=1).reshape(seeds, models, k)
    point, boot = {}, {}
    for name, metric in measure.metrics.items():
        point[name] = metric(totals, n).T  # (models, seeds)
        boot[name] = metric(sums, n).mean(axis=1).astype(np.float32)  # (resamples, models)
    primary = primary_metric(cell.kind, measure)
    return cell, CellResult(n, measure.higher, measure.scale, primary, point, boot)


def _compute_all(
    runs: list[Run], cells: list[Cell], resamples: int, seed: int, jobs: int, progress: bool
) -> list[tuple[Cell, CellResult | None]]:
    from tqdm import tqdm

    bar = tqdm(total=len(cells), desc="compare", unit="cell", disable=not progress, leave=False)
    if jobs <= 1 or len(cells) <= 1:
        results = []
        with bar:
            for cell in cells:
                results.append(compute_cell(runs, cell, resamples, seed))
                bar.update()
        return results
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=_worker_ignores_signals)
    try:
        futures = [pool.submit(compute_cell, runs, cell, resamples, seed) for cell in cells]
        for future in futures:
            future.add_done_callback(lambda _: bar.update())
        return [future.result() for future in futures]
    finally:
        bar.close()
        # On an error or Ctrl-C in this process, cells not started are dropped, not computed.
        pool.shutdown(wait=True, cancel_futures=True)


def _worker_ignores_signals() -> None:
    """Workers leave Ctrl-C (sent to the whole process group) to the parent, which stops."""
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)


def compare(
    base: Path,
    others: list[Path],
    *,
    resamples: int = 10_000,
    seed: int = 0,
    jobs: int = 1,
    progress: bool = False,
) -> Comparison:
    """Compare strategies' results folders against the base's.

    Args:
        base: the base model's `surgery eval --suite` folder.
        others: the strategies' folders.
        resamples: bootstrap resamples B.
        seed: seed of the resamples (recorded in the report).
        jobs: processes that score cells in parallel.
        progress: show a progress bar over the (task, language) cells.

    Returns:
        The comparison, for `eval.study.report` to write.

    Raises:
        CompareError: folders that cannot be compared item by item.
    """
    if resamples < 1:
        raise CompareError(f"--resamples must be at least 1, not {resamples}")
    runs = load_runs(base, others)
    return compare_runs(runs, resamples=resamples, seed=seed, jobs=jobs, progress=progress)


def compare_runs(
    runs: list[Run],
    *,
    resamples: int = 10_000,
    seed: int = 0,
    jobs: int = 1,
    progress: bool = False,
) -> Comparison:
    """`compare` on runs already read and checked (the first is the base; one run alone gives
    its values and no change): the runs of `load_runs`, or models scored in memory.

    Raises:
        CompareError: items that do not match between the runs.
    """
    suite = runs[0].results.suite
    cells = cells_of(runs[0].results)
    results = _compute_all(runs, cells, resamples, seed, max(1, jobs), progress)
    # The order the units were scored in (the suite file's; results.json sorts its keys).
    families = list(dict.fromkeys(cell.family for cell in cells if cell.family))
    families += [f for f in suite.get("families") or {} if f not in families]
    comparison = Comparison(
        base=runs[0].name,
        models=[run.name for run in runs],
        folders=[str(run.folder) for run in runs],
        resamples=resamples,
        seed=seed,
        families=families,
        axes=[],
        skipped=[unit for cell, result in results if result is None for unit in cell.units],
        refused=refuse_token_metrics(runs, results),
        warnings=dtype_warnings(runs) + commit_warnings(runs),
        inputs=inputs_of(runs),
    )
    _aggregate(comparison, [(c, r) for c, r in results if r is not None])
    comparison.outputs = translation_outputs(runs, cells)
    return comparison


def _summary(
    axis: dict[str, Any], point: np.ndarray, boot: np.ndarray, items: int
) -> list[dict[str, Any]]:
    """Per model: value (mean over seeds), seed std, change from the base, its interval and
    bootstrap p, the ratio to the base for perplexities, and whether the change counts.

    `items` is the fewest items of any language (or task) the value rests on: below
    MIN_ITEMS the row is `few_items`, its interval too narrow to trust, and never bold.
    `significant` is the interval's verdict alone (the demo's table and text read it).
    """
    rows = []
    value = point.mean(axis=1)
    few = items < MIN_ITEMS
    base = boot[:, 0].astype(np.float64)
    for m in range(point.shape[0]):
        row = {"value": float(value[m]), "seeds": int(point.shape[1])}
        row["seed_std"] = float(point[m].std()) if point.shape[1] > 1 else None
        row.update(items=items, few_items=few)
        if m:
            changes = boot[:, m].astype(np.float64) - base
            low, high = percentile_interval(changes)
            row.update(delta=float(value[m] - value[0]), ci_low=low, ci_high=high)
            row["significant"] = bool(low > 0 or high < 0)
            row["p"] = bootstrap_p(changes)
        else:
            row.update(delta=None, ci_low=None, ci_high=None, significant=None, p=None)
        row.update(_ratio(axis, value, boot, m))
        rows.append(row)
    return rows


def _ratio(axis: dict[str, Any], value: np.ndarray, boot: np.ndarray, m: int) -> dict[str, Any]:
    """A perplexity's ratio to the base and its interval (None for other metrics and the base):
    perplexities span orders of magnitude, so their changes read as factors."""
    if axis["metric"] not in RATIO_METRICS or not m:
        return dict.fromkeys(("ratio", "ratio_low", "ratio_high"))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = boot[:, m].astype(np.float64) / boot[:, 0]
        low, high = percentile_interval(ratios)
        return {"ratio": float(value[m] / value[0]), "ratio_low": low, "ratio_high": high}


# One language or task: its point values, resampled values and item count.
Member = tuple[np.ndarray, np.ndarray, int]


def _aggregate(comparison: Comparison, results: list[tuple[Cell, CellResult]]) -> None:
    """Fill the comparison's axes, rows (language, family, overall, task), sign tests and the
    Benjamini-Hochberg adjustment over each table's cells."""
    axes: dict[tuple, list[tuple[Cell, CellResult]]] = {}
    for cell, result in results:
        for metric in result.point:
            axes.setdefault((cell.task, cell.variant, metric), []).append((cell, result))
    for (task, variant, metric), members in axes.items():
        first_cell, first = members[0]
        axis = {
            "task": task,
            "variant": variant,
            "metric": metric,
            "kind": first_cell.kind,
            "higher_is_better": first.higher[metric],
            "scale": first.scale,
            "primary": metric == first.primary,
        }
        comparison.axes.append(axis)
        groups: dict[tuple, list[Member]] = {}
        for cell, result in members:
            scope = "language" if cell.lang else "task"
            # A language in no family is one of the suite's `others`: forgetting elsewhere.
            split = cell.split or (OTHERS if cell.lang else None)
            where = {"family": cell.family, "split": split, "lang": cell.lang}
            point, boot = result.point[metric], result.boot[metric]
            _emit(comparison, axis, scope, where, result.n, point, boot, result.n)
            if cell.lang:
                groups.setdefault((cell.family, split), []).append((point, boot, result.n))
        _families_and_overall(comparison, axis, groups)
    _all_directions(comparison, results)
    _adjust(comparison)


def _all_directions(comparison: Comparison, results: list[tuple[Cell, CellResult]]) -> None:
    """For each task with several directions (variants), the `ALL_DIRECTIONS` axis: per language
    the mean of its directions' values and resamples (as the reference's family cell, its
    bootstrap_ci_flores.py, averages both directions), then family, overall and `others` means
    and sign tests as on any axis. Its axes come after all others."""
    tasks: dict[tuple[str, str], list[tuple[Cell, CellResult]]] = {}
    for cell, result in results:
        if cell.variant is not None and cell.lang:
            for metric in result.point:
                tasks.setdefault((cell.task, metric), []).append((cell, result))
    for (task, metric), members in tasks.items():
        if len({cell.variant for cell, _ in members}) < 2:
            continue
        each = next(a for a in comparison.axes if a["task"] == task and a["metric"] == metric)
        axis = {**each, "variant": ALL_DIRECTIONS}
        comparison.axes.append(axis)
        languages: dict[str, list[tuple[Cell, CellResult]]] = {}
        for cell, result in members:
            languages.setdefault(cell.lang, []).append((cell, result))
        groups: dict[tuple, list[Member]] = {}
        for lang, cells in languages.items():
            first = cells[0][0]
            split = first.split or OTHERS
            directions = [(r.point[metric], r.boot[metric], r.n) for _, r in cells]
            mean = _mean(directions)
            where = {"family": first.family, "split": split, "lang": lang}
            _emit(comparison, axis, "language", where, sum(r.n for _, r in cells), *mean)
            groups.setdefault((first.family, split), []).append(mean)
        _families_and_overall(comparison, axis, groups)


def _emit(
    comparison: Comparison,
    axis: dict[str, Any],
    scope: str,
    where: dict[str, Any],
    n: int,
    point: np.ndarray,
    boot: np.ndarray,
    items: int,
) -> None:
    """Add one row per model: `n` is items (language, task) or languages/families averaged,
    `items` the fewest items of a language it rests on."""
    rows = []
    summaries = _summary(axis, point, boot, items)
    for model, summary in zip(comparison.models, summaries, strict=True):
        row = {"model": model, **_axis_key(axis), "scope": scope, **where, "n": n, **summary}
        rows.append(row)
    comparison.rows.extend(rows)


def _axis_key(axis: dict[str, Any]) -> dict[str, Any]:
    return {key: axis[key] for key in ("task", "variant", "metric")}


def _mean(members: list[Member]) -> Member:
    """The unweighted mean of members' values and resamples; the fewest items of any."""
    point = np.mean([p for p, _, _ in members], axis=0)
    boot = np.mean([b.astype(np.float64) for _, b, _ in members], axis=0)
    return point, boot, min(items for _, _, items in members)


def _families_and_overall(comparison: Comparison, axis: dict[str, Any], groups: dict) -> None:
    """Family macros per split, the macro over families, the mean over the suite's `others`
    languages, and the sign tests of each split."""
    for split in ("held_in", "held_out"):
        macros = []
        for family in comparison.families:
            members = groups.get((family, split))
            if not members:
                continue
            mean = _mean(members)
            where = {"family": family, "split": split, "lang": None}
            _emit(comparison, axis, "family", where, len(members), *mean)
            macros.append(mean)
        if not macros:
            continue
        where = {"family": None, "split": split, "lang": None}
        _emit(comparison, axis, "overall", where, len(macros), *_mean(macros))
        for scope, over in (("language", "languages"), ("family", "families")):
            _sign_tests(comparison, axis, split, scope, over)
    others = groups.get((None, OTHERS))
    if others:
        where = {"family": None, "split": OTHERS, "lang": None}
        _emit(comparison, axis, "overall", where, len(others), *_mean(others))
        _sign_tests(comparison, axis, OTHERS, "language", "languages")


def _sign_tests(
    comparison: Comparison, axis: dict[str, Any], split: str, scope: str, over: str
) -> None:
    """Each strategy's sign test over the rows of one scope (languages or families)."""
    key = _axis_key(axis)
    rows = [
        r
        for r in comparison.rows
        if r["scope"] == scope and r["split"] == split and all(r[k] == v for k, v in key.items())
    ]
    for model in comparison.models[1:]:
        changes = [r["delta"] for r in rows if r["model"] == model]
        test = sign_test(changes, axis["higher_is_better"])
        counts = {"wins": test.wins, "losses": test.losses, "ties": test.ties, "p": test.p}
        # With k units and no ties the smallest two-sided p is 2 / 2^k: 0.0625 for 5.
        counts["min_p"] = smallest_sign_test_p(len(changes))
        comparison.sign_tests.append(
            {"model": model, **key, "split": split, "over": over, **counts}
        )


def table_of(row: dict[str, Any]) -> str:
    """Which of the report's tables a row's cell is in: `headline` (overall and family means),
    `language` or `task`; Benjamini-Hochberg adjusts over one metric's table."""
    return "headline" if row["scope"] in ("overall", "family") else row["scope"]


def _adjust(comparison: Comparison) -> None:
    """Benjamini-Hochberg q over the strategies' cells of each table of each metric, and the
    adjusted verdict: the interval excludes 0, q is below ALPHA and the items are enough."""
    tables: dict[tuple, list[dict[str, Any]]] = {}
    for row in comparison.rows:
        if row["p"] is not None:
            key = (row["task"], row["variant"], row["metric"], table_of(row))
            tables.setdefault(key, []).append(row)
        else:
            row.update(q=None, significant_adjusted=None)
    for rows in tables.values():
        for row, q in zip(rows, adjust_bh([r["p"] for r in rows]), strict=True):
            row["q"] = q
            row["significant_adjusted"] = bool(
                row["significant"] and q < ALPHA and not row["few_items"]
            )


def default_jobs() -> int:
    """Processes for `compare` by default: the CPUs this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

"""The honest part of a search: its frontier scored again on items the search never saw.

The frontier is optuna's Pareto front of the complete trials within the budgets (on the search
half). Its points and the baselines are blended again and scored on the report half, beside BASE
and TRAINED, and compared as `surgery compare` compares results folders: paired bootstrap
intervals of each change from BASE and from TRAINED. The report states the gap between each
point's search and report scores (how much choosing on the search half flattered it). DIR gets
frontier.json, frontier.png, report.md, and report/<name>/ results folders that `surgery
compare` reads (`surgery compare DIR/report/point-* --base DIR/report/base -o ...`).
"""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eval.search import storage as st
from eval.search.files import prepare_half, write_json
from eval.search.pruning import tally
from eval.study.compare import Comparison, compare_runs
from eval.study.memory import axis_name, write_run
from eval.study.report import finite

FORMAT = "surgery-search/1"
FRONTIER = "frontier.json"
REPORT_DIR = "report"
CHANGE_KEYS = ("delta", "ci_low", "ci_high", "ratio", "ratio_low", "ratio_high")


def points_of(study: Any) -> list[dict[str, Any]]:
    """The frontier's trials and the baselines' (each profile once, lowest trial number)."""
    front = {t.number for t in study.best_trials}
    seen: dict[str, dict[str, Any]] = {}
    for trial in st.finished(study):
        baseline = trial.user_attrs.get("baseline")
        if trial.number not in front and baseline is None:
            continue
        profile = trial.user_attrs["profile"]
        if profile in seen:
            seen[profile]["frontier"] |= trial.number in front
            continue
        seen[profile] = {
            "point": trial.number,
            "profile": profile,
            "baseline": baseline,
            "frontier": trial.number in front,
            "feasible": all(v <= 0 for v in trial.constraints.values()),
            "search_values": trial.user_attrs["search"],
        }
    return sorted(seen.values(), key=lambda p: p["point"])


def _row(comparison: Comparison, model: str, key: tuple[str, str, str]) -> dict[str, Any]:
    for row in comparison.rows:
        where = (axis_name(row), row["metric"], row["split"])
        if row["model"] == model and row["scope"] == "overall" and where == key:
            return row
    raise KeyError((model, key))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One writer at a time: workers of one search that finish together write in turn (the
    last one's files hold every trial)."""
    import fcntl

    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_report(searcher: Any) -> dict[str, Any]:
    """Score the frontier and baselines on the report half; write DIR's files (one worker at
    a time).

    Returns:
        frontier.json's content.
    """
    with _locked(searcher.options.out / ".report.lock"):
        return _write_report(searcher)


def _write_report(searcher: Any) -> dict[str, Any]:
    checked, options = searcher.checked, searcher.options
    out = options.out
    measured = checked.measured
    report = prepare_half(options, checked.search.options, "report", measured)
    points = points_of(searcher.study)
    runs = {
        "base": searcher.run("0", report, "base"),
        "trained": searcher.run("1", report, "trained"),
    }
    for point in points:
        name = f"point-{point['point']}"
        runs[name] = searcher.run(point["profile"], report, name)
    names = [name for name in runs if name not in ("base", "trained")]
    vs_base = compare_runs(
        [runs["base"], runs["trained"], *(runs[n] for n in names)],
        resamples=options.resamples,
        seed=options.seed,
    )
    vs_trained = compare_runs(
        [runs["trained"], runs["base"], *(runs[n] for n in names)],
        resamples=options.resamples,
        seed=options.seed,
    )
    for name, run in runs.items():
        write_run(run, out / REPORT_DIR / name)

    def reported(name: str) -> dict[str, Any]:
        values = {}
        for objective in measured:
            row = _row(vs_base, name, objective.key)
            entry = {"value": row["value"], "items": row["items"]}
            if name != "base":
                entry["vs_base"] = {k: row[k] for k in CHANGE_KEYS}
            if name != "trained":
                other = _row(vs_trained, name, objective.key)
                entry["vs_trained"] = {k: other[k] for k in CHANGE_KEYS}
            values[objective.name] = entry
        return values

    labels = [o.name for o in measured]
    for point in points:
        point["search"] = dict(zip(labels, point.pop("search_values"), strict=True))
        point["report"] = reported(f"point-{point['point']}")
        point["gap"] = {
            label: point["report"][label]["value"] - point["search"][label] for label in labels
        }
    base_search = [searcher.base_values[o.key] for o in measured]
    document = {
        "format": FORMAT,
        "trials": len(st.finished(searcher.study)),
        "base": str(options.base),
        "trained": str(options.trained),
        "suite": str(options.suite),
        "blocks": [f"{a}:{b}" for a, b in checked.space.blocks],
        "embeddings": checked.space.embeddings,
        "split_seed": checked.search.options.split_seed,
        "seed": options.seed,
        "objectives": [
            {
                "name": o.name,
                "task": o.measure.task,
                "metric": o.measure.metric,
                "split": o.split,
                "higher_is_better": o.measure.higher,
                "optimized": o in checked.objectives,
            }
            for o in measured
        ],
        "budgets": [b.text for b in checked.budgets],
        "pruning": tally(searcher.study, searcher.pruner.half_items),
        "resamples": options.resamples,
        "references": {
            "base": {
                "search": dict(zip(labels, base_search, strict=True)),
                "report": reported("base"),
            },
            "trained": {"report": reported("trained")},
        },
        "points": points,
    }
    write_json(out / FRONTIER, finite(document))
    plot_frontier(document, out / "frontier.png")
    (out / "report.md").write_text(markdown(document), encoding="utf-8")
    return document


def plot_frontier(document: dict[str, Any], path: Path) -> Path:
    """Forgetting against learning on the report half: each point's value with the 95% paired
    interval of its change from TRAINED around it (log axes for perplexities); the frontier in
    blue, the baselines in orange, TRAINED black, BASE a star."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    learning, forgetting = document["objectives"][:2]
    figure, axes = plt.subplots(figsize=(7, 5))
    base = document["references"]["base"]["report"]
    trained = {"point": "TRAINED", "baseline": None, **document["references"]["trained"]}
    # The `trained` baseline is TRAINED itself: drawn once, as the reference.
    points = [p for p in document["points"] if p["baseline"] != "trained"]
    for point in [*points, trained]:
        x, xerr = _value_and_error(point["report"][forgetting["name"]])
        y, yerr = _value_and_error(point["report"][learning["name"]])
        kind = "trained" if point is trained else "baseline" if point["baseline"] else "point"
        style = {
            "trained": ("s", "black"),
            "baseline": ("^", "tab:orange"),
            "point": ("o", "tab:blue"),
        }
        marker, color = style[kind]
        axes.errorbar(x, y, xerr=xerr, yerr=yerr, fmt=marker, color=color, capsize=2, alpha=0.8)
        # Frontier points sit close together: they are named in report.md, not on the plot.
        label = {"trained": "TRAINED", "baseline": point["baseline"]}.get(kind)
        if label:
            axes.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    base_x, base_y = base[forgetting["name"]]["value"], base[learning["name"]]["value"]
    axes.margins(x=0.12, y=0.08)  # room for the labels of the outermost points
    axes.scatter([base_x], [base_y], marker="*", s=120, color="tab:green", label="BASE", zorder=3)
    for objective, scale in ((forgetting, axes.set_xscale), (learning, axes.set_yscale)):
        if objective["metric"] in ("ppl", "word_perplexity", "byte_perplexity"):
            scale("log")
    better = {True: "higher is better", False: "lower is better"}
    axes.set_xlabel(f"{forgetting['name']} ({better[forgetting['higher_is_better']]})")
    axes.set_ylabel(f"{learning['name']} ({better[learning['higher_is_better']]})")
    axes.set_title(
        "Report half: frontier (blue), baselines (orange), TRAINED (black);\n"
        "bars: 95% paired interval of the change from TRAINED",
        fontsize=9,
    )
    axes.legend(loc="best", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def _value_and_error(entry: dict[str, Any]) -> tuple[float, list[list[float]]]:
    """A point's value and, as error bars around it, the 95% paired interval of its change from
    TRAINED (a perplexity's as a ratio; BASE's values often lie orders of magnitude away)."""
    change, value = entry.get("vs_trained") or {}, entry["value"]
    if change.get("delta") is None:
        return value, [[0.0], [0.0]]
    if change.get("ratio"):  # perplexities: the interval of the ratio, around the value
        low = value * change["ratio_low"] / change["ratio"]
        high = value * change["ratio_high"] / change["ratio"]
        return value, [[value - low], [high - value]]
    return value, [[change["delta"] - change["ci_low"]], [change["ci_high"] - change["delta"]]]


def pruned_line(pruning: dict[str, Any]) -> str:
    """How many trials were cut short, and the search items scored against an unpruned search."""
    cut = pruning["cut"]
    scored, whole = pruning["items_scored"], pruning["items_unpruned"]
    return (
        f"Cut short: {cut['budget']} trials by a budget, {cut['dominated']} dominated by the "
        f"frontier; search items scored {scored} of {whole} ({scored / max(whole, 1):.0%})."
    )


def _change(entry: dict[str, Any] | None) -> str:
    if not entry or entry["delta"] is None:
        return "-"
    return f"{entry['delta']:+.4g} [{entry['ci_low']:+.3g}, {entry['ci_high']:+.3g}]"


def markdown(document: dict[str, Any]) -> str:
    """report.md: the settings, one table per objective (report half: value, change from BASE
    and from TRAINED with 95% intervals; the search half's value and the gap), and the command
    that writes each point."""
    lines = [
        "# Search report",
        "",
        f"BASE `{document['base']}`, TRAINED `{document['trained']}`, suite "
        f"`{document['suite']}`; blocks {', '.join(document['blocks'])}"
        + (" and the embeddings and head (`*`)" if document["embeddings"] else "")
        + f"; {document['trials']} trials; split seed {document['split_seed']}.",
        "",
        "Points are chosen on the search half of the suite's items and scored here on the "
        "report half, which the search never saw. Changes carry paired bootstrap 95% intervals "
        f"({document['resamples']} resamples); gap = report value - search value.",
        "",
    ]
    if document["budgets"]:
        lines += ["Budgets: " + "; ".join(f"`{b}`" for b in document["budgets"]) + ".", ""]
    lines += [pruned_line(document["pruning"]), ""]
    base = document["references"]["base"]
    for objective in document["objectives"]:
        name = objective["name"]
        better = "higher" if objective["higher_is_better"] else "lower"
        lines += [
            f"## {name} ({objective['split']}; {better} is better)",
            "",
            f"BASE {base['report'][name]['value']:.4g} (search half {base['search'][name]:.4g}).",
            "",
            "| point | profile | baseline | frontier | report | vs BASE | vs TRAINED | search "
            "| gap |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        trained = document["references"]["trained"]["report"][name]
        lines.append(
            f"| TRAINED | `1` | | | {trained['value']:.4g} | {_change(trained['vs_base'])} | | | |"
        )
        for point in document["points"]:
            report = point["report"][name]
            lines.append(
                f"| {point['point']} | `{point['profile']}` | {point['baseline'] or ''} | "
                f"{'yes' if point['frontier'] else ''} | {report['value']:.4g} | "
                f"{_change(report.get('vs_base'))} | {_change(report.get('vs_trained'))} | "
                f"{point['search'][name]:.4g} | {point['gap'][name]:+.3g} |"
            )
        lines.append("")
    lines += ["## Rebuild a point", ""]
    for point in document["points"]:
        command = [
            "surgery", "interpolate", "--alpha", point["profile"],
            document["base"], document["trained"], f"point-{point['point']}",
        ]  # fmt: skip
        lines.append(f"- {point['point']}: `{shlex.join(command)}`")
    lines += ["", "or `surgery search DIR --write N`.", ""]
    return "\n".join(lines)


def write_point(folder: Path, number: int, out: Path | None = None, quiet: bool = False) -> Path:
    """Write point `number` of the search in `folder` as a checkpoint (with its recipe and
    card), by `surgery interpolate` with its profile; into `folder/point-N` by default.

    Raises:
        SurgeryError: no frontier.json in `folder`, or no such point.
    """
    from surgery.api import interpolate
    from surgery.core.errors import SurgeryError

    path = Path(folder) / FRONTIER
    if not path.is_file():
        raise SurgeryError(f"{folder}: no {FRONTIER} (not a finished search)")
    document = json.loads(path.read_text(encoding="utf-8"))
    points = {p["point"]: p for p in document["points"]}
    if number not in points:
        raise SurgeryError(
            f"{folder}: no point {number}; points: {', '.join(map(str, sorted(points)))}"
        )
    target = Path(out) if out is not None else Path(folder) / f"point-{number}"
    profile = points[number]["profile"]
    return interpolate(document["base"], document["trained"], target, profile, quiet=quiet)

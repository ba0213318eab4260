"""The honest part of a search: its frontier scored again on items the search never saw.

The frontier is optuna's Pareto front of the complete trials within the budgets (on the search
half). Its points and the baselines are blended again and scored on the report half, beside BASE
and TRAINED, and compared as `surgery compare` compares results folders: paired bootstrap
intervals of each change from BASE and from TRAINED. The report states the gap between each
point's search and report scores (how much choosing on the search half flattered it). DIR gets
frontier.json, frontier.png, report.md, and report/<name>/ results folders that `surgery
compare` reads (`surgery compare DIR/report/point-* --base DIR/report/base -o ...`).

Each point also prints as the `surgery merge` config that writes it (`eval.search.mix`). With
several experts, TRAINED's place is the uniform Expert Soup's (profile `1`), and the report
gives each family's own learning beside the mean, where each expert alone is read against its
family.
"""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eval.search import hypervolume as hv
from eval.search import storage as st
from eval.search.files import prepare_half, write_json
from eval.search.plots import plot_frontier
from eval.search.priors import came_from
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
            "came_from": came_from(trial.user_attrs),
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
    config = _config_maker(searcher)
    learning = checked.objectives[0]
    for point in points:
        point["merge"] = config(point["profile"])
        point["families"] = _families(vs_base, f"point-{point['point']}", learning)
    base_search = [searcher.base_values[o.key] for o in measured]
    document = {
        "format": FORMAT,
        "trials": len(st.finished(searcher.study)),
        "base": str(options.base),
        "trained": str(options.trained),
        **({"experts": _experts(checked)} if checked.several else {}),
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
                "families": _families(vs_base, "base", learning),
            },
            "trained": {
                "report": reported("trained"),
                "families": _families(vs_base, "trained", learning),
            },
        },
        "points": points,
        "sampler": options.sampler,
    }
    document["hypervolume"] = _hypervolume(searcher, document)
    write_json(out / FRONTIER, finite(document))
    plot_frontier(document, out / "frontier.png")
    (out / "report.md").write_text(markdown(document), encoding="utf-8")
    return document


def is_input(baseline: str | None) -> bool:
    """Whether a baseline is an input model itself: TRAINED, or one expert alone (their values
    bound the hypervolume's reference point beside BASE's)."""
    return baseline == "trained" or (baseline or "").startswith("expert ")


def _experts(checked: Any) -> list[dict[str, str]]:
    """Each expert's path and family."""
    paths = checked.options.inputs
    return [{"path": p, "family": f} for p, f in zip(paths, checked.labels, strict=True)]


def _config_maker(searcher: Any) -> Any:
    """`profile -> surgery merge YAML` for this search's models (`eval.search.mix`)."""
    from eval.search.mix import merge_config, mix_of
    from surgery.core.layers import select_stack
    from surgery.engine.naming import layout_of
    from surgery.engine.ops.merge.modules import module_map

    checked, options = searcher.checked, searcher.options
    experts = checked.experts or [checked.trained]
    prefixes = [select_stack(c.stacks).prefix for c in [checked.base, *experts]]
    tensors = checked.base.tensors
    modules = list(dict.fromkeys(module_map(tensors, layout_of(tensors)).values()))
    models = [str(options.base), *map(str, options.inputs)]
    layers = checked.space.num_layers

    def config(profile: str) -> str:
        return merge_config(mix_of(profile, layers, len(experts)), models, prefixes, modules)

    return config


def _families(comparison: Comparison, model: str, objective: Any) -> dict[str, Any]:
    """`model`'s learning on each family's own held-in languages (value, and the change from
    BASE with its interval)."""
    found = {}
    key = (objective.measure.task, objective.measure.metric)
    for row in comparison.rows:
        where = (axis_name(row), row["metric"])
        if row["model"] != model or row["scope"] != "family" or where != key:
            continue
        if row["split"] != "held_in":
            continue
        entry = {"value": row["value"]}
        if model != "base":
            entry["vs_base"] = {k: row[k] for k in CHANGE_KEYS}
        found[row["family"]] = entry
    return found


def _hypervolume(searcher: Any, document: dict[str, Any]) -> dict[str, Any]:
    """frontier.json's `hypervolume` (`eval.search.hypervolume.section`) over the optimized
    objectives."""
    objectives = [o for o in document["objectives"] if o["optimized"]]
    names = [o["name"] for o in objectives]
    trials = st.finished(searcher.study)
    inputs = [t.values for t in trials if is_input(t.user_attrs.get("baseline"))]
    base = [searcher.base_values[o.key] for o in searcher.checked.objectives]
    references = document["references"]
    report_inputs = [
        [references[model]["report"][name]["value"] for name in names]
        for model in ("base", "trained")
    ] + [
        [p["report"][name]["value"] for name in names]
        for p in document["points"]
        if is_input(p["baseline"])
    ]
    frontier = [
        [p["report"][name]["value"] for name in names] for p in document["points"] if p["frontier"]
    ]
    return hv.section(
        objectives,
        [base, *inputs],
        [t.values if all(v <= 0 for v in t.constraints.values()) else None for t in trials],
        report_inputs,
        frontier,
    )


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
    experts = document.get("experts")
    inputs = (
        "experts " + ", ".join(f"`{e['path']}` ({e['family']})" for e in experts)
        if experts
        else f"TRAINED `{document['trained']}`"
    )
    lines = [
        "# Search report",
        "",
        f"BASE `{document['base']}`, {inputs}, suite "
        f"`{document['suite']}`; blocks {', '.join(document['blocks'])}"
        + (" and the embeddings and head (`*`)" if document["embeddings"] else "")
        + f"; {document['trials']} trials ({document['sampler']} sampler, seed "
        f"{document['seed']}); split seed {document['split_seed']}.",
        "",
        "Points are chosen on the search half of the suite's items and scored here on the "
        "report half, which the search never saw. Changes carry paired bootstrap 95% intervals "
        f"({document['resamples']} resamples); gap = report value - search value.",
        "",
    ]
    if experts:
        lines += [
            "With several experts, a profile gives each block a strength s and each expert a "
            "share: BASE weighs 1 - s, expert k s * r_k / sum(r) (`0:2=0.5[1 0 0]`; a block "
            "without shares splits s equally). TRAINED below is the uniform Expert Soup "
            "(profile `1`).",
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
            "| point | profile | came from | frontier | report | vs BASE | vs TRAINED | search "
            "| gap |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        trained = document["references"]["trained"]["report"][name]
        label = "Expert Soup" if experts else "TRAINED"
        lines.append(
            f"| {label} | `1` | | | {trained['value']:.4g} | {_change(trained['vs_base'])} | | | |"
        )
        for point in document["points"]:
            report = point["report"][name]
            lines.append(
                f"| {point['point']} | `{point['profile']}` | {point['came_from']} | "
                f"{'yes' if point['frontier'] else ''} | {report['value']:.4g} | "
                f"{_change(report.get('vs_base'))} | {_change(report.get('vs_trained'))} | "
                f"{point['search'][name]:.4g} | {point['gap'][name]:+.3g} |"
            )
        lines.append("")
    lines += hv.markdown_lines(document["hypervolume"])
    lines += _family_table(document)
    lines += ["## Rebuild a point", ""]
    if experts:
        return "\n".join([*lines, *_configs(document)])
    for point in document["points"]:
        command = [
            "surgery", "interpolate", "--alpha", point["profile"],
            document["base"], document["trained"], f"point-{point['point']}",
        ]  # fmt: skip
        lines.append(f"- {point['point']}: `{shlex.join(command)}`")
    lines += [
        "",
        "or `surgery search DIR --write N`; frontier.json holds each point's `surgery merge` "
        "config too.",
        "",
    ]
    return "\n".join(lines)


def _family_table(document: dict[str, Any]) -> list[str]:
    """Each family's own learning (the learning objective on its held-in languages): BASE,
    TRAINED (the Expert Soup) and every point; an expert alone is read against its family."""
    families = list(document["references"]["base"]["families"])
    if len(families) < 2 and not document.get("experts"):
        return []
    learning = document["objectives"][0]["name"]
    own = {f"expert {e['family']}": e["family"] for e in document.get("experts") or []}
    lines = [
        f"## {learning} per family (report half)",
        "",
        "Each family's held-in languages alone; change from BASE with its 95% interval. "
        + ("Each expert alone is read against its own family (in bold)." if own else ""),
        "",
        "| point | " + " | ".join(families) + " |",
        "|---|" + "---|" * len(families),
    ]
    references = document["references"]
    soup = "Expert Soup" if own else "TRAINED"
    rows = [("BASE", None, references["base"]), (soup, None, references["trained"])]
    rows += [(str(p["point"]), p["baseline"], p) for p in document["points"]]
    for label, baseline, entry in rows:
        cells = []
        for family in families:
            found = entry["families"].get(family)
            cell = "-" if found is None else f"{found['value']:.4g} {_change(found.get('vs_base'))}"
            cells.append(f"**{cell}**" if own.get(baseline) == family else cell)
        name = f"{label} [{baseline}]" if baseline else label
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _configs(document: dict[str, Any]) -> list[str]:
    """Each point's `surgery merge` config and the command that writes it."""
    lines = []
    for point in document["points"]:
        number = point["point"]
        lines += [
            f"### Point {number}",
            "",
            f"`surgery merge point-{number}.yml point-{number}` with `point-{number}.yml`:",
            "",
            "```yaml",
            point["merge"].rstrip(),
            "```",
            "",
        ]
    return [*lines, "Or `surgery search DIR --write N`.", ""]


def write_point(folder: Path, number: int, out: Path | None = None, quiet: bool = False) -> Path:
    """Write point `number` of the search in `folder` as a checkpoint (with its recipe and
    card), by `surgery interpolate` with its profile, or with several experts by `surgery merge`
    with its config (written beside: `folder/point-N.yml`); into `folder/point-N` by default.

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
    if document.get("experts"):
        from surgery.api import merge

        config = Path(folder) / f"point-{number}.yml"
        config.write_text(points[number]["merge"], encoding="utf-8")
        return merge(config, target, quiet=quiet)
    profile = points[number]["profile"]
    return interpolate(document["base"], document["trained"], target, profile, quiet=quiet)

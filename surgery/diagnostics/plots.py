"""The diagnostics' curves and bars (sweep, drift, sliding windows), drawn through the shared
plotting package: one house style, fitted axes, legends off the data, metadata on every file.

Each figure has a `*_figure` function (the figure, not saved: the figure check renders it) and a
`plot_*` function that saves it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import cycle
from pathlib import Path

from surgery.diagnostics.metric_kinds import is_perplexity, leaf, lower_is_better
from surgery.plotting import (
    BASE_COLOUR,
    NOISE_COLOUR,
    SERIES,
    TRAINED_COLOUR,
    figure,
    legend_below,
    noise_handle,
    plain_ticks,
    save_figure,
    use_log,
)

# One NLL in several forms: a task's perplexities and bits per byte are monotone functions of one
# total NLL, so they rise and fall (and recover) together. A figure draws the first one present.
NLL_FORMS = ("ppl", "perplexity", "bits_per_byte", "byte_perplexity", "word_perplexity")
# Fewer alphas than this are drawn as points: a line between three points claims a curve.
MIN_LINE_POINTS = 5


def distinct_metrics(metrics: Sequence[str]) -> list[str]:
    """The metrics that say different things: of a task's NLL forms (`NLL_FORMS`), only the
    first present, in `NLL_FORMS` order; every other metric as is, in order."""
    chosen: dict[str, str] = {}
    for metric in metrics:
        if leaf(metric) not in NLL_FORMS:
            continue
        prefix = metric[: -len(leaf(metric))]
        kept = chosen.get(prefix)
        if kept is None or NLL_FORMS.index(leaf(metric)) < NLL_FORMS.index(leaf(kept)):
            chosen[prefix] = metric
    kept_forms = set(chosen.values())
    return [m for m in metrics if leaf(m) not in NLL_FORMS or m in kept_forms]


def task_label(metric: str, metrics: Sequence[str]) -> str:
    """A metric's task as a reader names it: `gen/gen/ppl` -> `gen`; the text or subtask part
    only where the task has several among `metrics` (`belebele: eng`)."""
    parts = metric.split("/")
    task, middle = parts[0], "/".join(parts[1:-1])
    middles = {"/".join(m.split("/")[1:-1]) for m in metrics if m.split("/")[0] == task}
    if not middle or middle == task or len(middles) == 1:
        return task
    return f"{task}: {middle}"


def metric_axis_label(metric: str) -> str:
    """An axis label for a metric's values: its kind and which way is better."""
    better = "lower" if lower_is_better(metric) else "higher"
    return f"{leaf(metric).replace('_', ' ')} ({better} is better)"


def alpha_label(layers: str | None = None, modules: str | None = None) -> str:
    """The alpha axis's label, saying what alpha 0 is: BASE, or with a layer spec or module
    filter BASE only there (TRAINED elsewhere); alpha 1 is TRAINED either way."""
    if layers is None and modules is None:
        return "alpha (0 = base, 1 = trained)"
    where = f"layers {layers}" if layers is not None else "every layer"
    if modules is not None:
        where = f"{modules} of {where}"
    return f"alpha (0 = base in {where}, 1 = trained)"


def _panels(metrics: Sequence[str]) -> dict[str, list[str]]:
    """Distinct metrics grouped by kind (their last name part), in order: one panel per kind,
    so the forgetting and the learning metric (`gen/gen/ppl`, `heldin/sla1/ppl`) share an axis."""
    panels: dict[str, list[str]] = {}
    for metric in distinct_metrics(metrics):
        panels.setdefault(leaf(metric), []).append(metric)
    return panels


def _grid(count: int, per_row: int = 3) -> tuple[int, int]:
    """(rows, columns) for `count` panels, at most `per_row` a row, balanced (4: 2 x 2)."""
    rows = math.ceil(count / per_row)
    return rows, math.ceil(count / rows)


def _panel_axes(count: int, height: float):
    """A figure with `count` panels and the axes used (unused grid slots removed)."""
    rows, cols = _grid(count)
    fig, axes = figure("full" if cols > 1 else "half", height * rows, rows, cols)
    used = list(axes.flat)[:count]
    for ax in list(axes.flat)[count:]:
        fig.delaxes(ax)
    return fig, used


def _log_if_ratio(ax, metric: str, values: Sequence[float]) -> None:
    """A log y axis for a perplexity spanning more than the house ratio; plain ticks."""
    if is_perplexity(metric) and use_log(values):
        ax.set_yscale("log")
    plain_ticks(ax, "y")


def metrics_figure(
    rows: Sequence[dict], metrics: Sequence[str], title: str, xlabel: str | None = None
):
    """The figure of `plot_metrics_vs_alpha` (not saved): one panel per metric kind, a series per
    task in it, against alpha (`xlabel`: the axis's label, default `alpha_label()`)."""
    panels = _panels(metrics)
    fig, axes = _panel_axes(len(panels), 6.5)
    alphas = [row["alpha"] for row in rows]
    style = {"marker": "o"} if len(alphas) >= MIN_LINE_POINTS else {"marker": "o", "ls": "none"}
    names = [m for members in panels.values() for m in members]
    # One colour per task, the same in every panel, so one legend names them all.
    tasks = list(dict.fromkeys(task_label(m, names) for m in names))
    colour = dict(zip(tasks, cycle(SERIES), strict=False))
    handles = {}
    for ax, members in zip(axes, panels.values(), strict=True):
        for metric in members:
            task = task_label(metric, names)
            values = [row[metric] for row in rows]
            (handles[task],) = ax.plot(alphas, values, label=task, color=colour[task], **style)
        _log_if_ratio(ax, members[0], [row[m] for row in rows for m in members])
        ax.set_xlabel(xlabel or alpha_label())
        ax.set_ylabel(metric_axis_label(members[0]))
        ax.grid(alpha=0.3)
    legend_below(fig, [handles[task] for task in tasks]).set_title("scored on (task)")
    fig.suptitle(title)
    return fig


def plot_metrics_vs_alpha(
    rows: Sequence[dict], metrics: Sequence[str], path: Path, title: str, xlabel: str | None = None
) -> Path:
    """One panel per metric kind (ppl, acc...) against alpha (0 = BASE, 1 = TRAINED; `xlabel`
    from `alpha_label` says where BASE is when only some layers blend), one series per task:
    what training forgot and what it learned side by side. A task's other NLL forms (bits per
    byte, word and byte perplexity) are one NLL: only its first is drawn."""
    return save_figure(metrics_figure(rows, metrics, title, xlabel), path)


def drift_figure(layer_kinds: dict[tuple[int, str], float], title: str):
    """The figure of `plot_drift_by_layer` (not saved): grouped bars, relative L2 drift per
    layer, one bar per module kind; a log axis when the kinds' drifts span more than 3x (norms
    drift far less than MLPs)."""
    layers = sorted({layer for layer, _ in layer_kinds})
    kinds = sorted({kind for _, kind in layer_kinds})
    width = 0.8 / max(1, len(kinds))
    fig, axes = figure("full", 7.0)
    ax = axes[0, 0]
    for i, kind in enumerate(kinds):
        xs = [layer + (i - (len(kinds) - 1) / 2) * width for layer in layers]
        heights = [layer_kinds.get((layer, kind), 0.0) for layer in layers]
        ax.bar(xs, heights, width, label=kind)
    positive = [v for v in layer_kinds.values() if v > 0]
    log = use_log(positive)
    if log:
        ax.set_yscale("log")
        ax.set_ylim(min(positive) / 1.5, max(positive) * 1.5)
    plain_ticks(ax, "y")
    ax.set_xlabel("layer")
    ax.set_ylabel("relative L2 drift\n‖θ − θ₀‖ / ‖θ₀‖" + (", log scale" if log else ""))
    ax.set_xticks(layers if len(layers) <= 24 else layers[:: math.ceil(len(layers) / 24)])
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(title)
    legend_below(fig, ax.get_legend_handles_labels()[0], ncol=len(kinds))
    return fig


def plot_drift_by_layer(layer_kinds: dict[tuple[int, str], float], path: Path, title: str) -> Path:
    """Grouped bars: relative L2 drift per layer, one bar per module kind."""
    return save_figure(drift_figure(layer_kinds, title), path)


def _noise_band(metric: str, trained: float, noise: float) -> tuple[float, float]:
    """TRAINED's score plus and minus the noise floor, back on the metric's own scale (the
    floor of a perplexity is on the log scale)."""
    if is_perplexity(metric):
        return trained * math.exp(-noise), trained * math.exp(noise)
    return trained - noise, trained + noise


def window_figure(
    rows: Sequence[dict], references: dict[str, tuple[float, float, float]], title: str
):
    """The figure of `plot_window_curve` (not saved); one panel per distinct metric."""
    metrics = distinct_metrics(list(references))
    fig, axes = _panel_axes(len(metrics), 6.5)
    width = rows[0]["end"] - rows[0]["start"]
    for ax, metric in zip(axes, metrics, strict=True):
        base, trained, noise = references[metric]
        ax.axhspan(*_noise_band(metric, trained, noise), color=NOISE_COLOUR, alpha=0.6, lw=0)
        ax.axhline(base, color=BASE_COLOUR, linestyle="--", label="base")
        ax.axhline(trained, color=TRAINED_COLOUR, linestyle="--", label="trained")
        alphas = list(dict.fromkeys(row["alpha"] for row in rows))
        for alpha in alphas:
            points = [row for row in rows if row["alpha"] == alpha]
            centres = [(row["start"] + row["end"] - 1) / 2 for row in points]
            label = "window reverted" if alpha == 0 else f"window at alpha {alpha:g}"
            ax.plot(centres, [row[metric] for row in points], marker="o", label=label)
        values = [row[metric] for row in rows] + [base, trained]
        _log_if_ratio(ax, metric, values)
        scored = f"scored on {task_label(metric, metrics)}"
        ax.set_title(f"{title}\n{scored}" if len(metrics) == 1 else scored)
        ax.set_xlabel(f"centre layer of the reverted {width}-layer window")
        ax.set_ylabel(metric_axis_label(metric))
        ax.grid(alpha=0.3)
    handles = axes[0].get_legend_handles_labels()[0]
    legend_below(fig, [*handles, noise_handle(of="trained")])
    if len(metrics) > 1:
        fig.suptitle(title)
    return fig


def plot_window_curve(
    rows: Sequence[dict],
    references: dict[str, tuple[float, float, float]],
    path: Path,
    title: str,
) -> Path:
    """One panel per distinct metric: its score with each sliding window reverted, against the
    window's centre layer (a series per alpha), with BASE's and TRAINED's scores as dashed lines
    and TRAINED's noise floor shaded: a window whose point leaves the band moves the metric.

    Args:
        rows: localize's rows of a window run (`start`, `end`, `alpha`, each metric).
        references: per metric to draw, (BASE's score, TRAINED's score, noise on the judged
            scale).
    """
    return save_figure(window_figure(rows, references, title), path)

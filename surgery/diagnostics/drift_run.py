"""`surgery drift`'s Python API: one model's drift from its base, or how alike several experts'
task vectors are, with the files the command writes (both streamed: the models are never loaded
whole)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from surgery.core.errors import SurgeryError

if TYPE_CHECKING:
    from surgery.diagnostics.drift import DriftReport
    from surgery.diagnostics.similarity import SimilarityReport


def run_drift(
    base: str | Path,
    trained: str | Path,
    *,
    stack: str | None = None,
    csv_path: str | Path | None = None,
    plot: str | Path | None = None,
    quiet: bool = False,
    download: bool = False,
) -> DriftReport:
    """`surgery drift BASE TRAINED`: one model's drift from its base, streamed; with
    `csv_path` and `plot`, also its rows as CSV and a bar chart over the layers.

    Raises:
        SurgeryError: bad inputs or a plot name matplotlib cannot write.
    """
    from surgery.api import warn_if_swapped
    from surgery.diagnostics.drift import drift as run
    from surgery.diagnostics.drift import plot_drift, write_drift_csv
    from surgery.hub.resolve import open_inputs
    from surgery.plotting import check_plot_path

    if plot:
        check_plot_path(plot)
    base_ckpt, trained_ckpt = open_inputs(
        [base, trained], ranges=not download, companions=[False, False]
    )
    warn_if_swapped(base_ckpt, trained_ckpt)
    report = run(base_ckpt, trained_ckpt, stack=stack, quiet=quiet)
    if csv_path:
        write_drift_csv(report, Path(csv_path))
    if plot:
        plot_drift(report, Path(plot), f"Drift of {Path(trained).name} from {Path(base).name}")
    return report


def run_similarity(
    base: str | Path,
    experts: list[str | Path],
    *,
    stack: str | None = None,
    csv_path: str | Path | None = None,
    plot: str | Path | None = None,
    quiet: bool = False,
    download: bool = False,
    json_path: str | Path | None = None,
    pair_plot: str | Path | None = None,
    pair: str | None = None,
    labels: str | None = None,
) -> SimilarityReport:
    """`surgery drift BASE EXPERT EXPERT...`: how alike the experts' task vectors are, streamed;
    with the paths, also CSV rows, every matrix as JSON, region heatmaps and one pair's heatmap.

    Raises:
        SurgeryError: bad inputs, labels or pair, or a plot name matplotlib cannot write.
    """
    from surgery.api import warn_if_swapped
    from surgery.diagnostics import similarity_report as out
    from surgery.diagnostics.similarity import similarity
    from surgery.hub.resolve import open_inputs
    from surgery.plotting import check_plot_path

    for path in (plot, pair_plot):
        if path:
            check_plot_path(path)
    names = out.expert_labels(experts, labels)
    chosen = out.pick_pair(names, pair)
    base_ckpt, *expert_ckpts = open_inputs(
        [base, *experts], ranges=not download, companions=[False] * (len(experts) + 1)
    )
    if pair_plot and not expert_ckpts[0].stacks:
        raise SurgeryError("--pair-plot plots layers, and the experts have no layer stack")
    for expert in expert_ckpts:
        warn_if_swapped(base_ckpt, expert)
    report = similarity(base_ckpt, expert_ckpts, names, stack=stack, quiet=quiet)
    if csv_path:
        out.write_similarity_csv(report, Path(csv_path))
    if json_path:
        out.write_similarity_json(report, Path(json_path))
    of = f"of {len(names)} experts of {Path(base).name}"
    if plot:
        out.plot_regions(report, Path(plot), f"Task-vector cosine {of}")
    if pair_plot:
        a, b = names[chosen[0]], names[chosen[1]]
        out.plot_pair(report, chosen, Path(pair_plot), f"Task-vector cosine of {a} and {b}")
    return report

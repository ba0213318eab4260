"""The outputs of `surgery drift BASE EXPERT EXPERT...`: a plain-text table, CSV rows, JSON and
heatmaps of a `SimilarityReport`."""

from __future__ import annotations

import csv
import json
from itertools import combinations
from pathlib import Path

import numpy as np

from surgery.core.errors import SurgeryError
from surgery.diagnostics.similarity import PairSums, SimilarityReport

# What each matrix holds, as the JSON file says it.
METRICS = {
    "cosine": "cosine similarity of the task vectors (expert - base)",
    "l2": "L2 distance ||d_i - d_j|| between the task vectors (= ||expert_i - expert_j||)",
    "l2_rms": "l2 / sqrt(params): the reference's normalized L2 distance",
}
_METHODS = {"cosine": "cosine", "l2": "distance", "l2_rms": "rms_distance"}


def pairs(labels: list[str]) -> list[tuple[int, int]]:
    """Every pair (i, j) of experts with i < j, in order."""
    return list(combinations(range(len(labels)), 2))


def _matrices(sums: PairSums) -> dict[str, np.ndarray]:
    return {key: getattr(sums, method)() for key, method in _METHODS.items()}


def _region_matrices(report: SimilarityReport, layers: list[int]) -> dict[str, np.ndarray]:
    return {key: report.region_mean(layers, method) for key, method in _METHODS.items()}


def _summary(key: str, sums: PairSums, pairs_: list[tuple[int, int]]) -> str:
    """One table row: the mean, least and greatest cosine over the pairs, the mean distance."""
    cos, dist = sums.cosine(), sums.distance()
    cosines = [cos[i, j] for i, j in pairs_]
    mean_l2 = float(np.mean([dist[i, j] for i, j in pairs_]))
    return (
        f"{key:>10}  {np.mean(cosines):>10.6f}  {min(cosines):>10.6f}  {max(cosines):>10.6f}  "
        f"{mean_l2:>10.3e}  {sums.numel}"
    )


def format_similarity(report: SimilarityReport) -> str:
    """Per-layer and per-kind tables of the pairs' cosines (mean, least, greatest) and mean L2
    distance, then the cosine matrix of each region, plain text (every pair's numbers are in
    the CSV and JSON)."""
    every = pairs(report.labels)
    header = f"{'mean cos':>10}  {'min cos':>10}  {'max cos':>10}  {'mean L2':>10}  params"
    lines = [f"task vectors of {len(report.labels)} experts, {len(every)} pairs", ""]
    lines.append(f"{'layer':>10}  {header}")
    lines += [_summary(str(layer), sums, every) for layer, sums in report.layers.items()]
    lines += ["", f"{'kind':>10}  {header}"]
    lines += [_summary(kind, sums, every) for kind, sums in sorted(report.kinds.items())]
    lines.append(_summary("all", report.total, every))
    width = max(10, *(len(label) + 2 for label in report.labels))
    for region, layers in report.regions().items():
        lines += ["", f"{region} layers {layers[0]}-{layers[-1]}: mean cosine of the layers"]
        matrix = report.region_mean(layers, "cosine")
        lines.append(" " * width + "".join(f"{label:>{width}}" for label in report.labels))
        for label, values in zip(report.labels, matrix, strict=True):
            lines.append(f"{label:>{width}}" + "".join(f"{v:>{width}.6f}" for v in values))
    for name, shared in report.shared_rows.items():
        lines.append(f"note: {name} compared on the {shared} rows every input has")
    return "\n".join(lines)


def similarity_rows(report: SimilarityReport) -> list[dict]:
    """One CSV row per pair of experts and scope: each layer, each (layer, kind), each kind,
    each region (the mean of its layers' values) and all tensors together."""
    scopes: list[tuple[dict, dict[str, np.ndarray], int]] = []
    for layer, sums in report.layers.items():
        scopes.append(({"scope": "layer", "layer": layer}, _matrices(sums), sums.numel))
    for (layer, kind), sums in sorted(report.layer_kinds.items()):
        where = {"scope": "layer_kind", "layer": layer, "kind": kind}
        scopes.append((where, _matrices(sums), sums.numel))
    for kind, sums in sorted(report.kinds.items()):
        scopes.append(({"scope": "kind", "kind": kind}, _matrices(sums), sums.numel))
    for region, layers in report.regions().items():
        params = sum(report.layers[i].numel for i in layers)
        where = {"scope": "region", "region": region}
        scopes.append((where, _region_matrices(report, layers), params))
    scopes.append(({"scope": "all"}, _matrices(report.total), report.total.numel))
    rows = []
    for where, matrices, params in scopes:
        for i, j in pairs(report.labels):
            row = {"scope": "", "layer": "", "kind": "", "region": "", **where}
            row |= {"expert_a": report.labels[i], "expert_b": report.labels[j]}
            row |= {key: float(matrix[i, j]) for key, matrix in matrices.items()}
            rows.append(row | {"params": params})
    return rows


def write_similarity_csv(report: SimilarityReport, path: Path) -> Path:
    """Write `similarity_rows` as CSV."""
    rows = similarity_rows(report)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _entry(matrices: dict[str, np.ndarray], params: int) -> dict:
    return {"params": params, **{key: matrix.tolist() for key, matrix in matrices.items()}}


def similarity_json(report: SimilarityReport) -> dict:
    """The report as strict JSON data: N x N matrices (rows and columns in `labels` order) per
    layer (with its kinds), per kind, per region and over all tensors."""
    layers = {}
    for layer, sums in report.layers.items():
        kinds = {
            k: _entry(_matrices(s), s.numel)
            for (i, k), s in report.layer_kinds.items()
            if i == layer
        }
        layers[str(layer)] = _entry(_matrices(sums), sums.numel) | {"kinds": kinds}
    regions = {
        region: {"layers": layers_in}
        | _entry(
            _region_matrices(report, layers_in), sum(report.layers[i].numel for i in layers_in)
        )
        for region, layers_in in report.regions().items()
    }
    return {
        "labels": report.labels,
        "stack": report.stack.name if report.stack is not None else None,
        "num_layers": report.stack.num_layers if report.stack is not None else 0,
        "metrics": METRICS | {"regions": "the mean of their layers' matrices"},
        "layers": layers,
        "kinds": {kind: _entry(_matrices(s), s.numel) for kind, s in sorted(report.kinds.items())},
        "regions": regions,
        "all": _entry(_matrices(report.total), report.total.numel),
        "shared_rows": report.shared_rows,
    }


def write_similarity_json(report: SimilarityReport, path: Path) -> Path:
    """Write `similarity_json` to `path`."""
    Path(path).write_text(json.dumps(similarity_json(report), indent=1, allow_nan=False) + "\n")
    return path


def expert_labels(specs: list[str], given: str | None) -> list[str]:
    """The experts' names in tables and plots: `--labels a,b,c` when given, else each input's
    last path component (its folder name, or a Hub id's name); repeated names get `#2`, `#3`.

    Raises:
        SurgeryError: `given` does not name each expert once.
    """
    if given is not None:
        labels = [part.strip() for part in given.split(",")]
        if len(labels) != len(specs) or not all(labels) or len(set(labels)) != len(labels):
            raise SurgeryError(
                f"--labels {given!r}: give {len(specs)} distinct names, one per expert, in order"
            )
        return labels
    labels: list[str] = []
    for spec in specs:
        name = Path(str(spec).rstrip("/")).name or str(spec)
        count = sum(1 for label in labels if label == name or label.startswith(f"{name}#"))
        labels.append(name if count == 0 else f"{name}#{count + 1}")
    return labels


def pick_pair(labels: list[str], pair: str | None) -> tuple[int, int]:
    """The two experts `--pair A,B` names (labels or 0-based positions); the first two when
    None.

    Raises:
        SurgeryError: not two distinct experts among `labels`.
    """
    if pair is None:
        return 0, 1
    parts = [part.strip() for part in pair.split(",")]

    def index(part: str) -> int:
        if part in labels:
            return labels.index(part)
        if part.isdigit() and int(part) < len(labels):
            return int(part)
        raise SurgeryError(f"--pair {pair!r}: {part!r} is not one of {', '.join(labels)}")

    if len(parts) != 2:
        raise SurgeryError(
            f"--pair {pair!r}: give two experts, e.g. --pair {labels[0]},{labels[1]}"
        )
    chosen = index(parts[0]), index(parts[1])
    if chosen[0] == chosen[1]:
        raise SurgeryError(f"--pair {pair!r}: give two different experts")
    return chosen


def plot_regions(report: SimilarityReport, path: Path, title: str) -> Path:
    """N x N cosine heatmaps, one panel per region and one over all layers (means of the
    layers' values)."""
    from surgery.diagnostics.heatmaps import plot_matrices

    panels = {
        f"{region} layers {layers[0]}-{layers[-1]}": report.region_mean(layers, "cosine")
        for region, layers in report.regions().items()
    }
    if report.layers:
        panels["all layers"] = report.region_mean(list(report.layers), "cosine")
    else:
        panels["all tensors"] = report.total.cosine()
    return plot_matrices(panels, report.labels, path, title, "task-vector cosine")


def plot_pair(report: SimilarityReport, pair: tuple[int, int], path: Path, title: str) -> Path:
    """A heatmap of one pair's cosine per layer: a row per module kind and one for the whole
    layer."""
    from surgery.diagnostics.heatmaps import plot_layer_heatmap

    i, j = pair
    layers = list(report.layers)
    kinds = sorted({kind for _, kind in report.layer_kinds})
    rows = {"layer": [report.layers[n].cosine()[i, j] for n in layers]}
    for kind in kinds:
        sums = [report.layer_kinds.get((n, kind)) for n in layers]
        rows[kind] = [float("nan") if s is None else s.cosine()[i, j] for s in sums]
    return plot_layer_heatmap(rows, layers, path, title, "task-vector cosine")

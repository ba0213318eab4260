"""Fixture data shaped like the docs' runs, and the registry of plot functions the figure check
renders (tests/test_figures.py). Add a case with `@case("name")` on a function that returns an
unsaved figure; eval's and the demo's cases go in their own block below."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache

CASES: dict[str, Callable[[], object]] = {}


def case(name: str):
    """Register a function returning an unsaved figure under `name`."""

    def register(build: Callable[[], object]) -> Callable[[], object]:
        CASES[name] = build
        return build

    return register


# Data as the quick demo's runs give them (docs/diagnostics.md, docs/similarity.md).
DRIFT = {
    (layer, kind): value
    for layer in range(6)
    for kind, value in (
        ("attention", 0.28 - 0.008 * layer + 0.02 * (layer == 1)),
        ("mlp", 0.415 - 0.012 * layer),
        ("norms", 0.018 - 0.001 * layer),
    )
}
NLL_FORMS = {"ppl": 1.0, "word_perplexity": 2.0, "byte_perplexity": 0.3}


def nll_metrics(prefix: str, ppl: float) -> dict[str, float]:
    """One NLL in its four forms, as eval reports a ppl task."""
    row = {f"{prefix}/{leaf}": ppl**power for leaf, power in NLL_FORMS.items()}
    row[f"{prefix}/bits_per_byte"] = math.log2(ppl**0.3)
    return row


def sweep_rows(alphas: list[float]) -> list[dict]:
    """A sweep from BASE to the Slavic expert: the general text forgets, the Slavic one learns."""
    return [
        {"alpha": a}
        | nll_metrics("gen/gen", 4.3 * (199 / 4.3) ** (a**2))
        | nll_metrics("heldin/sla1", 68528 * (21.4 / 68528) ** math.sqrt(a))
        for a in alphas
    ]


def cosines(low: float, high: float, n: int = 5, seed: int = 0) -> list[list[float]]:
    """A symmetric n x n cosine matrix, 1 on the diagonal, the rest spread over low..high."""
    matrix = [[1.0] * n for _ in range(n)]
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    for k, (i, j) in enumerate(pairs):
        value = low + (high - low) * ((k * 7 + seed) % len(pairs)) / (len(pairs) - 1)
        matrix[i][j] = matrix[j][i] = round(value, 3)
    return matrix


EXPERTS = ["slavic", "germanic", "indic", "austro", "romance"]
REGIONS = {
    "early layers 0-1": cosines(0.11, 0.19),
    "middle layers 2-3": cosines(0.18, 0.28, seed=1),
    "late layers 4-5": cosines(0.26, 0.42, seed=2),
    "all layers": cosines(0.18, 0.28, seed=3),
}


def recovery_rows() -> list[dict]:
    """localize's rows of three blocks on a ppl task (four NLL forms) and a noisy accuracy."""
    rows = []
    for block, recovery in (("0:2", 0.37), ("2:5", -0.025), ("5:6", 0.21)):
        row = {"block": block, "alpha": 0.0, "recovery/copain/acc": math.nan}
        row |= {f"recovery/gen/gen/{leaf}": recovery for leaf in [*NLL_FORMS, "bits_per_byte"]}
        rows.append(row)
    return rows


RECOVERY_METRICS = [f"gen/gen/{leaf}" for leaf in [*NLL_FORMS, "bits_per_byte"]] + ["copain/acc"]


def window_rows() -> tuple[list[dict], dict[str, tuple[float, float, float]]]:
    """A 3-layer window over 12 layers of a model trained on layers 4 to 6."""
    peak = {4: 235.0, 5: 268.8, 6: 230.6, 3: 226.0, 7: 226.5}
    rows = []
    for start in range(10):
        ppl = peak.get(start + 1, 224.5)
        rows.append(
            {"start": start, "end": start + 3, "alpha": 0.0} | nll_metrics("t/held_out", ppl)
        )
    base, trained = nll_metrics("t/held_out", 268.8), nll_metrics("t/held_out", 224.5)
    references = {m: (base[m], trained[m], 0.047) for m in base}
    return rows, references


@case("sweep")
def _sweep():
    from surgery.diagnostics.plots import metrics_figure

    rows = sweep_rows([0.0, 0.5, 1.0])
    metrics = [m for m in rows[0] if m != "alpha"]
    return metrics_figure(rows, metrics, "Interpolation sweep: expert-slavic")


@case("sweep_eleven_alphas_with_accuracy")
def _sweep_eleven():
    from surgery.diagnostics.plots import alpha_label, metrics_figure

    rows = sweep_rows([a / 10 for a in range(11)])
    for row in rows:
        row["copain/acc"] = 0.25 + 0.3 * row["alpha"]
    metrics = [m for m in rows[0] if m != "alpha"]
    return metrics_figure(rows, metrics, "Interpolation sweep (layers 1:5): x", alpha_label("1:5"))


@case("drift")
def _drift():
    from surgery.diagnostics.plots import drift_figure

    return drift_figure(DRIFT, "Drift of expert-slavic from the base")


@case("drift_34_layers")
def _drift_deep():
    from surgery.diagnostics.plots import drift_figure

    deep = {
        (layer, kind): v * (1 + layer / 40)
        for (l0, kind), v in DRIFT.items()
        for layer in range(l0, 34, 6)
    }
    return drift_figure(deep, "Drift of a deep model")


@case("localize_blocks")
def _localize():
    from surgery.diagnostics.heatmaps import recovery_figure

    rows = recovery_rows()
    return recovery_figure(rows, RECOVERY_METRICS, ["0:2", "2:5", "5"], "Recovery: dense")


@case("localize_bands")
def _localize_bands():
    from surgery.diagnostics.heatmaps import recovery_figure

    rows = recovery_rows()
    for row, alpha in zip(rows, (0.0, 0.5, 0.0), strict=True):
        row["alpha"] = alpha
    blocks = ["0:9 (first 9, last 6)", "9:28 (first 9, last 6)", "28:34 (first 9, last 6)"]
    return recovery_figure(rows, RECOVERY_METRICS, blocks, "Recovery: bands")


@case("localize_windows")
def _windows():
    from surgery.diagnostics.plots import window_figure

    rows, references = window_rows()
    return window_figure(rows, references, "Score by reverted window: trained")


@case("similarity_regions")
def _similarity():
    from surgery.diagnostics.heatmaps import matrices_figure

    return matrices_figure(REGIONS, EXPERTS, "Task-vector cosine of 5 experts", "cosine")


@case("similarity_pair")
def _pair():
    from surgery.diagnostics.heatmaps import layer_heatmap_figure

    rows = {
        "layer": [0.12 + 0.05 * n for n in range(6)],
        "attention": [0.1 + 0.04 * n for n in range(6)],
        "mlp": [0.15 + 0.05 * n for n in range(6)],
        "norms": [0.5, 0.55, math.nan, 0.6, 0.58, 0.62],
    }
    return layer_heatmap_figure(rows, list(range(6)), "Cosine of slavic and indic", "cosine")


@case("similarity_pair_deep_signed")
def _pair_deep():
    from surgery.diagnostics.heatmaps import layer_heatmap_figure

    rows = {
        "layer": [math.sin(n / 5) * 0.4 for n in range(34)],
        "mlp": [0.02 * n - 0.2 for n in range(34)],
    }
    return layer_heatmap_figure(rows, list(range(34)), "Cosine of a and b", "cosine")


def _ppl_entry(value: float, trained: float | None, spread: float = 0.04) -> dict:
    """A search report entry: the value and, against TRAINED, its ratio's 95% interval."""
    if trained is None:
        return {"value": value, "vs_trained": None}
    ratio = value / trained
    change = {"delta": value - trained, "ci_low": 0.0, "ci_high": 0.0, "ratio": ratio}
    interval = {"ratio_low": ratio * (1 - spread), "ratio_high": ratio * (1 + spread)}
    return {"value": value, "vs_trained": change | interval}


def search_document() -> dict:
    """A search's frontier.json as the dense demo gives it: BASE's learning perplexity at 6e4,
    two orders of magnitude above the points (21 to 45), which it squashes on a shared axis."""
    learn, forget = "heldin/sla1/ppl", "gen/gen/ppl"
    trained = {learn: 21.4, forget: 199.0}
    pairs = [(24.0, 37.0), (22.0, 120.0), (26.0, 24.0), (30.0, 15.0), (37.0, 11.0), (45.0, 8.0)]
    points = [
        {
            "point": n,
            "baseline": None,
            "profile": "p",
            "frontier": True,
            "report": {
                learn: _ppl_entry(y, trained[learn]),
                forget: _ppl_entry(x, trained[forget]),
            },
        }
        for n, (y, x) in enumerate(pairs, 1)
    ]
    points.append(
        {
            "point": 7,
            "baseline": "reverted 2:5",
            "profile": "b",
            "frontier": False,
            "report": {learn: _ppl_entry(23.0, 21.4), forget: _ppl_entry(160.0, 199.0)},
        }
    )
    objective = {"metric": "ppl", "higher_is_better": False, "split": "report"}
    return {
        "objectives": [objective | {"name": learn}, objective | {"name": forget}],
        "references": {
            "base": {"report": {learn: {"value": 6.0e4}, forget: {"value": 4.3}}},
            "trained": {"report": {k: _ppl_entry(v, None) for k, v in trained.items()}},
        },
        "points": points,
    }


# --- eval's and the demo's figures: compare, search, the demo's strategies ---------------------


@cache
def _comparison():
    """A comparison of three strategies against a base on two families with `others:` (the
    test suite's synthetic results folders): some cells beyond noise, FLORES without `others`,
    a few on too few items."""
    import tempfile
    from pathlib import Path

    from eval.study.compare import compare
    from tests.support.study_dirs import FAMILIES, Study, write_results

    root = Path(tempfile.mkdtemp(prefix="figure-cases-"))
    spec = Study(families=FAMILIES, others=["eng_Latn"])
    folders = [
        write_results(root / name, spec, name, skill, seed=seed)
        for name, skill, seed in (("base", 0.0, 1), ("dense", 0.6, 2), ("soup", 0.3, 3))
    ] + [write_results(root / "ema", spec, "ema", 0.15, seed=4)]
    return compare(folders[0], folders[1:], resamples=200, seed=0)


@case("compare_heatmap")
def _compare_heatmap():
    from eval.study.plots import heatmap_figure

    return heatmap_figure(_comparison())


@case("compare_tradeoff")
def _compare_tradeoff():
    from eval.study.plots import tradeoff_figure

    return tradeoff_figure(_comparison())


@case("search_frontier_base_far_off")
def _search():
    from eval.search.plots import frontier_figure

    return frontier_figure(search_document())


def _strategy_cell(ratio: float | None, delta: float, significant: bool) -> dict:
    """A comparison cell as the demo's panels read it: a perplexity's ratio or a change."""
    spread = 0.08
    cell = {"significant": significant, "delta": delta}
    cell |= {"ci_low": delta - 1.0 - spread * abs(delta), "ci_high": delta + 1.0}
    if ratio is not None:
        cell |= {"ratio": ratio, "ratio_low": ratio * (1 - spread), "ratio_high": ratio * 1.05}
    return cell


@case("demo_strategies")
def _strategies():
    """The quick demo's 16 strategies: the general text forgotten 3-60x, the trained
    languages learned 100-3,000x, chrF changes of both signs, some within noise."""
    from demo.plots import Panel, strategies_figure

    labels = [f"strategy {i}" for i in range(16)]
    gen = [_strategy_cell(3 + 3.7 * i, 1, True) for i in range(16)]
    held_in = [_strategy_cell(3e-4 * 1.5**i, -1, True) for i in range(16)]
    chrf = [_strategy_cell(None, 15 * math.sin(i), i % 3 != 0) for i in range(16)]
    panels = [
        Panel("gen ppl", "ppl", True, True, True, gen),
        Panel("held-in ppl", "ppl", True, True, True, held_in),
        Panel("chrF", "chrf", False, False, False, chrf),
    ]
    return strategies_figure(labels, panels)

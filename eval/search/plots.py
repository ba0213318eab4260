"""The search's figure: forgetting against learning on the report half (frontier.png)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


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

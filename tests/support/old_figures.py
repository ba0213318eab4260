"""Frozen copies of the figures main drew before the shared plotting package (drift, the
similarity panels, search's frontier), trimmed to what draws them: the figure check must flag
each of them on the fixtures that reproduce their faults (tests/test_figures.py)."""

from __future__ import annotations

from surgery.plotting import pyplot


def old_drift(layer_kinds: dict[tuple[int, str], float], title: str):
    plt = pyplot()
    plt.rcdefaults()  # the old figures predate the house style
    layers = sorted({layer for layer, _ in layer_kinds})
    kinds = sorted({kind for _, kind in layer_kinds})
    width = 0.8 / max(1, len(kinds))
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(layers) + 2), 3.8))
    for i, kind in enumerate(kinds):
        xs = [layer + (i - (len(kinds) - 1) / 2) * width for layer in layers]
        ax.bar(xs, [layer_kinds.get((layer, kind), 0.0) for layer in layers], width, label=kind)
    ax.set_xlabel("layer")
    ax.set_ylabel("relative L2 drift ||θ-θ0|| / ||θ0||")
    ax.set_title(title)
    ax.set_xticks(layers)
    ax.legend(loc="best", fontsize="small")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def old_similarity(panels: dict, labels: list[str], title: str, label: str):
    plt = pyplot()
    plt.rcdefaults()
    n = len(labels)
    side = max(2.6, 0.55 * n + 1.4)
    fig, axes = plt.subplots(
        1, len(panels), figsize=(side * len(panels) + 1.6, side + 0.8), squeeze=False,
        layout="constrained",
    )  # fmt: skip
    image = None
    for number, (ax, (name, matrix)) in enumerate(zip(axes.flat, panels.items(), strict=True)):
        image = ax.imshow(matrix, cmap="RdBu", vmin=-1.0, vmax=1.0)
        ax.set_xticks(range(n), labels=labels, rotation=35, ha="right")
        ax.set_yticks(range(n), labels=labels if number == 0 else [])
        for r, row in enumerate(matrix):
            for c, value in enumerate(row):
                colour = "white" if abs(value) > 0.6 else "black"
                ax.text(c, r, f"{value:.2f}", ha="center", va="center", color=colour, fontsize=8)
        ax.set_title(name)
    fig.colorbar(image, ax=list(axes.flat), label=f"{label} (fixed scale -1 to 1)", shrink=0.8)
    fig.suptitle(title)
    return fig


def _value_and_error(entry: dict):
    change, value = entry.get("vs_trained") or {}, entry["value"]
    if change.get("delta") is None:
        return value, [[0.0], [0.0]]
    low = value * change["ratio_low"] / change["ratio"]
    high = value * change["ratio_high"] / change["ratio"]
    return value, [[value - low], [high - value]]


def old_frontier(document: dict):
    plt = pyplot()
    plt.rcdefaults()
    learning, forgetting = document["objectives"][:2]
    figure, axes = plt.subplots(figsize=(7, 5))
    base = document["references"]["base"]["report"]
    trained = {"point": "TRAINED", "baseline": None, **document["references"]["trained"]}
    points = [p for p in document["points"] if p["baseline"] != "trained"]
    style = {"trained": ("s", "black"), "baseline": ("^", "tab:orange"), "point": ("o", "tab:blue")}
    for point in [*points, trained]:
        x, xerr = _value_and_error(point["report"][forgetting["name"]])
        y, yerr = _value_and_error(point["report"][learning["name"]])
        kind = "trained" if point is trained else "baseline" if point["baseline"] else "point"
        marker, color = style[kind]
        axes.errorbar(x, y, xerr=xerr, yerr=yerr, fmt=marker, color=color, capsize=2, alpha=0.8)
        label = {"trained": "TRAINED", "baseline": point["baseline"]}.get(kind)
        if label:
            axes.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    base_x, base_y = base[forgetting["name"]]["value"], base[learning["name"]]["value"]
    axes.margins(x=0.12, y=0.08)
    axes.scatter([base_x], [base_y], marker="*", s=120, color="tab:green", label="BASE", zorder=3)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel(f"{forgetting['name']} (lower is better)")
    axes.set_ylabel(f"{learning['name']} (lower is better)")
    axes.set_title("Report half: frontier (blue), baselines (orange), TRAINED (black)", fontsize=9)
    axes.legend(loc="best", fontsize=8)
    figure.tight_layout()
    return figure

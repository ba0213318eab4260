"""The shared plotting package's helpers: fitted colour scales, the log rule, outliers, fronts,
metadata on saved figures, and the figure check's own rules on small figures."""

from __future__ import annotations

import math

import pytest

from surgery.core.errors import OutputError
from surgery.plotting import close as close_figure
from surgery.plotting import (
    colour_scale,
    figure,
    figure_metadata,
    mask_diagonal,
    number_points,
    outlier_arrow,
    pareto_steps,
    plotting_hash,
    save_figure,
    split_outliers,
    use_log,
)
from surgery.plotting.check import figure_problems


def _problems(fig) -> list[str]:
    try:
        return figure_problems(fig)
    finally:
        close_figure(fig)


def test_colour_scales_are_fitted_to_the_data():
    both = colour_scale([-0.025, 0.37, math.nan])
    assert both.diverging and (both.vmin, both.vmax) == (-0.37, 0.37)
    one = colour_scale([[0.11, 0.42], [0.2, math.nan]])
    assert not one.diverging and (one.vmin, one.vmax) == (0.11, 0.42)
    flat = colour_scale([0.5, 0.5])
    assert flat.vmin < 0.5 < flat.vmax
    masked = mask_diagonal([[1.0, 0.2], [0.2, 1.0]])
    assert masked[0][1] == masked[1][0] == 0.2 and math.isnan(masked[0][0] + masked[1][1])


def test_ratios_go_log_only_beyond_three_times():
    assert not use_log([1.00, 1.18])  # compare's trade-off today: 1.00 to 1.18 on a log axis
    assert not use_log([10, 29])
    assert use_log([10, 31]) and use_log([0.013, 0.41])
    assert not use_log([-1, 10])  # a sign change is no ratio


def test_an_outlier_two_orders_away_is_split_off_and_drawn_as_an_arrow():
    values = [24.0, 37.0, 22.0, 30.0, 26.0, 6.0e4]
    kept, far = split_outliers(values, log=True)
    assert far == [5] and kept == [0, 1, 2, 3, 4]
    assert split_outliers([1.0, 2.0], log=False) == ([0, 1], [])

    fig, axes = figure("half", 6.0)
    ax = axes[0, 0]
    ax.plot(range(6), values, marker="o", ls="none")
    ax.set_yscale("log")
    assert any("squashes" in p for p in _problems(fig))

    fig, axes = figure("half", 6.0)
    ax = axes[0, 0]
    ax.plot(kept, [values[i] for i in kept], marker="o", ls="none")
    outlier_arrow(ax, "y", values[5], 5, "BASE")
    assert _problems(fig) == []
    (arrow,) = [t for t in ax.texts if "BASE" in t.get_text()]
    assert arrow.get_text() == "BASE 60,000"


def test_a_front_is_steps_through_three_points_or_more():
    fig, axes = figure("half", 6.0)
    ax = axes[0, 0]
    assert not pareto_steps(ax, [1, 2], [3, 4], higher_y_better=True)
    assert pareto_steps(ax, [1, 3, 2], [3, 5, 4], higher_y_better=True)
    (line,) = ax.lines
    assert line.get_drawstyle() == "steps-post" and list(line.get_xdata()) == [1, 2, 3]
    close_figure(fig)


def test_text_on_a_marker_fails_unless_it_labels_it():
    fig, axes = figure("half", 6.0)
    ax = axes[0, 0]
    ax.plot([1, 2, 3, 4, 5], [1, 3, 2, 5, 4], marker="o", ls="none", markersize=8)
    ax.text(3, 2, "a note", ha="center", va="center")
    assert any("marker it does not label" in p for p in _problems(fig))

    fig, axes = figure("half", 6.0)
    ax = axes[0, 0]
    ax.plot([1, 2, 3, 4, 5], [1, 3, 2, 5, 4], marker="o", ls="none", markersize=8)
    number_points(ax, [(3, 2)], ["24"], offset=(0, 0))
    assert _problems(fig) == []


def test_a_legend_on_the_data_fails():
    fig, axes = figure("half", 5.0)
    ax = axes[0, 0]
    for series in range(4):
        ax.bar([0, 1, 2, 3], [1.0, 1.0, 1.0, 1.0], 0.9, label=f"series {series}")
    ax.legend(loc="center")
    assert any("covers data" in p for p in _problems(fig))


def test_a_colour_scale_twice_the_data_fails():
    fig, axes = figure("half", 5.0)
    image = axes[0, 0].imshow([[0.11, 0.2], [0.3, 0.42]], cmap="RdBu", vmin=-1, vmax=1)
    fig.colorbar(image, ax=axes[0, 0])
    assert any("of its colour scale" in p for p in _problems(fig))


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_a_saved_figure_records_its_command_and_the_plotting_hash(tmp_path, suffix):
    fig, axes = figure("half", 4.0)
    axes[0, 0].plot([0, 1], [0, 1])
    path = save_figure(fig, tmp_path / f"f{suffix}", command="surgery drift a b --plot f.png")
    if suffix == ".png":
        assert figure_metadata(path) == {
            "Command": "surgery drift a b --plot f.png",
            "Plotting-Hash": plotting_hash(),
        }
    elif suffix == ".svg":
        text = path.read_text(encoding="utf-8")
        assert "surgery drift a b --plot f.png" in text and plotting_hash() in text
    else:
        assert path.read_bytes()[:5] == b"%PDF-"
    assert len(plotting_hash()) == 12


def test_a_plot_name_without_a_known_suffix_is_refused(tmp_path):
    fig, _axes = figure("half", 4.0)
    with pytest.raises(OutputError, match="give a file name ending in .png, .pdf, .svg"):
        save_figure(fig, tmp_path / "plot.jpg")
    assert not (tmp_path / "plot.jpg").exists()

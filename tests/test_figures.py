"""The figure check: every plot function, drawn on fixture data shaped like the docs' runs,
reads at page width (no text off the canvas or on another, no legend on data, colour scales
fitted, no squashed axis, no unfilled title); and the check flags the figures the toolkit drew
before the shared plotting package."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from surgery.plotting import close, figure_metadata, plotting_hash
from surgery.plotting.check import figure_problems
from surgery.plotting.save import COMMAND_KEY, HASH_KEY
from tests.support import old_figures
from tests.support.figure_cases import CASES, DRIFT, EXPERTS, REGIONS, search_document


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_plot_function_passes_the_figure_check(name):
    fig = CASES[name]()
    try:
        assert figure_problems(fig) == []
    finally:
        close(fig)


@pytest.mark.parametrize(
    ("draw", "fault"),
    [
        (lambda: old_figures.old_drift(DRIFT, "Drift of expert-slavic"), "legend"),
        (lambda: old_figures.old_similarity(REGIONS, EXPERTS, "Cosine", "cosine"), "colour scale"),
        (lambda: old_figures.old_frontier(search_document()), "squashes"),
    ],
    ids=["drift", "similarity", "search"],
)
def test_the_check_flags_the_figures_drawn_before_the_plotting_package(draw, fault):
    fig = draw()
    try:
        problems = figure_problems(fig)
    finally:
        close(fig)
    assert any(fault in problem for problem in problems), problems


def test_the_check_flags_an_unfilled_title_and_text_off_the_canvas():
    from surgery.plotting import figure

    fig, axes = figure("half", 5.0)
    axes[0, 0].plot([0, 1, 2, 3, 4], [1, 2, 3, 4, 5], marker="o")
    axes[0, 0].set_title("Drift of {trained}")
    fig.text(0.98, 0.5, "a long note that runs off the right edge")
    try:
        problems = figure_problems(fig)
    finally:
        close(fig)
    assert any("placeholder" in p for p in problems), problems
    assert any("leaves the canvas" in p for p in problems), problems


DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.mark.parametrize("png", sorted(path.name for path in DOCS.glob("*.png")))
def test_every_docs_figure_says_what_drew_it_with_todays_plotting_package(png):
    """A docs figure records the command that drew it and the plotting package's hash; a
    different hash means the figure is older than the code that draws it (docs/figures.sh)."""
    metadata = figure_metadata(DOCS / png)
    assert metadata.get(COMMAND_KEY, "").startswith(("surgery ", "python bench/")), (
        f"docs/{png} does not say which surgery command or benchmark drew it: redraw it with "
        "docs/figures.sh"
    )
    assert metadata.get(HASH_KEY) == plotting_hash(), (
        f"docs/{png} was drawn by another version of surgery/plotting: redraw it with "
        "docs/figures.sh"
    )


# What only surgery/plotting may hold: matplotlib itself, figure sizes, font sizes, colours.
OWN_TO_PLOTTING = re.compile(
    r"^\s*(import matplotlib|from matplotlib)|figsize=|fontsize=|\"#[0-9a-fA-F]{6}\"|\"tab:\w+\"",
    re.MULTILINE,
)


@pytest.mark.parametrize("package", ["surgery", "eval", "demo", "train"])
def test_every_figure_is_drawn_through_the_plotting_package(package):
    """search, compare, drift, sweep, localize and the demo draw with surgery.plotting: no module
    outside it imports matplotlib or sets a figure's size, a font size or a colour of its own."""
    root = DOCS.parent
    offenders = [
        f"{path.relative_to(root)}: {match.group(0).strip()}"
        for path in sorted((root / package).rglob("*.py"))
        if "plotting" not in path.relative_to(root).parts[:2]
        for match in OWN_TO_PLOTTING.finditer(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_every_figure_function_has_a_case_in_the_figure_check():
    """Each `*_figure` function of the toolkit (the figure a plot command saves) is drawn by a
    case of tests/support/figure_cases.py, so the check above renders it."""
    root = DOCS.parent
    cases = (root / "tests" / "support" / "figure_cases.py").read_text(encoding="utf-8")
    defined = {
        f"{path.relative_to(root)}: {name}"
        for package in ("surgery", "eval", "demo")
        for path in sorted((root / package).rglob("*.py"))
        for name in re.findall(r"^def (\w+_figure)\(", path.read_text(encoding="utf-8"), re.M)
        if "plotting" not in path.parts  # the package's own save_figure draws nothing
    }
    assert sorted(item for item in defined if item.split(": ")[1] not in cases) == []

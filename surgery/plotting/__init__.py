"""The toolkit's one plotting package: every figure a command draws goes through it.

API (import from `surgery.plotting`):

- House style (`style`): `figure(width="full"|"half"|cm, height=cm, nrows, ncols)` returns
  `(fig, axes)` (axes always 2-D; constrained layout) at the size it is read at, a page 17 cm
  wide, with 8/9/7 pt text (`FONT`); `pyplot()`; `close(fig)`; `plain_ticks(ax, "x"|"y"|"both")`;
  `plain_number(v)`; `text_colour_on(rgba)`; colours by role: `NOISE_COLOUR` with
  `NOISE_LABEL`, `BASE_COLOUR`, `TRAINED_COLOUR`, `FRONT_COLOUR`, `BASELINE_COLOUR`,
  `SERIES` (colour cycle).
- Scales (`scales`): `colour_scale(values, centre=0)` -> `ColourScale` (diverging centred on
  0 when values take both signs, else sequential fitted to their range; `.cmap`, `.norm()`,
  `.rgba(v)`); `mask_diagonal(matrix)`; `use_log(values)` (log only when max/min > `LOG_SPAN`,
  3).
- Marks (`marks`): `noise_handle()` (the one "within noise" legend entry);
  `split_outliers(values, log)` -> (kept, far) indices; `outlier_arrow(ax, "x"|"y", value, at,
  label)` (an arrow at the axis edge with the value); `pareto_steps(ax, xs, ys,
  higher_y_better)` (steps, only with >= 3 points); `number_points(ax, points, labels)`.
- Heatmaps (`heatmap`): `heatmap(ax, values, rows, cols, scale)`, `colour_bar(fig, image, axes,
  label)`, `legend_below(fig, handles)`.
- Saving (`save`): `save_figure(fig, path, command=None)` writes the figure with its command
  and `plotting_hash()` in its metadata and closes it; `figure_metadata(png)`;
  `check_plot_path(path)`; `PLOT_SUFFIXES`.
- The figure check (`check`): `figure_problems(fig)` lists what a reader could not read.

matplotlib is imported lazily (inside functions), with the Agg backend: no display needed.
Orientation: forgetting on x, learning on y, wherever both are plotted.
"""

from surgery.plotting.heatmap import colour_bar, heatmap, legend_below
from surgery.plotting.marks import (
    MIN_FRONT,
    noise_handle,
    number_points,
    outlier_arrow,
    pareto_steps,
    split_outliers,
)
from surgery.plotting.save import (
    PLOT_SUFFIXES,
    check_plot_path,
    figure_metadata,
    invoked_command,
    plotting_hash,
    save_figure,
)
from surgery.plotting.scales import LOG_SPAN, ColourScale, colour_scale, mask_diagonal, use_log
from surgery.plotting.style import (
    BASE_COLOUR,
    BASELINE_COLOUR,
    FONT,
    FRONT_COLOUR,
    NOISE_COLOUR,
    NOISE_LABEL,
    OUTLIER_COLOUR,
    PAGE_WIDTH,
    SERIES,
    TRAINED_COLOUR,
    close,
    figure,
    plain_number,
    plain_ticks,
    pyplot,
    text_colour_on,
)

__all__ = [
    "BASELINE_COLOUR",
    "BASE_COLOUR",
    "FONT",
    "FRONT_COLOUR",
    "LOG_SPAN",
    "MIN_FRONT",
    "NOISE_COLOUR",
    "NOISE_LABEL",
    "OUTLIER_COLOUR",
    "PAGE_WIDTH",
    "PLOT_SUFFIXES",
    "SERIES",
    "TRAINED_COLOUR",
    "ColourScale",
    "check_plot_path",
    "close",
    "colour_bar",
    "colour_scale",
    "figure",
    "figure_metadata",
    "heatmap",
    "invoked_command",
    "legend_below",
    "mask_diagonal",
    "noise_handle",
    "number_points",
    "outlier_arrow",
    "pareto_steps",
    "plain_number",
    "plain_ticks",
    "plotting_hash",
    "pyplot",
    "save_figure",
    "split_outliers",
    "text_colour_on",
    "use_log",
]

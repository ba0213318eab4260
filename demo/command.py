"""`surgery demo`: the paper's pipeline in miniature (demo.pipeline), one run or several seeds."""

from __future__ import annotations

from pathlib import Path

import click

from surgery.core.cli_paths import OutputFolder
from surgery.options import device_option, out_option, renamed


@click.command()
@out_option(
    "The demo's folder: its world, models (checkpoints), results, report.md and plots.",
    default="surgery-demo",
    show_default=True,
)
@click.option("--quick", is_flag=True, help="A smaller run: about 7 minutes on 2 CPU cores.")
@click.option(
    "--seed",
    default=0,
    show_default=True,
    type=int,
    help="Seeds the synthetic world, the base's initialization, the training runs and the "
    "bootstrap.",
)
@click.option(
    "--seeds",
    default=None,
    type=click.IntRange(min=2),
    help="Run the demo N times, seeds SEED..SEED+N-1 (into OUT/seed-S), and write "
    "OUT/spread.md: each change's median and range over the runs, bold where it held in "
    "every one.",
)
@device_option
@renamed("OUT_DIR", "-o/--out", "out", type=OutputFolder(path_type=Path))
def demo(out, quick, seed, seeds, device):
    """The paper's pipeline in miniature, offline: train, forget, repair, measure.

    Generates a synthetic world (a general language, five language families with a held-out
    relative each), pretrains a tiny base, runs Dense CPT, family experts, freezing, L2-SP, EMA,
    Dense-/Expert-Reverted and Expert Soup, scores them all and writes OUT/report.md with a
    table of deltas from the base, plots, and one expert's drift and sweep. A second run reuses
    finished stages.

    \b
    Examples:
      surgery demo --quick
      surgery demo --quick --seeds 3 -o runs/spread   # what holds over three runs
      surgery demo -o runs/demo --device cuda
    """
    if seeds is not None:
        from demo.spread import run_seeds

        run_seeds(out, quick=quick, seeds=list(range(seed, seed + seeds)), device=device)
        return
    from demo.pipeline import run_demo

    run_demo(out, quick=quick, seed=seed, device=device)

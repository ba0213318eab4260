"""`surgery demo`: the paper's pipeline in miniature (demo.pipeline), one run or several seeds."""

from __future__ import annotations

import click

from surgery.core.cli_paths import OutputFolder


@click.command()
@click.argument("out_dir", default="surgery-demo", type=OutputFolder())
@click.option("--quick", is_flag=True, help="A smaller run: about 7 minutes on 2 CPU cores.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--seeds",
    default=None,
    type=click.IntRange(min=2),
    help="Run the demo N times, seeds SEED..SEED+N-1 (into OUT_DIR/seed-S), and write "
    "OUT_DIR/spread.md: each change's median and range over the runs, bold where it held in "
    "every one.",
)
@click.option("--device", default=None, help="cpu or cuda [default: cuda when available].")
def demo(out_dir, quick, seed, seeds, device):
    """The paper's pipeline in miniature, offline: train, forget, repair, measure.

    Generates a synthetic world (a general language, five language families with a held-out
    relative each), pretrains a tiny base, runs Dense CPT, family experts, freezing, L2-SP, EMA,
    Dense-/Expert-Reverted and Expert Soup, scores them all and writes OUT_DIR/report.md with a
    table of deltas from the base, plots, and one expert's drift and sweep. A second run reuses
    finished stages.

    \b
    Examples:
      surgery demo --quick
      surgery demo --quick --seeds 3 runs/spread   # what holds over three runs
      surgery demo runs/demo --device cuda
    """
    if seeds is not None:
        from demo.spread import run_seeds

        run_seeds(out_dir, quick=quick, seeds=list(range(seed, seed + seeds)), device=device)
        return
    from demo.pipeline import run_demo

    run_demo(out_dir, quick=quick, seed=seed, device=device)

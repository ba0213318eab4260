"""Benchmark: `surgery search` with and without pruning, side by side, on a tiny world where
the right profile is known (tests/support/search_world.py, with more documents).

With a budget that most trials break (`held_in ppl <= 6`: BASE's learning perplexity is near
58, TRAINED's near 7.1, the ideal profile's near 5.9), each seed runs `--prune` then
`--no-prune` (alternately, so the machine's load weighs on both alike) and prints one row per
search: wall time, trials cut short, search items scored, and the report half's hypervolume of
the final frontier; then per mode the median and range over the seeds, and the ratios pruned
over unpruned.

The hypervolume is over (learning, forgetting) on the report half, perplexities as logarithms,
up to the worst value of BASE and TRAINED on each (the issue's reference point). It is computed
here by a 2-D sweep (`hypervolume_2d`); eval/search/hypervolume.py, written beside this, is
the search's own.

Run by hand:  python bench/bench_search_pruning.py [--docs 256] [--trials 30] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

SURGERY = [
    sys.executable,
    "-c",
    "import sys; from cli import main; sys.argv[0] = 'surgery'; main()",
]
BUDGET = "held_in ppl <= 6"


def hypervolume_2d(points: list[tuple[float, float]], reference: tuple[float, float]) -> float:
    """The area that `points` dominate up to `reference`, both objectives lower-is-better."""
    gains = [(reference[0] - x, reference[1] - y) for x, y in points]
    area, reached = 0.0, 0.0
    for x, y in sorted((g for g in gains if min(g) > 0), key=lambda g: -g[0]):
        if y > reached:  # widest first: each adds the strip above the height reached so far
            area, reached = area + x * (y - reached), y
    return area


def report_hypervolume(document: dict) -> float:
    """The report half's hypervolume of a search's final frontier (log perplexities)."""
    names = [o["name"] for o in document["objectives"][:2]]
    references = document["references"]
    inputs = [references["base"]["report"], references["trained"]["report"]]
    worst = tuple(max(math.log(r[n]["value"]) for r in inputs) for n in names)
    points = [
        tuple(math.log(p["report"][n]["value"]) for n in names)
        for p in document["points"]
        if p["frontier"]
    ]
    return hypervolume_2d(points, worst)  # type: ignore[arg-type]


def search(world: dict[str, Path], out: Path, seed: int, args: argparse.Namespace, prune: bool):
    """One `surgery search` in a subprocess: its row (wall time, counts, hypervolume)."""
    argv = ["search", world["base"], world["trained"], "--suite", world["suite"], "-o", out]
    argv += ["--blocks", args.blocks, "--step", args.step, "--trials", args.trials]
    argv += ["--seed", seed, "--budget", args.budget, "--resamples", "200", "-q"]
    argv += ["--prune" if prune else "--no-prune"]
    start = time.perf_counter()
    subprocess.run(
        [*SURGERY, *map(str, argv)],
        check=True,
        cwd=Path(__file__).parents[1],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    document = json.loads((out / "frontier.json").read_text())
    pruning = document["pruning"]
    return {
        "seed": seed,
        "mode": "pruned" if prune else "unpruned",
        "wall": wall,
        "cut": pruning["cut"],
        "items": pruning["items_scored"],
        "unpruned_items": pruning["items_unpruned"],
        "hypervolume": report_hypervolume(document),
    }


def compare_modes(world: dict[str, Path], root: Path, args: argparse.Namespace) -> list[dict]:
    """Every seed's pruned and unpruned search, alternately."""
    rows = []
    for seed in args.seeds:
        for prune in (True, False):
            out = root / f"search-{seed}-{'pruned' if prune else 'unpruned'}"
            rows.append(search(world, out, seed, args, prune))
    return rows


def summary(rows: list[dict], mode: str, key: str) -> tuple[float, float, float]:
    """Median, min and max of one figure over the seeds of one mode."""
    values = [row[key] for row in rows if row["mode"] == mode]
    return statistics.median(values), min(values), max(values)


def print_table(rows: list[dict], args: argparse.Namespace) -> None:
    """The rows, the medians and ranges per mode, and the ratios pruned / unpruned."""
    world = f"demo {args.demo} (base, expert-slavic)" if args.demo else "search world"
    print(
        f"{world}: {args.docs} documents per language, blocks {args.blocks}, step "
        f"{args.step}, {args.trials} trials, budget '{args.budget}', seeds "
        f"{','.join(map(str, args.seeds))}"
    )
    print(f"  {'seed':>4} {'mode':<9} {'wall s':>7} {'cut b/d':>8} {'items':>12} {'HV report':>10}")
    for row in rows:
        cut = f"{row['cut']['budget']}/{row['cut']['dominated']}"
        items = f"{row['items']}/{row['unpruned_items']}"
        print(
            f"  {row['seed']:>4} {row['mode']:<9} {row['wall']:7.1f} {cut:>8} {items:>12} "
            f"{row['hypervolume']:10.4f}"
        )
    for mode in ("pruned", "unpruned"):
        figures = []
        for key, form in (("wall", "{:.1f}"), ("items", "{:.0f}"), ("hypervolume", "{:.4f}")):
            median, low, high = summary(rows, mode, key)
            figures.append(f"{key} {form.format(median)} [{form.format(low)}, {form.format(high)}]")
        print(f"  {mode:<9} median [range]: " + "; ".join(figures))
    ratios = [
        f"{key} {summary(rows, 'pruned', key)[0] / summary(rows, 'unpruned', key)[0]:.2f}x"
        for key in ("wall", "items", "hypervolume")
    ]
    print("  pruned / unpruned (medians): " + ", ".join(ratios))
    load = os.getloadavg()
    print(f"  load average {load[0]:.2f} (uptime), {os.cpu_count()} CPUs")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The bench's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=256, help="documents per language")
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--blocks", default="4")
    parser.add_argument("--step", default="0.25")
    parser.add_argument("--budget", default=BUDGET)
    parser.add_argument(
        "--seeds", default=[0, 1, 2], type=lambda text: [int(s) for s in text.split(",")]
    )
    parser.add_argument("--world", type=Path, default=None, help="reuse a world built here")
    parser.add_argument(
        "--demo",
        type=Path,
        default=None,
        help="a `surgery demo --quick` run: search its base and Slavic expert instead",
    )
    parser.add_argument("--sentences", type=int, default=1, help="sentences per document (--demo)")
    return parser.parse_args(argv)


DEMO_SUITE = """\
families:
  slavic: {held_in: [sla_Latn, slb_Latn]}
others: [gen_Latn]
languages:
  gen_Latn: {lang2: gen}
  sla_Latn: {lang2: sla1}
  slb_Latn: {lang2: sla2}
tasks:
  ppl: {path: "ppl/{lang}/"}
root: .
"""


def demo_world(demo: Path, root: Path, docs: int, length: int) -> dict[str, Path]:
    """A `surgery demo` run's base and Slavic expert, with a suite of `docs` fresh perplexity
    documents (`length` sentences each; the demo's have four) in its two trained Slavic
    languages (held in) and in the base's language (`others`): the demo's own suite has too few
    documents to judge a share."""
    from demo.world import build_languages, sentences

    seed = json.loads((demo / "data" / "world.json").read_text())["seed"]
    languages = {lang.code: lang for lang in build_languages(seed)}
    concepts = sentences(docs * length, seed + 1000)  # drawn apart from the demo's own pools
    for code, lang in (("gen_Latn", "gen"), ("sla_Latn", "sla1"), ("slb_Latn", "sla2")):
        folder = root / "ppl" / code
        folder.mkdir(parents=True, exist_ok=True)
        lines = [languages[lang].render(c) for c in concepts]
        rows = [{"text": " ".join(lines[i : i + length])} for i in range(0, len(lines), length)]
        (folder / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "suite.yml").write_text(DEMO_SUITE)
    models = demo / "models"
    return {
        "base": models / "base",
        "trained": models / "expert-slavic",
        "suite": root / "suite.yml",
    }


def world_at(root: Path, docs: int) -> dict[str, Path]:
    """The search world with `docs` documents per language, built under `root` once."""
    from tests.support import search_world

    paths = {
        "base": root / "base",
        "trained": root / "trained",
        "suite": root / "data" / "suite.yml",
    }
    if not paths["suite"].is_file():
        search_world.build(root, docs)
    return paths


def main(argv: list[str] | None = None) -> list[dict]:
    """Build the world, run the searches, print the table; returns the rows."""
    args = parse(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if args.demo is not None:
            world = demo_world(args.demo, Path(tmp) / "demo-suite", args.docs, args.sentences)
        else:
            world = world_at(args.world or Path(tmp) / "world", args.docs)
        rows = compare_modes(world, Path(tmp), args)
    print_table(rows, args)
    return rows


if __name__ == "__main__":
    main()

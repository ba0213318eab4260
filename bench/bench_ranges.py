"""Benchmark: Hub ids read by HTTP range requests against snapshot_download then the local command.

Builds a Llama-shaped bf16 base and trained checkpoint (two shards each; about 0.97B parameters =
1.9 GB each by default, as bench_engine.py), serves them from the loopback fake Hub of the tests
(tests/support/hub_server.py) and runs, each with an empty Hub cache:

- inspect BASE
- drift BASE TRAINED
- revert --layers 0:N/2 BASE TRAINED OUT (half the layers from BASE)
- interpolate --alpha 0.3 --layers N/4:3N/4 BASE TRAINED OUT
- soup BASE TRAINED OUT
- merge (slerp, a reduction pass then the map) of BASE and TRAINED

once by ranges (`surgery CMD acme/base ...`) and once as snapshot_download of the repositories
(side by side) followed by the same command on the local snapshots (`--download` reads the same
way), and prints the bytes the server sent, the requests it answered, wall time and peak
private memory (RssAnon) of each.

Link mode (`--latency 0.04 --bandwidth 50`, seconds and MB/s, several `--latency`/`--bandwidth`
pairs for one table): the fake Hub waits a round trip per request, shares one bandwidth cap
between all bodies and redirects shard requests to a CDN host, as the real Hub does; the table
then gains the floor (the fewer bytes of the two ways / bandwidth) and each time's ratio to it.
Run by hand:  python bench/bench_ranges.py [--work DIR] [--layers 19] [--hidden 2048]
                  [--latency 0.04 --bandwidth 50 --latency 0.1 --bandwidth 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))
from bench_engine import llama_config, size_arguments, write_checkpoint
from measure import Measurement, measure

from tests.support.hub_server import FakeHub, Link

ROOT = Path(__file__).parents[1]
SHAS = {"acme/base": "a" * 40, "acme/trained": "b" * 40}
# The repositories side by side, as `--download` fetches a command's inputs.
DOWNLOAD = """
import sys
from concurrent.futures import ThreadPoolExecutor
from huggingface_hub import snapshot_download
from surgery.hub.resolve import ALLOW_PATTERNS
with ThreadPoolExecutor(len(sys.argv) - 1) as pool:
    list(pool.map(lambda r: snapshot_download(r, allow_patterns=ALLOW_PATTERNS), sys.argv[1:]))
"""


MERGE = """dtype: bfloat16
merge_method: slerp
base_model: acme/base
models: [{model: acme/base}, {model: acme/trained}]
parameters: {t: 0.3}
"""


@dataclass
class Row:
    command: str
    how: str
    sent: int  # bytes the server sent
    requests: int
    run: Measurement
    link: Link | None = None
    timeline: Timeline | None = None


@dataclass
class Timeline:
    """Where a run's seconds went on the link (from the fake Hub's log): before its first
    request, from there to its first shard (CDN) request, the link idle between that and the
    last byte, the tail after the last byte, and the link busy."""

    start: float
    metadata: float
    idle: float
    tail: float
    busy: float


def timeline(hub: FakeHub, since: tuple[int, int], started: float, ended: float) -> Timeline:
    """The `Timeline` of the run between `started` and `ended` (time.monotonic()) whose
    requests follow the `since` mark (`_mark`; busy stretches are taken by time)."""
    state, link = hub.state, hub.link
    arrived = state.arrived[since[2] :]
    hosts = [host for host, *_ in state.received[since[2] :]]
    first = arrived[0] if arrived else ended
    cdn = next((t for t, host in zip(arrived, hosts, strict=True) if host == "cdn"), first)
    busy = [(max(a, cdn), b) for a, b in link.busy if started <= b and a <= ended and b > cdn]
    last = max((b for _, b in busy), default=cdn)
    carried = sum(b - a for a, b in busy)
    return Timeline(first - started, cdn - first, last - cdn - carried, ended - last, carried)


def _env(hub: FakeHub, home: Path) -> dict[str, str]:
    shutil.rmtree(home, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return {
        **env,
        "HF_ENDPOINT": hub.endpoint,
        "HF_HOME": str(home),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONPATH": str(ROOT),
    }


def _traffic(hub: FakeHub, since: tuple[int, int, int]) -> tuple[int, int]:
    sent = sum(stop - start for _, _, start, stop in hub.state.served[since[0] :])
    return sent, len(hub.state.requests) - since[1]


def _mark(hub: FakeHub) -> tuple[int, int, int]:
    return len(hub.state.served), len(hub.state.requests), len(hub.state.received)


def _surgery(args: list[str], env: dict, inputs: list[str]) -> Measurement:
    result = measure([sys.executable, "-m", "cli", *args], env=env, inputs=inputs)
    if result.returncode != 0:
        raise SystemExit(f"surgery {' '.join(args)} failed with exit code {result.returncode}")
    return result


def _commands(work: Path, layers: int, folders: dict[str, Path]) -> dict:
    """Name -> (arguments, the repositories they read)."""
    out, both = work / "out", list(folders)
    config = work / "merge.yml"
    config.write_text(MERGE)
    half, quarter = layers // 2, layers // 4
    middle = f"{quarter}:{half + quarter}"
    return {
        "inspect": (["inspect", "acme/base"], ["acme/base"]),
        "drift": (["drift", "-q", *both], both),
        f"revert 0:{half}": (["revert", "-q", "--layers", f"0:{half}", *both, str(out)], both),
        f"interpolate {middle}": (
            ["interpolate", "-q", "--alpha", "0.3", "--layers", middle, *both, str(out)],
            both,
        ),
        "soup": (["soup", "-q", *both, str(out)], both),
        "merge slerp": (["merge", "-q", str(config), str(out)], both),
    }


def run(
    work: Path, layers: int, hidden: int, links: list[Link | None], only: list[str] | None = None
) -> list[Row]:
    """Build the checkpoints, serve them and measure every command (those whose name starts
    with one of `only`, when given) both ways on each link."""
    config = llama_config(layers, hidden)
    folders = {"acme/base": work / "base", "acme/trained": work / "trained"}
    for seed, folder in enumerate(folders.values()):
        if not folder.exists():
            write_checkpoint(folder, config, seed)
    served = [str(f) for f in folders.values()]  # warm on the server's side before each run
    commands = _commands(work, layers, folders)
    rows = []
    for link in links:
        with FakeHub(link) as hub:
            for repo, folder in folders.items():
                hub.add_model(repo, folder, SHAS[repo])
            for name, (args, repos) in commands.items():
                if only and not name.startswith(tuple(only)):
                    continue
                rows += _both_ways(hub, work, name, args, repos, served)
    shutil.rmtree(work / "out", ignore_errors=True)
    return rows


def _both_ways(
    hub: FakeHub, work: Path, name: str, args: list[str], repos: list[str], served: list[str]
) -> list[Row]:
    """One command by ranges, then by snapshot_download and the local command."""
    out, link = work / "out", hub.link if hub.link.cdn else None
    shutil.rmtree(out, ignore_errors=True)
    env, mark = _env(hub, work / "hf-ranges"), _mark(hub)
    ranges = Row(name, "ranges", 0, 0, _surgery(args, env, served), link)
    ranges.sent, ranges.requests = _traffic(hub, mark)
    ended = time.monotonic()
    ranges.timeline = timeline(hub, mark, ended - ranges.run.seconds, ended)

    shutil.rmtree(out, ignore_errors=True)
    env, mark = _env(hub, work / "hf-download"), _mark(hub)
    fetch = measure([sys.executable, "-c", DOWNLOAD, *repos], env=env, inputs=served)
    snapshots = work / "local.yml"
    local = [_local(work, a, repos, snapshots) for a in args]
    command = _surgery(local, env, [])
    both = Measurement(
        fetch.seconds + command.seconds,
        max(fetch.peak_anon, command.peak_anon),
        fetch.returncode or command.returncode,
    )
    download = Row(name, "snapshot_download + local", *_traffic(hub, mark), both, link)
    return [ranges, download]


def _local(work: Path, arg: str, repos: list[str], config: Path) -> str:
    """`arg` with Hub ids as their downloaded snapshots (in a merge config, too)."""
    cache = work / "hf-download" / "hub"

    def snapshot(repo: str) -> str:
        return str(cache / f"models--{repo.replace('/', '--')}" / "snapshots" / SHAS[repo])

    if arg.endswith(".yml"):
        text = Path(arg).read_text()
        for repo in SHAS:
            text = text.replace(repo, snapshot(repo))
        config.write_text(text)
        return str(config)
    return snapshot(arg) if arg in repos else arg


def report(rows: list[Row]) -> str:
    """A Markdown table, with each download row's ratio to the ranges row above it and, on a
    link, each time against the floor (the fewer bytes of the two ways at the link's bandwidth)."""
    lines = [
        "| link | command | how | MB sent | requests | wall s | floor s | vs floor "
        "| peak RssAnon MB | time vs ranges |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ranges, download in zip(rows[::2], rows[1::2], strict=True):
        link = ranges.link
        where = (
            "loopback"
            if link is None
            else f"{link.latency * 1e3:.0f} ms, {link.bandwidth / 1e6:.0f} MB/s"
        )
        floor = None
        if link is not None and link.bandwidth:
            floor = min(ranges.sent, download.sent) / link.bandwidth
        for row in (ranges, download):
            versus = "" if not floor else f"{row.run.seconds / floor:.2f}x"
            lines.append(
                f"| {where} | {row.command} | {row.how} | {row.sent / 1e6:.3f} | {row.requests} | "
                f"{row.run.seconds:.2f} | {'' if floor is None else f'{floor:.2f}'} | {versus} | "
                f"{row.run.peak_anon / 1e6:.0f} | {row.run.seconds / ranges.run.seconds:.2f}x |"
            )
    return "\n".join(lines)


def report_timelines(rows: list[Row]) -> str:
    """Where the seconds of each ranges run on a link went (`Timeline`), as a Markdown table."""
    lines = [
        "| link | command | to first request s | to first shard request s | link idle s "
        "| tail s | link busy s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row.timeline is None or row.link is None:
            continue
        t, link = row.timeline, row.link
        where = f"{link.latency * 1e3:.0f} ms, {link.bandwidth / 1e6:.0f} MB/s"
        lines.append(
            f"| {where} | {row.command} | {t.start:.2f} | {t.metadata:.2f} | {t.idle:.2f} "
            f"| {t.tail:.2f} | {t.busy:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, action="append", default=[], help="seconds")
    parser.add_argument("--bandwidth", type=float, action="append", default=[], help="MB/s")
    parser.add_argument("--only", action="append", help="commands to run (name prefixes)")
    args = size_arguments(__doc__, "bench/out-ranges", parser)
    if len(args.latency) != len(args.bandwidth):
        raise SystemExit("give as many --latency as --bandwidth (one link each)")
    links = [
        Link(latency=t, bandwidth=b * 1e6)
        for t, b in zip(args.latency, args.bandwidth, strict=True)
    ]
    rows = run(args.work, args.layers, args.hidden, links or [None], args.only)
    print(report(rows))
    if links:
        print()
        print(report_timelines(rows))


if __name__ == "__main__":
    main()

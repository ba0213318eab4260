"""Benchmark: Hub ids read by HTTP range requests against snapshot_download then the local command.

Builds a Llama-shaped bf16 base and trained checkpoint (two shards each; about 0.97B parameters =
1.9 GB each by default, as bench_engine.py), serves them from the loopback fake Hub of the tests
(tests/support/hub_server.py) and runs, each with an empty Hub cache:

- inspect BASE
- drift BASE TRAINED
- revert --layers 0:N/2 BASE TRAINED OUT (half the layers from BASE)

once by ranges (`surgery CMD acme/base ...`) and once as snapshot_download of the repositories
followed by the same command on the local snapshots, and prints the bytes the server sent, the
requests it answered, wall time and peak private memory (RssAnon) of each.
Run by hand:  python bench/bench_ranges.py [--work DIR] [--layers 19] [--hidden 2048]
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))
from bench_engine import llama_config, size_arguments, write_checkpoint
from measure import Measurement, measure

from tests.support.hub_server import FakeHub

ROOT = Path(__file__).parents[1]
SHAS = {"acme/base": "a" * 40, "acme/trained": "b" * 40}
DOWNLOAD = """
import sys
from huggingface_hub import snapshot_download
from surgery.hub.resolve import ALLOW_PATTERNS
for repo in sys.argv[1:]:
    snapshot_download(repo, allow_patterns=ALLOW_PATTERNS)
"""


@dataclass
class Row:
    command: str
    how: str
    sent: int  # bytes the server sent
    requests: int
    run: Measurement


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


def _traffic(hub: FakeHub, since: tuple[int, int]) -> tuple[int, int]:
    sent = sum(stop - start for _, _, start, stop in hub.state.served[since[0] :])
    return sent, len(hub.state.requests) - since[1]


def _mark(hub: FakeHub) -> tuple[int, int]:
    return len(hub.state.served), len(hub.state.requests)


def _surgery(args: list[str], env: dict, inputs: list[str]) -> Measurement:
    result = measure([sys.executable, "-m", "cli", *args], env=env, inputs=inputs)
    if result.returncode != 0:
        raise SystemExit(f"surgery {' '.join(args)} failed with exit code {result.returncode}")
    return result


def run(work: Path, layers: int, hidden: int) -> list[Row]:
    """Build the checkpoints, serve them and measure every command both ways."""
    config = llama_config(layers, hidden)
    folders = {"acme/base": work / "base", "acme/trained": work / "trained"}
    for seed, folder in enumerate(folders.values()):
        if not folder.exists():
            write_checkpoint(folder, config, seed)
    served = [str(f) for f in folders.values()]  # warm on the server's side before each run
    out = work / "out"
    commands = {
        "inspect": (["inspect", "acme/base"], ["acme/base"]),
        "drift": (["drift", "-q", "acme/base", "acme/trained"], list(folders)),
        f"revert 0:{layers // 2}": (
            ["revert", "-q", "--layers", f"0:{layers // 2}", "acme/base", "acme/trained", str(out)],
            list(folders),
        ),
    }
    rows = []
    with FakeHub() as hub:
        for repo, folder in folders.items():
            hub.add_model(repo, folder, SHAS[repo])
        for name, (args, repos) in commands.items():
            shutil.rmtree(out, ignore_errors=True)
            env, mark = _env(hub, work / "hf-ranges"), _mark(hub)
            measured = _surgery(args, env, served)
            rows.append(Row(name, "ranges", *_traffic(hub, mark), measured))

            shutil.rmtree(out, ignore_errors=True)
            env, mark = _env(hub, work / "hf-download"), _mark(hub)
            fetch = measure([sys.executable, "-c", DOWNLOAD, *repos], env=env, inputs=served)
            cache = work / "hf-download" / "hub"
            local = [
                str(cache / f"models--{r.replace('/', '--')}" / "snapshots" / SHAS[r])
                if r in repos
                else r
                for r in args
            ]
            command = _surgery(local, env, [])
            both = Measurement(
                fetch.seconds + command.seconds,
                max(fetch.peak_anon, command.peak_anon),
                fetch.returncode or command.returncode,
            )
            rows.append(Row(name, "snapshot_download + local", *_traffic(hub, mark), both))
    shutil.rmtree(out, ignore_errors=True)
    return rows


def report(rows: list[Row]) -> str:
    """A Markdown table, with each download row's ratio to the ranges row above it."""
    lines = [
        "| command | how | MB sent | requests | wall s | peak RssAnon MB | bytes vs ranges "
        "| time vs ranges |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ranges: Row | None = None
    for row in rows:
        ranges = row if row.how == "ranges" else ranges
        assert ranges is not None
        lines.append(
            f"| {row.command} | {row.how} | {row.sent / 1e6:.3f} | {row.requests} | "
            f"{row.run.seconds:.2f} | {row.run.peak_anon / 1e6:.0f} | "
            f"{row.sent / max(1, ranges.sent):.1f}x | {row.run.seconds / ranges.run.seconds:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    args = size_arguments(__doc__, "bench/out-ranges")
    print(report(run(args.work, args.layers, args.hidden)))


if __name__ == "__main__":
    main()

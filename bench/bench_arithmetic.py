"""Benchmark: `surgery merge --mergekit-arithmetic` against mergekit-yaml and the default mode.

On bench_merge's checkpoints (a base and three experts, 0.97B parameters by default), one bf16
DARE-TIES config at density 1 (no random mask: mergekit's output is deterministic) is run by
`surgery merge`, `surgery merge --mergekit-arithmetic` and `mergekit-yaml`, each alone with warm
inputs. Prints wall time, peak private memory (RssAnon) and how many output elements differ in
their bits from mergekit's.
Run by hand:  python bench/bench_arithmetic.py [--work DIR] [--layers 19] [--hidden 2048]
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from safetensors import safe_open

sys.path.insert(0, str(Path(__file__).parent))
from bench_engine import ensure_checkpoints, size_arguments
from measure import measure

INPUTS = ("base", "expert1", "expert2", "expert3")


def config_text(work: Path) -> str:
    models = "".join(
        f"  - model: {work / f'expert{i}'}\n    parameters: {{weight: {w}, density: 1.0}}\n"
        for i, w in ((1, 0.5), (2, 0.3), (3, 0.2))
    )
    return (
        f"merge_method: dare_ties\ndtype: bfloat16\nbase_model: {work / 'base'}\nmodels:\n{models}"
    )


def _tensors(folder: Path) -> dict[str, Path]:
    found = {}
    for file in folder.glob("*.safetensors"):
        with safe_open(file, "pt") as handle:
            found.update(dict.fromkeys(handle.keys(), file))
    return found


def differing(ours: Path, theirs: Path) -> tuple[int, int]:
    """(elements whose bits differ, elements) over every tensor, one tensor at a time."""
    mine, reference = _tensors(ours), _tensors(theirs)
    if set(mine) != set(reference):
        raise SystemExit(f"{ours} and {theirs} hold different tensors")
    differ = total = 0
    for name, file in reference.items():
        with safe_open(file, "pt") as a, safe_open(mine[name], "pt") as b:
            x, y = a.get_tensor(name), b.get_tensor(name)
        differ += int(
            (x.view(torch.uint8) != y.view(torch.uint8)).reshape(x.numel(), -1).any(1).sum()
        )
        total += x.numel()
    return differ, total


def main() -> None:
    args = size_arguments(__doc__, "bench/out")
    work = args.work
    ensure_checkpoints(work, args.layers, args.hidden, INPUTS)
    config = work / "arithmetic.yml"
    config.write_text(config_text(work))
    surgery = [sys.executable, "-m", "cli", "merge", "-q", str(config)]
    runs = {
        "mergekit-yaml": ["mergekit-yaml", str(config), "--quiet", "--no-copy-tokenizer"],
        "surgery merge": surgery,
        "surgery merge --mergekit-arithmetic": [*surgery, "--mergekit-arithmetic"],
    }
    inputs = [str(work / name) for name in INPUTS]
    outs = {name: work / f"out-arithmetic-{i}" for i, name in enumerate(runs)}
    print("| run | wall s | peak RssAnon MB | elements differing from mergekit |")
    print("|---|---|---|---|")
    try:
        for name, command in runs.items():
            shutil.rmtree(outs[name], ignore_errors=True)
            if name == "mergekit-yaml":
                command = [*command[:2], str(outs[name]), *command[2:]]
            else:
                command = [*command, str(outs[name])]
            result = measure(command, inputs=inputs)
            if result.returncode != 0:
                raise SystemExit(f"{name} failed (exit {result.returncode})")
            share = "-"
            if name != "mergekit-yaml":
                differ, total = differing(outs[name], outs["mergekit-yaml"])
                share = f"{differ} of {total} ({100 * differ / total:.2f}%)"
            print(f"| {name} | {result.seconds:.1f} | {result.peak_anon / 2**20:.0f} | {share} |")
    finally:
        for out in outs.values():
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()

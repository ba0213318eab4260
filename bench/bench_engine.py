"""Benchmark: soup, plain merges, revert and interpolate against their I/O floor and mergekit.

Builds Llama-shaped bf16 checkpoints (a base, a trained model and three experts, two shards
each; about 0.97B parameters = 1.9 GB each by default), then runs, in one process tree at a time:

- soup of three experts:  surgery soup | mergekit-yaml (linear) | naive (load all, average, save)
- linear, task_arithmetic, slerp:  surgery merge | mergekit-yaml, with bench_merge's YAML
  (linear is the soup's YAML: its mergekit row is the soup's)
- revert of layers 6:13:  surgery revert | mergekit-yaml (passthrough slices) | cp -r TRAINED
- interpolate alpha 0.3:  surgery interpolate | mergekit-yaml (linear, weights 0.7/0.3)

and, for each, its I/O floor (`IO_FLOOR`): one process that reads every input once and writes
one output of the same size, nothing else. It prints wall time, CPU time (user + system) and
peak private memory (RssAnon) of each with ratios to ours, then each operation over its floor
(bound: 1.5x) and over mergekit, and the cores and load average at the start and the end.
Run by hand:  python bench/bench_engine.py [--work DIR] [--layers 19] [--hidden 2048] [--repeat 3]
              [--no-peers]   (surgery and the floors only)

With --layouts, only a revert side by side: BASE in TRAINED's layout (the same-layout revert
above) against BASE as a multimodal checkpoint (the same weights under Llava's published names,
`language_model.model.*`, beside a vision tower), TRAINED text-only either way.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))
from measure import Measurement, measure, median_run

VOCAB = 32000


def llama_config(layers: int, hidden: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": hidden * 11 // 4,
        "num_hidden_layers": layers,
        "num_attention_heads": hidden // 64,
        "num_key_value_heads": max(1, hidden // 512),
        "vocab_size": VOCAB,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }


def llama_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    h, i = config["hidden_size"], config["intermediate_size"]
    kv = config["num_key_value_heads"] * 64
    shapes = {"model.embed_tokens.weight": (VOCAB, h)}
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes |= {
            p + "self_attn.q_proj.weight": (h, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
    shapes |= {"model.norm.weight": (h,), "lm_head.weight": (VOCAB, h)}
    return shapes


def write_checkpoint(path: Path, config: dict, seed: int) -> None:
    """Two shards of random bf16 weights with an index, written one shard at a time."""
    path.mkdir(parents=True)
    shapes = list(llama_shapes(config).items())
    half = len(shapes) // 2
    gen = torch.Generator().manual_seed(seed)
    weight_map = {}
    for number, part in enumerate((shapes[:half], shapes[half:]), start=1):
        name = f"model-{number:05d}-of-00002.safetensors"
        tensors = {
            key: (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
            for key, shape in part
        }
        save_file(tensors, path / name, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, name)
        del tensors
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    (path / "config.json").write_text(json.dumps(config))


@dataclass
class Timed(Measurement):
    """A measurement with the CPU time (user + system) of the process tree, in seconds: what
    the run costs the cores, which a busy machine changes less than the wall time."""

    cpu: float = 0.0


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], out: Path, inputs: list[str]) -> Timed:
    """Measure one run with warm inputs, then delete its output: old outputs would otherwise
    fill the page cache and push the next run's inputs out of it."""
    before = _children_cpu()
    result = measure(command, inputs=inputs)
    cpu = _children_cpu() - before  # the command's process tree, reaped by `measure`
    shutil.rmtree(out, ignore_errors=True)
    return Timed(**vars(result), cpu=cpu)


def median_timed(runs: Sequence[Timed]) -> Timed:
    """`median_run`, with the median CPU time."""
    return Timed(**vars(median_run(runs)), cpu=statistics.median(r.cpu for r in runs))


def mergekit(config_text: str, work: Path, name: str, inputs: list[str]) -> Measurement:
    config_path = work / f"{name}.yml"
    config_path.write_text(config_text)
    command = [
        "mergekit-yaml",
        str(config_path),
        str(work / name),
        "--quiet",
        "--no-copy-tokenizer",
        "--no-write-model-card",
    ]
    return timed(command, work / name, inputs)


def surgery(args: list[str], out: Path, inputs: list[str]) -> Measurement:
    return timed([sys.executable, "-m", "cli", *args, str(out), "-q"], out, inputs)


NAIVE_SOUP = """
import sys, glob, os
from safetensors.torch import load_file, save_file
experts, out = sys.argv[1:-1], sys.argv[-1]
states = [{k: v for f in sorted(glob.glob(e + "/*.safetensors")) for k, v in load_file(f).items()}
          for e in experts]
merged = {k: (sum(s[k].float() for s in states) / len(states)).to(states[0][k].dtype)
          for k in states[0]}
os.makedirs(out)
save_file(merged, out + "/model.safetensors")
"""


# Every benchmark's checkpoints, each with its own seed whichever benchmark builds it first.
CHECKPOINTS = ("base", "trained", "expert1", "expert2", "expert3")


def ensure_checkpoints(work: Path, layers: int, hidden: int, names: Sequence[str]) -> None:
    """Build the named checkpoints (of `CHECKPOINTS`) that `work` does not hold yet."""
    config = llama_config(layers, hidden)
    for name in names:
        if not (work / name).exists():
            print(f"building {name} ...", file=sys.stderr)
            write_checkpoint(work / name, config, CHECKPOINTS.index(name))


FLOOR = "I/O floor"
# The bound issue 42 sets for a plain merge or soup: its time over its I/O floor's.
FLOOR_BOUND = 1.5

# The I/O floor of an operation: one process that reads every input's safetensors files once
# (`readinto` a reused 16 MiB buffer, as `cat` would) and writes one output of the template's size,
# from the same buffer as the template is read (as `cp` would). No arithmetic, no hash, no
# check: what no streaming tool can avoid.  argv: OUT TEMPLATE [OTHER INPUT ...]
IO_FLOOR = """
import os, sys
out, template, *others = sys.argv[1:]
buffer = bytearray(16 * 2**20)
view = memoryview(buffer)
def shards(folder):
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".safetensors"))
for folder in others:
    for path in shards(folder):
        with open(path, "rb", buffering=0) as source:
            while source.readinto(buffer):
                pass
os.makedirs(out)
for path in shards(template):
    target = os.path.join(out, os.path.basename(path))
    with open(path, "rb", buffering=0) as source, open(target, "xb", buffering=0) as sink:
        while count := source.readinto(buffer):
            done = 0
            while done < count:
                done += sink.write(view[done:count])
"""


def io_floor(work: Path, name: str, template: str, others: Sequence[str]) -> Measurement:
    """The I/O floor (`IO_FLOOR`) of an operation whose output is `template`'s size and which
    reads `template` and `others` once."""
    out = work / name
    command = [sys.executable, "-c", IO_FLOOR, str(out), template, *others]
    return timed(command, out, [template, *others])


def merge(method: str, work: Path, layers: int, inputs: list[str]) -> Measurement:
    """`surgery merge` with bench_merge's config for `method`."""
    from bench_merge import config_text

    path = work / f"{method}.yml"
    path.write_text(config_text(method, work, layers))
    out = work / f"out-{method}"
    return timed([sys.executable, "-m", "cli", "merge", str(path), str(out), "-q"], out, inputs)


def run(
    work: Path, layers: int, hidden: int, repeat: int = 1, peers: bool = True
) -> list[tuple[str, str, Measurement]]:
    """Every operation with surgery, its I/O floor and (with `peers`) mergekit and the other
    references, each tool once per round; the median of `repeat` rounds."""
    from bench_merge import config_text

    ensure_checkpoints(work, layers, hidden, CHECKPOINTS)
    for old in work.iterdir():
        if old.name.startswith("out-") or old.suffix == ".yml":
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    b, t = str(work / "base"), str(work / "trained")
    experts = [str(work / f"expert{i}") for i in (1, 2, 3)]
    lo, hi = layers // 3, 2 * layers // 3
    passthrough = (
        "merge_method: passthrough\ndtype: bfloat16\nslices:\n"
        f"  - sources: [{{model: {t}, layer_range: [0, {lo}]}}]\n"
        f"  - sources: [{{model: {b}, layer_range: [{lo}, {hi}]}}]\n"
        f"  - sources: [{{model: {t}, layer_range: [{hi}, {layers}]}}]\n"
    )
    interp = (
        "merge_method: linear\ndtype: bfloat16\nmodels:\n"
        f"  - model: {b}\n    parameters: {{weight: 0.7}}\n"
        f"  - model: {t}\n    parameters: {{weight: 0.3}}\n"
    )
    pair, with_base = [b, t], [b, *experts]
    naive = [sys.executable, "-c", NAIVE_SOUP, *experts, str(work / "out-naive")]
    commands: list[tuple[str, str, Callable[[], Measurement]]] = [
        ("soup", "surgery", lambda: surgery(["soup", *experts], work / "out-soup", experts)),
        ("soup", FLOOR, lambda: io_floor(work, "out-floor", experts[0], experts[1:])),
        (
            "soup",
            "mergekit",
            lambda: mergekit(config_text("linear", work, layers), work, "out-mk", experts),
        ),
        ("soup", "naive", lambda: timed(naive, work / "out-naive", experts)),
        ("linear", "surgery", lambda: merge("linear", work, layers, experts)),
        ("linear", FLOOR, lambda: io_floor(work, "out-floor", experts[0], experts[1:])),
        (
            "task_arithmetic",
            "surgery",
            lambda: merge("task_arithmetic", work, layers, with_base),
        ),
        ("task_arithmetic", FLOOR, lambda: io_floor(work, "out-floor", b, experts)),
        (
            "task_arithmetic",
            "mergekit",
            lambda: mergekit(
                config_text("task_arithmetic", work, layers), work, "out-mk", with_base
            ),
        ),
        ("slerp", "surgery", lambda: merge("slerp", work, layers, [b, experts[0]])),
        ("slerp", FLOOR, lambda: io_floor(work, "out-floor", b, experts[:1])),
        (
            "slerp",
            "mergekit",
            lambda: mergekit(config_text("slerp", work, layers), work, "out-mk", [b, experts[0]]),
        ),
        (
            "revert",
            "surgery",
            lambda: surgery(["revert", "--layers", f"{lo}:{hi}", b, t], work / "out-rev", pair),
        ),
        # A revert reads a third of BASE and two thirds of TRAINED: one checkpoint, as a copy.
        ("revert", FLOOR, lambda: io_floor(work, "out-floor", t, [])),
        ("revert", "mergekit", lambda: mergekit(passthrough, work, "out-mk", pair)),
        (
            "revert",
            "cp -r",
            lambda: timed(["cp", "-r", t, str(work / "out-cp")], work / "out-cp", [t]),
        ),
        (
            "interpolate",
            "surgery",
            lambda: surgery(["interpolate", "--alpha", "0.3", b, t], work / "out-int", pair),
        ),
        ("interpolate", FLOOR, lambda: io_floor(work, "out-floor", t, [b])),
        ("interpolate", "mergekit", lambda: mergekit(interp, work, "out-mk", pair)),
    ]
    if not peers:
        commands = [c for c in commands if c[1] in ("surgery", FLOOR)]
    runs: dict[tuple[str, str], list[Measurement]] = {(op, tool): [] for op, tool, _ in commands}
    for _ in range(repeat):  # every command once per round: a slow spell hits them all
        for op, tool, command in commands:
            runs[op, tool].append(command())
    return [(op, tool, median_timed(measured)) for (op, tool), measured in runs.items()]


# A small vision tower beside the multimodal BASE: tensors with no counterpart in TRAINED.
VISION = {
    f"vision_tower.vision_model.encoder.layers.{n}.mlp.fc{k}.weight": (1024, 1024)
    for n in range(4)
    for k in (1, 2)
} | {"multi_modal_projector.linear_1.weight": (1024, 1024)}


def write_multimodal(base: Path, out: Path) -> None:
    """BASE's weights under a multimodal checkpoint's published names (`language_model.model.*`,
    `language_model.lm_head.*`) with a vision tower and projector, shard by shard (bounded
    memory), and a Llava config whose text_config is BASE's."""
    from safetensors.torch import load_file

    out.mkdir(parents=True)
    index = json.loads((base / "model.safetensors.index.json").read_text())
    weight_map = {}
    shards = sorted(set(index["weight_map"].values()))
    for number, shard in enumerate(shards):
        tensors = {f"language_model.{name}": t for name, t in load_file(base / shard).items()}
        if number == len(shards) - 1:
            gen = torch.Generator().manual_seed(99)
            tensors |= {
                name: (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
                for name, shape in VISION.items()
            }
        save_file(tensors, out / shard, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, shard)
        del tensors
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    text = json.loads((base / "config.json").read_text())
    config = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava"}
    (out / "config.json").write_text(json.dumps({**config, "text_config": text}))


def run_layouts(
    work: Path, layers: int, hidden: int, repeat: int = 1
) -> list[tuple[str, str, Measurement]]:
    """A revert of the middle third with BASE in TRAINED's layout, then as a multimodal
    checkpoint (see `write_multimodal`): the name-mapping step's cost, side by side."""
    ensure_checkpoints(work, layers, hidden, ("base", "trained"))
    if not (work / "base-multimodal").exists():
        print("building base-multimodal ...", file=sys.stderr)
        write_multimodal(work / "base", work / "base-multimodal")
    b, m, t = (str(work / n) for n in ("base", "base-multimodal", "trained"))
    spec = f"{layers // 3}:{2 * layers // 3}"
    commands = [
        (
            "revert",
            "surgery",
            lambda: surgery(["revert", "--layers", spec, b, t], work / "o", [b, t]),
        ),
        (
            "revert",
            "surgery, multimodal BASE",
            lambda: surgery(["revert", "--layers", spec, m, t], work / "o", [m, t]),
        ),
    ]
    runs: dict[str, list[Measurement]] = {tool: [] for _, tool, _ in commands}
    for _ in range(repeat):
        for _, tool, command in commands:
            runs[tool].append(command())
    return [("revert", tool, median_timed(measured)) for tool, measured in runs.items()]


def report(results: list[tuple[str, str, Measurement]]) -> str:
    """Every tool's row with its ratios to surgery, then each operation against its I/O floor
    and mergekit (the linear merge runs soup's YAML in mergekit: its row is soup's)."""
    ours = {op: m for op, tool, m in results if tool == "surgery"}
    lines = [
        "| operation | tool | wall s | CPU s | peak RssAnon MB | time vs surgery "
        "| memory vs surgery |",
        "|---|---|---|---|---|---|---|",
    ]
    for op, tool, m in results:
        status = "" if m.returncode == 0 else f" (exit {m.returncode})"
        lines.append(
            f"| {op} | {tool}{status} | {m.seconds:.1f} | {getattr(m, 'cpu', 0):.1f} | "
            f"{m.peak_anon / 2**20:.0f} | "
            f"{m.seconds / ours[op].seconds:.2f}x | "
            f"{m.peak_anon / max(1, ours[op].peak_anon):.2f}x |"
        )
    floors = {op: m for op, tool, m in results if tool == FLOOR}
    peers = {op: m for op, tool, m in results if tool == "mergekit"}
    peers.setdefault("linear", peers.get("soup"))
    lines += [
        "",
        f"| operation | surgery s | I/O floor s | surgery / floor (bound {FLOOR_BOUND}x) "
        "| mergekit s | surgery / mergekit |",
        "|---|---|---|---|---|---|",
    ]
    for op, m in ours.items():
        cells = [f"{m.seconds:.2f}"]
        for reference in (floors.get(op), peers.get(op)):
            ratio = f"{m.seconds / reference.seconds:.2f}x" if reference else "-"
            cells += [f"{reference.seconds:.2f}" if reference else "-", ratio]
        lines.append(f"| {op} | {' | '.join(cells)} |")
    return "\n".join(lines)


def machine() -> str:
    """The cores and the load average, for the line under each table."""
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    return f"{os.cpu_count()} cores, load {load}"


def size_arguments(
    doc: str, work: str, parser: argparse.ArgumentParser | None = None
) -> argparse.Namespace:
    """Parse --work/--layers/--hidden (shared by the benchmarks that build Llama-shaped bf16
    checkpoints), create the work folder, and say how large the checkpoints will be."""
    parser = parser or argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path(work))
    parser.add_argument("--layers", type=int, default=19)
    parser.add_argument("--hidden", type=int, default=2048)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    params = sum(
        torch.Size(s).numel() for s in llama_shapes(llama_config(args.layers, args.hidden)).values()
    )
    print(
        f"Llama-shaped bf16, {params / 1e9:.2f}B parameters, {2 * params / 1e9:.2f} GB each",
        file=sys.stderr,
    )
    return args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs per command (median time)")
    parser.add_argument(
        "--layouts",
        action="store_true",
        help="only the revert from a multimodal BASE, side by side",
    )
    parser.add_argument(
        "--no-peers", action="store_true", help="surgery and its I/O floors only (no mergekit)"
    )
    args = size_arguments(__doc__, "bench/out", parser)
    started = machine()
    if args.layouts:
        results = run_layouts(args.work, args.layers, args.hidden, args.repeat)
    else:
        results = run(args.work, args.layers, args.hidden, args.repeat, peers=not args.no_peers)
    print(report(results))
    print(f"\n{started} at the start, {machine().split(', ')[1]} at the end")


if __name__ == "__main__":
    main()

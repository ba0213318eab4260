"""inspect: what a checkpoint holds, from headers alone."""

from __future__ import annotations

import json
from collections import Counter

import yaml

from surgery.core.layers import stack_layer
from surgery.engine.reader import Checkpoint


def describe(checkpoint: Checkpoint) -> dict:
    """A JSON-ready summary: shards, tensor and parameter counts, dtypes, stacks, recipe."""
    params_by_dtype: Counter[str] = Counter()
    for tensor in checkpoint:
        params_by_dtype[tensor.dtype] += tensor.numel
    config = {}
    if checkpoint.folder is not None and (checkpoint.folder / "config.json").is_file():
        raw = json.loads((checkpoint.folder / "config.json").read_text())
        config = {k: raw[k] for k in ("model_type", "architectures") if k in raw}
    return {
        "path": str(checkpoint.path),
        "config": config,
        "shards": [
            {"file": s.path.name, "bytes": s.size, "tensors": len(s.tensors)}
            for s in checkpoint.shards
        ],
        "tensors": len(checkpoint.tensors),
        "parameters": checkpoint.num_params,
        "bytes": checkpoint.total_bytes,
        "dtypes": dict(params_by_dtype.most_common()),
        "stacks": [
            {"name": s.name, "prefix": s.prefix, "layers": s.num_layers, "beyond": s.beyond}
            for s in checkpoint.stacks
        ],
        "tensors_outside_stacks": sum(
            all(stack_layer(name, s) is None for s in checkpoint.stacks)
            for name in checkpoint.tensors
        ),
        "recipe": checkpoint.recipe,
    }


def _human(count: float, unit: str = "") -> str:
    for prefix in ("", "K", "M", "G", "T"):
        if abs(count) < 1000:
            return f"{count:.1f} {prefix}{unit}".replace(".0 ", " ")
        count /= 1000
    return f"{count:.1f} P{unit}"


def format_description(info: dict) -> str:
    """The summary as a few readable lines."""
    lines = [f"checkpoint  {info['path']}"]
    if info["config"]:
        arch = ", ".join(info["config"].get("architectures") or [])
        lines.append(f"model       {info['config'].get('model_type', '?')} ({arch})")
    lines.append(
        f"size        {_human(info['parameters'])} parameters, {_human(info['bytes'], 'B')}, "
        f"{info['tensors']} tensors in {len(info['shards'])} shard(s)"
    )
    dtypes = ", ".join(f"{d} {_human(n)}" for d, n in info["dtypes"].items())
    lines.append(f"dtypes      {dtypes}")
    for stack in info["stacks"]:
        past = f", and {stack['beyond']} past the config's count" if stack["beyond"] else ""
        lines.append(
            f"stack       {stack['name']}: {stack['layers']} layers ({stack['prefix']}.N){past}"
        )
    if not info["stacks"]:
        lines.append("stack       none found")
    lines.append(f"other       {info['tensors_outside_stacks']} tensors outside the layer stacks")
    for shard in info["shards"]:
        lines.append(
            f"shard       {shard['file']}  {_human(shard['bytes'], 'B')}  "
            f"{shard['tensors']} tensors"
        )
    if info["recipe"]:
        recipe = info["recipe"]
        params = {
            k: v for k, v in recipe.items() if k not in ("tool", "version", "inputs", "operation")
        }
        lines.append(f"recipe      {recipe.get('operation')}")
        # One setting a line, nested ones indented (YAML), not one long JSON line.
        block = yaml.safe_dump(params, sort_keys=True, default_flow_style=False, width=88)
        lines += [f"{'':12}{line}" for line in block.splitlines() if params]
        lines += [
            f"{'inputs' if i == 0 else '':12}{e['role']}: {e['path']}"
            for i, e in enumerate(recipe.get("inputs", []))
        ]
    return "\n".join(lines)

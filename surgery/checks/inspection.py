"""inspect: what a checkpoint holds, or how two checkpoints' tensors match, from headers alone."""

from __future__ import annotations

import json
from collections import Counter

import yaml

from surgery.core.errors import MismatchError
from surgery.core.layers import stack_layer
from surgery.engine.matching import match
from surgery.engine.naming import layout_of
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


def compare(a: Checkpoint, b: Checkpoint) -> dict:
    """How two checkpoints' tensors match (`surgery.engine.naming`), tensor by tensor, and what
    revert, interpolate and soup make of it: a JSON-ready summary."""
    layouts = layout_of(a.tensors), layout_of(b.tensors)
    theirs = layouts[1].actual()
    rows: list[dict] = []
    matched = set()
    for name, canonical in layouts[0].canonical.items():
        other = theirs.get(canonical)
        matched.add(other)
        shapes = "same"
        if other is not None and a.tensors[name].shape != b.tensors[other].shape:
            shapes = f"{list(a.tensors[name].shape)} / {list(b.tensors[other].shape)}"
        rows.append({"a": name, "b": other, "shapes": shapes if other is not None else None})
    rows += [{"a": None, "b": n, "shapes": None} for n in b.tensors if n not in matched]
    return {
        "a": {"path": str(a.path), "layout": layouts[0].kind},
        "b": {"path": str(b.path), "layout": layouts[1].kind},
        "tensors": rows,
        "verdicts": {
            "revert, interpolate, drift (A as TRAINED)": _verdict(a, b, lonely=True),
            "soup, merge": _verdict(a, b, lonely=False),
        },
    }


def _verdict(a: Checkpoint, b: Checkpoint, *, lonely: bool) -> str:
    """`match`'s answer for A and B under a command's rules: matched, or its one-line error."""
    try:
        matching = match(
            [a, b],
            ["A", "B"],
            float_dtypes_may_differ=True,
            vocabulary=lonely,
            lonely="" if lonely else None,
            announce=False,
        )
    except MismatchError as error:
        return f"refused: {error}"
    if matching.exact:
        return "matched: same names and shapes"
    found = [
        "across layouts" if matching.renamed else "",
        f"{sum(map(len, matching.lonely))} tensors without counterpart"
        if any(matching.lonely)
        else "",
        f"{len(matching.rows)} tensors whose vocabulary rows differ" if matching.rows else "",
    ]
    return "matched: " + ", ".join(part for part in found if part)


def format_comparison(info: dict) -> str:
    """The matching as lines: A's name <- B's name, tensors without counterpart, verdicts."""
    lines = [
        f"A           {info['a']['path']} ({info['a']['layout']})",
        f"B           {info['b']['path']} ({info['b']['layout']})",
    ]
    for row in info["tensors"]:
        a, b = row["a"] or "(no counterpart)", row["b"] or "(no counterpart)"
        shapes = f"  shapes {row['shapes']}" if row["shapes"] not in (None, "same") else ""
        same = "" if row["a"] != row["b"] else "  (same name)"
        lines.append(f"tensor      {a}  <-  {b}{same}{shapes}")
    for command, verdict in info["verdicts"].items():
        lines.append(f"{command}: {verdict}")
    return "\n".join(lines)

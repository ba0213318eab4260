"""Layer addressing: which layer of which stack a tensor belongs to, and layer specs.

One parser serves the surgery commands and the training wrapper:

- `9:28`        half-open slice, as in Python (layers 9..27)
- `-6:`         negatives count from the end
- `0:9,28:34`   unions
- `5`, `-1`     single layers
- `9:28=0.05,*=0.001`  per-range values; `*` is every other layer and every tensor outside the
                       layer stack (embeddings, final norm, head)

Unlike Python slices, a bound outside the model is an error, not silently clipped: `9:40` on a
34-layer model is almost always a mistake (a spec written for another model).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from surgery.core.errors import LayerSpecError
from surgery.core.modules import ModuleFilter

# The first `<prefix ending in a stack keyword>.<N>.` in a tensor name. Matches
# `model.layers.N.` (Llama, Mistral, Qwen, Gemma), `language_model.model.layers.N.` (Gemma-3
# multimodal on disk), `vision_tower.vision_model.encoder.layers.N.` (its vision tower),
# `transformer.h.N.` (GPT-2), `gpt_neox.layers.N.`, `encoder.layer.N.` (BERT), `visual.blocks.N.`
# (Qwen2-VL's vision tower) and `encoder.block.N.` (T5: the first keyword wins, so its
# `encoder.block.N.layer.M.` is block N, not a stack per block).
_LAYER_RE = re.compile(r"^(?P<prefix>(?:\w+\.)*?(?:layers|layer|h|blocks|block))\.(?P<index>\d+)\.")
# Words of a stack's prefix that say which kind of stack it is; any other stack is "text".
_KIND_WORDS = {"vision": ("vision", "visual"), "audio": ("audio",)}


@dataclass(frozen=True)
class Stack:
    """A stack of numbered layers, e.g. the decoder layers or a vision tower's encoder layers."""

    prefix: str  # e.g. "model.layers"
    name: str  # "text", "vision", "audio", or the prefix when names would collide
    num_layers: int
    # Numbered layers past the config's layer count, outside the stack (DeepSeek-V3's
    # multi-token-prediction layer `model.layers.61` of 61 layers): layer specs never reach them.
    beyond: int = 0


def layer_of(name: str) -> tuple[str, int] | None:
    """Return `(stack prefix, layer index)` of a tensor name, or None outside any stack."""
    match = _LAYER_RE.match(name)
    if match is None:
        return None
    return match["prefix"], int(match["index"])


def _kind_of(prefix: str) -> str:
    for kind, words in _KIND_WORDS.items():
        if any(word in prefix for word in words):
            return kind
    return "text"


def find_stacks(names: Iterable[str], text_layers: int | None = None) -> list[Stack]:
    """Group tensor names into layer stacks; text stacks first, then by prefix.

    Args:
        text_layers: the config's layer count of the text stack (`num_hidden_layers`), if known.
            Layers of a single text stack numbered past it are left outside the stack (its
            `beyond` counts them).
    """
    counts: dict[str, int] = {}
    for name in names:
        ref = layer_of(name)
        if ref is not None:
            counts[ref[0]] = max(counts.get(ref[0], 0), ref[1] + 1)
    kinds = {prefix: _kind_of(prefix) for prefix in counts}
    single_text = list(kinds.values()).count("text") == 1
    stacks = []
    for prefix, count in counts.items():
        kind = kinds[prefix]
        unique = list(kinds.values()).count(kind) == 1
        layers = count
        if kind == "text" and single_text and text_layers is not None and 0 < text_layers < count:
            layers = text_layers
        name = kind if unique else prefix
        stacks.append(Stack(prefix, name, num_layers=layers, beyond=count - layers))
    return sorted(stacks, key=lambda s: (_kind_of(s.prefix) != "text", s.prefix))


def select_stack(stacks: list[Stack], name: str | None = None) -> Stack:
    """The stack a layer spec addresses: `name` (kind or prefix), else the single text stack."""
    if not stacks:
        raise LayerSpecError("the checkpoint has no numbered layer stack, so layers cannot apply")
    if name is None:
        text = [s for s in stacks if _kind_of(s.prefix) == "text"]
        if len(text) == 1:
            return text[0]
        available = ", ".join(s.name for s in stacks)
        raise LayerSpecError(f"several layer stacks ({available}); choose one with --stack")
    for stack in stacks:
        if name in (stack.name, stack.prefix):
            return stack
    available = ", ".join(s.name for s in stacks)
    raise LayerSpecError(f"no layer stack named {name!r}; the checkpoint has: {available}")


def _parse_int(text: str, spec: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise LayerSpecError(f"layer spec {spec!r}: {text!r} is not an integer") from None


def _out_of_range(spec: str, item: str, num_layers: int) -> LayerSpecError:
    return LayerSpecError(
        f"layer spec {spec!r}: {item!r} is outside the model's {num_layers} layers "
        f"(indices 0..{num_layers - 1}, or -{num_layers}..-1)"
    )


def _parse_item(item: str, num_layers: int, spec: str) -> list[int]:
    """One comma-separated item: a slice `a:b[:s]` or a single index."""
    if ":" not in item:
        index = _parse_int(item, spec)
        if not -num_layers <= index < num_layers:
            raise _out_of_range(spec, item, num_layers)
        return [index % num_layers]
    parts = item.split(":")
    if len(parts) > 3:
        raise LayerSpecError(f"layer spec {spec!r}: {item!r} has too many colons")
    start, stop, step = (_parse_int(p, spec) if p.strip() else None for p in [*parts, ""][:3])
    if step == 0:
        raise LayerSpecError(f"layer spec {spec!r}: {item!r} has a step of zero")
    for bound in (start, stop):
        if bound is not None and not -num_layers <= bound <= num_layers:
            raise _out_of_range(spec, item, num_layers)
    selected = list(range(num_layers)[slice(start, stop, step)])
    if not selected:
        raise LayerSpecError(
            f"layer spec {spec!r}: {item!r} selects no layers of the model's {num_layers}"
        )
    return selected


def parse_layer_spec(spec: str, num_layers: int) -> list[int]:
    """Parse a layer spec into sorted, unique layer indices.

    Args:
        spec: e.g. `9:28`, `-6:`, `0:9,28:34`, `5`.
        num_layers: the number of layers in the addressed stack.

    Returns:
        Sorted layer indices.

    Raises:
        LayerSpecError: on syntax errors, bounds outside the model, or an empty selection.
    """
    items = [item.strip() for item in spec.split(",")]
    if not spec.strip() or any(not item for item in items):
        raise LayerSpecError(f"layer spec {spec!r} is empty or has an empty item")
    selected: set[int] = set()
    for item in items:
        selected.update(_parse_item(item, num_layers, spec))
    return sorted(selected)


@dataclass(frozen=True)
class LayerValues:
    """A value per layer, with `default` for every other layer and tensors outside the stack."""

    per_layer: dict[int, float] = field(default_factory=dict)
    default: float | None = None

    def value_for(self, layer: int | None) -> float | None:
        """The value of a layer (None: a tensor outside the stack); None when not covered."""
        if layer is not None and layer in self.per_layer:
            return self.per_layer[layer]
        return self.default


def _parse_float(text: str, spec: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise LayerSpecError(f"value spec {spec!r}: {text!r} is not a number") from None


def parse_layer_values(spec: str, num_layers: int) -> LayerValues:
    """Parse a per-range value spec such as `9:28=0.05,*=0.001`, or a bare number for all.

    Ranges before a `=value` share it: `0:9,28:34=0.3` gives both ranges 0.3.

    Raises:
        LayerSpecError: on syntax errors, overlapping ranges, or ranges outside the model.
    """
    spec_stripped = spec.strip()
    if "=" not in spec_stripped:
        return LayerValues(default=_parse_float(spec_stripped, spec))
    per_layer: dict[int, float] = {}
    default: float | None = None
    pending: list[str] = []
    for item in (part.strip() for part in spec_stripped.split(",")):
        if "=" not in item:
            pending.append(item)
            continue
        target, value_text = (part.strip() for part in item.split("=", 1))
        value = _parse_float(value_text, spec)
        targets = [*pending, target]
        pending = []
        for one in targets:
            if one == "*":
                if default is not None:
                    raise LayerSpecError(f"value spec {spec!r} gives '*' twice")
                default = value
                continue
            for layer in parse_layer_spec(one, num_layers):
                if layer in per_layer:
                    raise LayerSpecError(f"value spec {spec!r} gives layer {layer} twice")
                per_layer[layer] = value
    if pending:
        raise LayerSpecError(f"value spec {spec!r}: {','.join(pending)!r} has no '=value'")
    return LayerValues(per_layer=per_layer, default=default)


def format_layers(indices: Iterable[int]) -> str:
    """Compress layer indices back to a spec: [0, 1, 2, 7] -> '0:3,7'."""
    ordered = sorted(set(indices))
    parts: list[str] = []
    start = prev = None
    for index in [*ordered, None]:
        if start is not None and (index is None or index != prev + 1):
            parts.append(str(start) if prev == start else f"{start}:{prev + 1}")
            start = None
        if index is not None and start is None:
            start = index
        prev = index
    return ",".join(parts)


def inner_name(name: str) -> str | None:
    """A tensor's name inside its layer (`self_attn.q_proj.weight`), or None outside any stack."""
    match = _LAYER_RE.match(name)
    return None if match is None else name[match.end() :]


def stack_layer(name: str, stack: Stack, modules: ModuleFilter | None = None) -> int | None:
    """The layer index of a tensor name within `stack`, as layer specs see it: None if it is not
    in that stack (a layer `beyond` the stack's count included) or `modules` leaves it out (so a
    value spec gives it the `*` value, as for a layer it does not name)."""
    ref = layer_of(name)
    if ref is None or ref[0] != stack.prefix or ref[1] >= stack.num_layers:
        return None
    if modules is None:
        return ref[1]
    inner = inner_name(name) or ""
    return ref[1] if modules.matches(inner) else None


def require_modules(
    modules: ModuleFilter, names: Iterable[str], stack: Stack, layers: Iterable[int]
) -> None:
    """Refuse a module filter that selects no tensor of `layers` of `stack`.

    Raises:
        LayerSpecError: no tensor of those layers matches.
    """
    chosen = set(layers)
    label = format_layers(chosen)
    inner = [inner_name(n) or "" for n in names if stack_layer(n, stack) in chosen]
    modules.require_match(inner, label)


def _runs(indices: Iterable[int]) -> list[tuple[int, int]]:
    """Contiguous runs of indices as sorted half-open (start, stop) pairs."""
    runs: list[tuple[int, int]] = []
    for index in sorted(set(indices)):
        if runs and runs[-1][1] == index:
            runs[-1] = (runs[-1][0], index + 1)
        else:
            runs.append((index, index + 1))
    return runs


def layer_groups(
    spec: str | None, num_layers: int, named: Sequence[int] = ()
) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Layer groups labelled `layers_<spec>`, e.g. for logging drift per group.

    Explicit `spec` ("0:9,9:28,28:34": one group per item) wins; otherwise the boundaries of the
    runs of `named` layers cut the stack (9:28 on 34 layers gives 0:9, 9:28, 28:34); otherwise
    thirds.

    Raises:
        LayerSpecError: an item of `spec` outside the model.
    """
    if spec:
        items = [item.strip() for item in spec.split(",") if item.strip()]
        groups = [tuple(parse_layer_spec(item, num_layers)) for item in items]
    else:
        cuts = {0, num_layers}
        for start, stop in _runs(named):
            cuts.update((start, stop))
        if not named:
            cuts.update((num_layers // 3, 2 * num_layers // 3))
        edges = sorted(cuts)
        groups = [tuple(range(a, b)) for a, b in itertools.pairwise(edges) if b > a]
    return tuple((f"layers_{format_layers(g)}", g) for g in groups)

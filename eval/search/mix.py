"""A profile as weights over BASE and the experts, and as the `surgery merge` config that
writes it.

A profile (`eval.search.space`) gives each layer of the text stack a strength s and, with
several experts, shares r: BASE's weight is 1 - s and expert k's s * r_k / sum(r) (equal when no
share is given, or all are 0). Tensors outside the stack take the `*` item's weights; without
one, the experts' at strength 1 (TRAINED itself when there is one expert).

The config is a `linear` merge without normalization (`normalize: false`: the weights are used as
they are, summing to 1 up to float rounding), the models in the order BASE, expert 1, ..., and
each model's `weight` a `filter` list: one entry per layer whose weight differs from the
default (`model.layers.3.`), then the default, the weight of the tensors outside the stack.
Weights print as Python's shortest round-trip decimals, so the config gives back the exact
floats the in-memory blend (`eval.search.blend`) uses, and `surgery merge` writes bit for bit
the weights that were scored. A multimodal model's config gives the text stack as the
`text_decoder` module (mergekit's `modules:`); its other modules are BASE's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from surgery.core.layers import parse_layer_values

Weights = tuple[float, ...]  # (BASE, expert 1, ..., expert K)
_SHARES = re.compile(r"\[([^\]]*)\]")


@dataclass(frozen=True)
class Mix:
    """The weights a profile gives each layer of the text stack and the tensors outside it."""

    layers: tuple[Weights, ...]
    outside: Weights


def weights(strength: float, shares: Sequence[float] | None, experts: int) -> Weights:
    """(BASE, expert 1, ..., expert K): 1 - s, then s * r_k / sum(r) (equal shares when none
    is given or all are 0). One expert: (1 - s, s), as `surgery interpolate` blends."""
    if not shares or not any(shares):
        shares = [1.0] * experts
    total = sum(shares)
    return (1.0 - strength, *(strength * r / total for r in shares))


def mix_of(profile: str, num_layers: int, experts: int) -> Mix:
    """The weights of a profile: an --alpha string (`2:5=0`, `0.5`, `0:2=0.3,*=1`) whose
    items may carry the experts' shares in brackets (`0:2=0.3[1 0.5 0]`).

    Raises:
        LayerSpecError: a bad spec.
        ValueError: a bracket without one share per expert.
    """
    items = [item.strip() for item in profile.split(",")]
    alpha = ",".join(_SHARES.sub("", item) for item in items)
    strengths = parse_layer_values(alpha, num_layers)
    per_expert = [[] for _ in range(experts)]
    for item in items:
        found = _SHARES.search(item)
        if found is None:
            continue
        shares = found[1].split()
        if len(shares) != experts:
            raise ValueError(f"profile item {item!r}: give one share per expert ({experts})")
        target = _SHARES.sub("", item).split("=", 1)[0]
        for k, share in enumerate(shares):
            per_expert[k].append(f"{target}={share}")
    shares = [parse_layer_values(",".join(p), num_layers) if p else None for p in per_expert]

    def at(layer: int | None) -> Weights:
        strength = strengths.value_for(layer)
        found = [s.value_for(layer) if s is not None else None for s in shares]
        chosen = None if None in found else found
        return weights(1.0 if strength is None else strength, chosen, experts)

    return Mix(tuple(at(layer) for layer in range(num_layers)), at(None))


TEXT_MODULE = "text_decoder"  # mergekit's module of a multimodal model's text stack


def merge_config(
    mix: Mix, models: Sequence[str], prefixes: Sequence[str], modules: Sequence[str] = ()
) -> str:
    """The `surgery merge` YAML that writes `mix`.

    Args:
        models: BASE, then the experts (paths or Hub ids as the search was given them).
        prefixes: each model's text stack prefix (`model.layers`), where its layers' names
            begin.
        modules: BASE's modules when it has several (a multimodal model: `text_decoder`,
            `vision_tower`, ...): the text decoder is mixed, the other modules are BASE's.
    """
    from surgery.mergekit_config import render_config

    entries = [
        {"model": model, "parameters": {"weight": _filters(mix, position, prefix)}}
        for position, (model, prefix) in enumerate(zip(models, prefixes, strict=True))
    ]
    config: dict = {"merge_method": "linear", "base_model": models[0]}
    if len(modules) < 2:
        config["models"] = entries
    else:
        alone = [{"model": models[0], "parameters": {"weight": 1.0}}]
        config["modules"] = {
            name: {"models": entries if name == TEXT_MODULE else alone} for name in modules
        }
    config["parameters"] = {"normalize": False}
    return render_config(config)


def _filters(mix: Mix, position: int, prefix: str) -> list[dict]:
    """One model's weight: a filter per layer whose weight is not the default, then the
    default (the tensors outside the stack, and every layer with its weight)."""
    default = mix.outside[position]
    entries = [
        {"filter": f"{prefix}.{layer}.", "value": layer_weights[position]}
        for layer, layer_weights in enumerate(mix.layers)
        if layer_weights[position] != default
    ]
    return [*entries, {"value": default}]

"""Module filters: which tensors of the chosen layers an operation touches (`--modules`).

One parser and one matcher serve freeze, L2-SP, revert, interpolate, sweep and localize. A filter
narrows a layer selection: a tensor of a chosen layer that the filter does not match is treated
as if its layer were not chosen (it stays TRAINED, trains, or gets the `*` value).

- `attn`, `mlp`, or both (`attn,mlp`): module groups. A tensor's group is decided by the first
  part of its name inside the layer that names a module kind:
    attn: self_attn, attn, attention, self_attention, cross_attn, crossattention, encoder_attn,
          SelfAttention, EncDecAttention (Llama, Gemma-3, GPT-2, BERT, T5, BART)
    mlp:  mlp, feed_forward, ffn, block_sparse_moe, fc1, fc2, DenseReluDense, and BERT's
          `intermediate` and `output` (its feed-forward output dense and LayerNorm)
  Norms between the blocks (`input_layernorm`, `post_attention_layernorm`, Gemma-3's
  `pre_feedforward_layernorm`, GPT-2's `ln_1`/`ln_2`, T5's `layer.N.layer_norm`) are in neither
  group; norms inside a module are in its group (Gemma-3's `self_attn.q_norm`, BERT's
  `attention.output.LayerNorm`).
- anything else: one regular expression, searched in the tensor's name inside its layer
  (`self_attn.q_proj.weight` of `model.layers.3.self_attn.q_proj.weight`), e.g. `q_proj|v_proj`.

`--attention-only` is not a `--modules` group: it is the paper's `attention_only`
(sanchit-ahuja/scaling-multilingual-experts, `regularization.py`), whose parameter counts as MLP
when its name holds one of `REFERENCE_MLP` as a substring (`_is_mlp_param`); everything else
(attention, norms, embeddings) is not MLP. `ATTENTION_ONLY` is that rule as a filter; it is
searched in a tensor's name inside its layer, which is the reference's search of the whole name
wherever the stack's prefix holds none of the substrings (`model.layers`,
`language_model.model.layers`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from surgery.core.errors import LayerSpecError

# Module names (parts of a tensor name inside its layer) that decide its group.
GROUPS: dict[str, frozenset[str]] = {
    "attn": frozenset(
        {
            "self_attn",
            "attn",
            "attention",
            "self_attention",
            "cross_attn",
            "crossattention",
            "encoder_attn",
            "SelfAttention",
            "EncDecAttention",
        }
    ),
    "mlp": frozenset(
        {
            "mlp",
            "feed_forward",
            "ffn",
            "block_sparse_moe",
            "fc1",
            "fc2",
            "DenseReluDense",
            "intermediate",
            "output",
        }
    ),
}


def group_part(inner: str) -> tuple[str, int] | None:
    """The group of a tensor's name inside its layer and the index of the part that decides it
    (`self_attn.q_proj.weight` -> ("attn", 0)); None for a tensor in no group (a norm)."""
    for index, part in enumerate(inner.split(".")[:-1]):  # the last part is weight/bias
        for group, modules in GROUPS.items():
            if part in modules:
                return group, index
    return None


@dataclass(frozen=True)
class ModuleFilter:
    """A parsed `--modules`: module groups, or one regex over names inside a layer."""

    spec: str
    groups: frozenset[str] = frozenset()
    pattern: re.Pattern[str] | None = None
    # How errors name the filter; None: `--modules SPEC`.
    label: str | None = None

    def matches(self, inner: str) -> bool:
        """Whether a tensor, by its name inside its layer, is selected."""
        if self.pattern is not None:
            return self.pattern.search(inner) is not None
        found = group_part(inner)
        return found is not None and found[0] in self.groups

    def require_match(self, inner_names: Iterable[str], layers: str) -> None:
        """Refuse a filter that selects no tensor of the chosen layers (a typo, or a group the
        architecture does not name).

        Raises:
            LayerSpecError: no name matches.
        """
        if not any(self.matches(name) for name in inner_names):
            if self.label is not None:
                raise LayerSpecError(f"{self.label} matches no tensor of layers {layers}")
            raise LayerSpecError(
                f"--modules {self.spec!r} matches no tensor of layers {layers} (groups: "
                f"{', '.join(GROUPS)}, or a regex on names inside a layer, e.g. q_proj|v_proj)"
            )


def parse_module_filter(spec: str) -> ModuleFilter:
    """Parse `--modules`: `attn`, `mlp`, `attn,mlp`, or else one regex.

    Raises:
        LayerSpecError: an empty spec or a regex that does not compile.
    """
    text = spec.strip()
    if not text:
        raise LayerSpecError("--modules is empty: give attn, mlp or a name regex")
    items = {item.strip() for item in text.split(",")}
    if items <= GROUPS.keys():
        return ModuleFilter(text, groups=frozenset(items))
    try:
        return ModuleFilter(text, pattern=re.compile(text))
    except re.error as error:
        raise LayerSpecError(f"--modules {spec!r} is not a valid regex: {error}") from None


# The paper's code (`_is_mlp_param`): a parameter is MLP when its name contains one of these.
REFERENCE_MLP = ("mlp", "gate_proj", "up_proj", "down_proj", "fc1", "fc2")

# `--attention-only`: the reference's MLP parameters (see the module's docstring).
ATTENTION_ONLY = ModuleFilter(
    "|".join(REFERENCE_MLP),
    pattern=re.compile("|".join(map(re.escape, REFERENCE_MLP))),
    label="--attention-only (the MLP tensors: names holding " + ", ".join(REFERENCE_MLP) + ")",
)

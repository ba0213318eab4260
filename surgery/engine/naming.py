"""Tensor names across layouts of one text model: each checkpoint's names -> canonical names.

The same text model is published under several namings. A multimodal Gemma-3, Mistral-3 or
Llava keeps its text model under `language_model.model.*` in the files on the Hub (and as
transformers 5 saves it), under `model.language_model.*` as some transformers 4.x releases saved
it (and as transformers 5 names its modules in memory), beside a vision tower and a projector; a
text-only
fine-tune made from it (`Gemma3ForCausalLM`, `MistralForCausalLM`) names the same weights
`model.*`. Every name maps to a canonical one, the text-only name for the text model's tensors:

    language_model.model.layers.3.mlp.up_proj.weight  -> model.layers.3.mlp.up_proj.weight
    model.language_model.layers.3.mlp.up_proj.weight  -> model.layers.3.mlp.up_proj.weight
    language_model.lm_head.weight                     -> lm_head.weight
    model.vision_tower.encoder.layers.0.fc1.weight    -> vision_tower.encoder.layers.0.fc1.weight
    vision_tower.vision_model.encoder.layers.0...     -> vision_tower.encoder.layers.0...

Which layout a checkpoint has comes from its tensor names; whether two checkpoints hold the same
text model, and how many rows its vocabulary has, from their config.json. Names of a text-only
checkpoint (or of any other architecture) are their own canonical names.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

TEXT_ONLY = "text-only"
PUBLISHED = "multimodal (language_model.model.*)"
NESTED = "multimodal (model.language_model.*)"  # 4.x saves; module names in memory

# Per layout: the rules that rename the text model's tensors (the first that matches), then the
# rules applied in turn to every other tensor (the vision tower, the projector).
_TEXT_RULES = {
    PUBLISHED: (
        (re.compile(r"^language_model\.model\."), "model."),
        (re.compile(r"^language_model\.lm_head\."), "lm_head."),
        (re.compile(r"^lm_head\."), "lm_head."),
    ),
    NESTED: (
        (re.compile(r"^model\.language_model\."), "model."),
        (re.compile(r"^lm_head\."), "lm_head."),
    ),
}
# A SigLIP tower's `vision_model.` level: in the published Gemma-3 files, not in transformers 5's.
_TOWER = (re.compile(r"^vision_tower\.vision_model\."), "vision_tower.")
_OTHER_RULES = {
    PUBLISHED: (_TOWER,),
    NESTED: ((re.compile(r"^model\."), ""), _TOWER),
}


@dataclass(frozen=True)
class Layout:
    """How one checkpoint names its tensors."""

    kind: str  # TEXT_ONLY, PUBLISHED or NESTED
    canonical: dict[str, str]  # actual name -> canonical name
    others: frozenset[str]  # actual names outside the text model (vision tower, projector)

    def actual(self) -> dict[str, str]:
        """Canonical name -> actual name."""
        return {canonical: name for name, canonical in self.canonical.items()}


def _kind(names: list[str]) -> str:
    published = any(n.startswith("language_model.") for n in names)
    nested = any(n.startswith("model.language_model.") for n in names)
    if published != nested:
        return PUBLISHED if published else NESTED
    return TEXT_ONLY


def _rename(name: str, kind: str) -> tuple[str, bool]:
    """(canonical name, whether it is a tensor of the text model)."""
    for pattern, replacement in _TEXT_RULES[kind]:
        if pattern.match(name):
            return pattern.sub(replacement, name, count=1), True
    for pattern, replacement in _OTHER_RULES[kind]:
        name = pattern.sub(replacement, name, count=1)
    return name, False


def layout_of(names: Iterable[str]) -> Layout:
    """The layout of a checkpoint (or of a model's parameters in memory) from its names.

    A naming that would give two tensors one canonical name is taken as it is (text-only).
    """
    names = list(names)
    kind = _kind(names)
    if kind == TEXT_ONLY:
        return Layout(TEXT_ONLY, {n: n for n in names}, frozenset())
    renamed = {name: _rename(name, kind) for name in names}
    canonical = {name: new for name, (new, _) in renamed.items()}
    if len(set(canonical.values())) != len(canonical):
        return Layout(TEXT_ONLY, {n: n for n in names}, frozenset())
    others = frozenset(name for name, (_, text) in renamed.items() if not text)
    return Layout(kind, canonical, others)


def text_config(config: dict) -> dict:
    """The config of the text model: a multimodal config's `text_config`, else the config."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def text_model_type(config: dict) -> str | None:
    """The text model's `model_type` (`gemma3_text` for a multimodal Gemma-3), if known."""
    model_type = text_config(config).get("model_type")
    return model_type if isinstance(model_type, str) else None


def vocab_rows(config: dict) -> int | None:
    """The vocabulary size the config gives its text model, if any."""
    for scope in (text_config(config), config):
        size = scope.get("vocab_size")
        if isinstance(size, int) and not isinstance(size, bool):
            return size
    return None


def groups(names: Iterable[str]) -> str:
    """Names summarized by their component: `vision_tower.* (40), multi_modal_projector.* (2)`."""
    counts: Counter[str] = Counter()
    for name in names:
        parts = name.split(".")
        depth = 2 if parts[0] in ("model", "language_model") and len(parts) > 2 else 1
        counts[".".join(parts[:depth]) + ".*"] += 1
    return ", ".join(f"{group} ({count})" for group, count in counts.most_common())

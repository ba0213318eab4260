"""The modules of a `modules:` merge (mergekit's `OutputModuleDefinition`): which module each
tensor of the output belongs to, by mergekit's module names.

A multimodal checkpoint (any layout `surgery.engine.naming` knows) has the module
`text_decoder` (its text model) and one module per other component, named by the component's
first name part: `vision_tower` and `multi_modal_projector` for Gemma-3 and Mistral-3, as in
mergekit's architecture files. A text-only checkpoint has one module, `default`, as mergekit's
single-module architectures do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from surgery.engine.naming import TEXT_ONLY, Layout
from surgery.engine.ops.merge.spec import MergeConfigError, ModuleSpec

TEXT_DECODER = "text_decoder"
DEFAULT = "default"


def module_of(name: str, layout: Layout) -> str:
    """The module of tensor `name` of a checkpoint of `layout`."""
    if layout.kind == TEXT_ONLY:
        return DEFAULT
    if name not in layout.others:
        return TEXT_DECODER
    return layout.canonical[name].split(".", 1)[0]


def module_map(names: Iterable[str], layout: Layout) -> dict[str, str]:
    """Every name's module (see `module_of`), in the names' order."""
    return {name: module_of(name, layout) for name in names}


def check_modules(modules: Sequence[ModuleSpec], found: dict[str, str], label: str) -> None:
    """Refuse a module the output's architecture lacks, and a module of it the config leaves out
    (mergekit would write the output without it).

    Args:
        modules: the config's modules.
        found: the output reference's tensor -> module (`module_map`).
        label: how messages name the output reference.

    Raises:
        MergeConfigError: one line naming the module and the architecture's modules.
    """
    have = list(dict.fromkeys(found.values()))
    named = [module.name for module in modules]
    for name in named:
        if name not in have:
            raise MergeConfigError(
                f"modules: {name} is not a module of {label} (its modules: {', '.join(have)}), "
                "whose layout the output has as the base_model, else the first model named"
            )
    left = [name for name in have if name not in named]
    if left:
        raise MergeConfigError(
            f"modules: {', '.join(left)} of {label} not named; name every module (mergekit "
            "would leave them out of the output)"
        )

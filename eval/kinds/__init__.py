"""The task kinds: one module each, holding the kind's declaration, its loader and its scorer,
and registering the kind in `KINDS` where it is defined.

Every module of this package is imported here, so a new kind is its module and its tests, and
nothing else. Besides the kinds (a module named after its kind: ``lm-eval`` in ``lm_eval.py``)
the package holds what a kind is (`base`) and code several kinds share, which registers nothing:

- `mc`: multiple choice by summed log-likelihood (belebele, piqa, multiple_choice);
- `templates`: lm-evaluation-harness's template keys (multiple_choice, exact_match);
- `shots`: the demonstration samplers;
- `translation_outputs`: what flores outputs look like (also read by compare).

A kind module imports torch only inside the functions that score a model: the CLI imports every
kind to validate task strings before it spends time loading one.
"""

import importlib
import pkgutil

from eval.kinds.base import (
    ADD_BOS,
    KINDS,
    MC_OPTIONS,
    REQUIRED,
    Kind,
    Option,
    Settings,
    Task,
    TaskSpec,
    register,
)


def _import_every_kind() -> None:
    """Import each module of the package (a kind's registers it), then sort `KINDS` by name:
    the order of ``surgery eval --help``, of the docs' task list and of messages."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    ordered = sorted(KINDS.items())
    KINDS.clear()
    KINDS.update(ordered)


_import_every_kind()

__all__ = [
    "ADD_BOS",
    "KINDS",
    "MC_OPTIONS",
    "REQUIRED",
    "Kind",
    "Option",
    "Settings",
    "Task",
    "TaskSpec",
    "register",
]

"""The task kinds, one module each, registered in `KINDS` as their modules are imported.

A new kind is one module here (its `Kind`, `register`ed where it is defined) plus its tests,
and one import below.
"""

from eval.kinds.base import ADD_BOS, KINDS, MC_OPTIONS, REQUIRED, Kind, Option, register

# The order of registration is the order of `surgery eval --help` and of the task list in
# docs/evaluation.md.
# isort: off
from eval.kinds import ppl, belebele, piqa, flores, lm_eval, copain, choice, exact  # noqa: F401
# isort: on

__all__ = ["ADD_BOS", "KINDS", "MC_OPTIONS", "REQUIRED", "Kind", "Option", "register"]

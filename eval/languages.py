"""FLORES-200 language codes (``xxx_Scrp``), as every layer of eval spells a language."""

from __future__ import annotations

import re

CODE_RE = re.compile(r"^[a-z]{3}_[A-Z][a-z]{3}$")


def is_code(text: str) -> bool:
    """Whether `text` looks like a FLORES-200 code: three lowercase letters, ``_``, a script."""
    return bool(CODE_RE.match(text))

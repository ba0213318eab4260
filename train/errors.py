"""Errors of the training wrapper: all are `SurgeryError`s, so the CLI prints one line."""

from __future__ import annotations

from surgery.core.errors import SurgeryError


class TrainConfigError(SurgeryError):
    """A training option that does not parse, does not fit the model, or points at bad data."""

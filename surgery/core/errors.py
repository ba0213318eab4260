"""The project's exception types.

Every error a user can cause (a bad path, a corrupt file, a layer range the model does not have)
is raised as a `SurgeryError` whose message says what is wrong and what to do. The CLI prints that
message on one line and exits with code 2.
"""


class SurgeryError(Exception):
    """Base class: a problem with the user's input or request, not a bug."""


class CheckpointError(SurgeryError):
    """A checkpoint cannot be read: missing, truncated, corrupt header, inconsistent index."""


class MismatchError(SurgeryError):
    """Checkpoints that must line up (names, shapes, dtypes, non-float values) do not."""


class LayerSpecError(SurgeryError):
    """A layer spec that does not parse or does not fit the model."""


class OutputError(SurgeryError):
    """The output path is unsafe or already taken."""

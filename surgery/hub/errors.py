"""huggingface_hub's errors as one-line messages that say what to do."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from surgery.core.errors import CheckpointError
from surgery.core.nearby import nearest_names, no_such_path

_OFFLINE = "the Hub cannot be reached (HF_HUB_OFFLINE set, or no network)"


@contextmanager
def hub_errors(spec: str, revision: str | None) -> Iterator[None]:
    """Turn huggingface_hub's errors into one-line `CheckpointError`s that say what to do.

    Where the Hub has no such repository (or cannot be asked, and the cache has none) and the
    argument's folder exists locally (`ckpt/plian` beside a `ckpt/plain`), the message leads
    with the missing local path and the nearest names in its folder, then says what the Hub
    answered: a typo of a local folder reads as one, while a Hub id whose organisation is also a
    local folder's name is still looked up on the Hub.
    """
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.utils import httpx

    try:
        yield
        return
    except GatedRepoError:
        message = f"{spec} is gated: accept its terms on the Hub and set HF_TOKEN"
    except RepositoryNotFoundError:
        message = _not_found(
            spec,
            "is neither a local path nor a Hub repository you can read (private? HF_TOKEN)",
            "it is not a repository you can read (private? HF_TOKEN)",
        )
    except RevisionNotFoundError:
        message = f"{spec} has no revision {revision!r} on the Hub"
    except LocalEntryNotFoundError:
        message = _not_found(
            spec,
            f"is not a local path and not in the Hub cache, and {_OFFLINE}",
            f"it is not in the Hub cache, and {_OFFLINE}",
        )
    except (HfHubHTTPError, httpx.HTTPError, OSError) as error:
        message = f"{spec} could not be fetched from the Hub ({type(error).__name__}: {error})"
    raise CheckpointError(message.splitlines()[0])


def _not_found(spec: str, plain: str, as_hub_id: str) -> str:
    """`SPEC PLAIN`; where SPEC's folder exists locally, the missing local path and its nearest
    names first, then `as a Hub id, AS_HUB_ID`."""
    if nearest_names(spec) is None:
        return f"{spec} {plain}"
    return f"{no_such_path(spec)}; as a Hub id, {as_hub_id}"

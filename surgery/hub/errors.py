"""huggingface_hub's errors as one-line messages that say what to do."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from surgery.core.errors import CheckpointError


@contextmanager
def hub_errors(spec: str, revision: str | None) -> Iterator[None]:
    """Turn huggingface_hub's errors into one-line `CheckpointError`s that say what to do."""
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
        message = "is gated: accept its terms on the Hub and set HF_TOKEN"
    except RepositoryNotFoundError:
        message = "is neither a local path nor a Hub repository you can read (private? HF_TOKEN)"
    except RevisionNotFoundError:
        message = f"has no revision {revision!r} on the Hub"
    except LocalEntryNotFoundError:
        message = (
            "is not a local path and not in the Hub cache, and the Hub cannot be reached "
            "(HF_HUB_OFFLINE set, or no network)"
        )
    except (HfHubHTTPError, httpx.HTTPError, OSError) as error:
        message = f"could not be fetched from the Hub ({type(error).__name__}: {error})"
    raise CheckpointError(f"{spec} {message}".splitlines()[0])

"""Hugging Face Hub ids as checkpoint arguments: `org/name` or `org/name@revision`.

An existing local path always wins over a Hub id of the same spelling. A Hub id resolves through
huggingface_hub's snapshot download of only what surgery needs (safetensors shards, index, config
and tokenizer files), which honours HF_HOME, HF_HUB_CACHE, HF_TOKEN and HF_HUB_OFFLINE.
"""

from __future__ import annotations

import re
from pathlib import Path

from surgery.core.errors import CheckpointError
from surgery.engine.reader import Checkpoint, HubRef, open_checkpoint

# Shards, index, configs, tokenizer files; never pickled weights or other formats.
ALLOW_PATTERNS = [
    "*.safetensors",
    "*.json",
    "*.model",
    "*.txt",
    "*.tiktoken",
    "*.jinja",
]
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")


def parse_hub_id(spec: str) -> tuple[str, str | None] | None:
    """`org/name@rev` -> ("org/name", "rev"); None when `spec` cannot be a Hub id."""
    match = _HUB_ID.match(spec)
    if match is None or spec.endswith((".safetensors", ".json")):
        return None
    return match["repo"], match["revision"]


def resolve(spec: str | Path) -> tuple[Path, HubRef | None]:
    """A local path as it is, or a Hub id downloaded (or found in the cache) to a local snapshot.

    Raises:
        CheckpointError: neither a local path nor a reachable Hub repository, with the reason
            (not found or private, unknown revision, offline with nothing cached).
    """
    path = Path(spec)
    if path.exists():
        return path, None
    parsed = parse_hub_id(str(spec))
    if parsed is None:
        raise CheckpointError(f"{spec}: no such file or folder")
    repo_id, revision = parsed
    folder = _download(str(spec), repo_id, revision)
    # The cache layout is .../snapshots/<commit sha>: the exact revision used, for the recipe.
    return folder, HubRef(repo_id, folder.name)


def _download(spec: str, repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=ALLOW_PATTERNS))
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
    except (HfHubHTTPError, OSError) as error:
        message = f"could not be fetched from the Hub ({type(error).__name__}: {error})"
    raise CheckpointError(f"{spec} {message}".splitlines()[0])


def open_input(spec: str | Path) -> Checkpoint:
    """Open a checkpoint argument: a local folder or file, or a Hub id resolved to its snapshot.

    Raises:
        CheckpointError: see `resolve` and `open_checkpoint`.
    """
    path, hub = resolve(spec)
    return open_checkpoint(path, spec=str(spec), hub=hub)

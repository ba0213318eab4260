"""Hugging Face Hub ids as checkpoint arguments: `org/name` or `org/name@revision`.

An existing local path always wins over a Hub id of the same spelling. A Hub id is opened in one
of two ways, both through huggingface_hub (HF_ENDPOINT, HF_HOME, HF_HUB_CACHE, HF_TOKEN and
HF_HUB_OFFLINE apply):
- by ranges (`open_input(..., ranges=True)`, what inspect, drift, revert, interpolate and soup do
  unless given `--download`): small files through the cache, safetensors shards read in place on
  the Hub by HTTP range requests (`surgery.hub.remote`);
- by download (the default here, and whenever offline): a snapshot of only what surgery needs
  (safetensors shards, index, config and tokenizer files) through the cache.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from pathlib import Path

from surgery.core.errors import CheckpointError
from surgery.core.nearby import no_such_path
from surgery.engine.reader import Checkpoint, HubRef, open_checkpoint
from surgery.hub.errors import hub_errors
from surgery.hub.timeouts import bound_requests

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


def check_input(spec: str | Path) -> None:
    """Refuse at once a checkpoint argument that is neither an existing local path nor spelled
    as a Hub id (`org/name[@revision]`): a mistyped folder never goes to the network.

    Raises:
        CheckpointError: `SPEC: no such file or folder`, with the nearest names in its folder.
    """
    if not Path(spec).exists() and parse_hub_id(str(spec)) is None:
        raise CheckpointError(no_such_path(spec))


def resolve(spec: str | Path) -> tuple[Path, HubRef | None]:
    """A local path as it is, or a Hub id downloaded (or found in the cache) to a local snapshot.

    Raises:
        CheckpointError: neither a local path nor a reachable Hub repository, with the reason
            (no such file or folder, not found or private, unknown revision, offline with
            nothing cached).
    """
    check_input(spec)
    path = Path(spec)
    if path.exists():
        return path, None
    repo_id, revision = parse_hub_id(str(spec))
    folder = _download(str(spec), repo_id, revision)
    # The cache layout is .../snapshots/<commit sha>: the exact revision used, for the recipe.
    return folder, HubRef(repo_id, folder.name)


def _download(spec: str, repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download

    bound_requests()
    with hub_errors(spec, revision):
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=ALLOW_PATTERNS)
    return Path(folder)


def open_input(spec: str | Path, *, ranges: bool = False, companions: bool = True) -> Checkpoint:
    """Open a checkpoint argument: a local folder or file, or a Hub id.

    Args:
        spec: a local path, or `org/name[@revision]`.
        ranges: read a Hub id's shards by HTTP range requests instead of downloading them
            (offline, or when the Hub cannot be reached, the cache is used as by a download).
        companions: with `ranges`, also fetch config, generation config and tokenizer files
            (for the checkpoint an output copies them from); otherwise only config.json and
            the index.

    Raises:
        CheckpointError: see `resolve` and `open_checkpoint`; with `ranges`, also a shard that
            cannot be read from the Hub.
    """
    parsed = parse_hub_id(str(spec))
    if ranges and parsed is not None and not Path(spec).exists():
        from surgery.hub.remote import open_remote

        repo_id, revision = parsed
        patterns = ALLOW_PATTERNS if companions else []
        checkpoint = open_remote(str(spec), repo_id, revision, companions=patterns)
        if checkpoint is not None:
            return checkpoint
    return open_local(spec)


def open_local(spec: str | Path) -> Checkpoint:
    """Open a checkpoint argument from local files: a local path as it is, a Hub id downloaded
    (or found in the cache) first; what `open_input` does without `ranges`, and what a reader
    of whole files (training's `from_pretrained`) needs.

    Raises:
        CheckpointError: see `resolve` and `open_checkpoint`.
    """
    path, hub = resolve(spec)
    return open_checkpoint(path, spec=str(spec), hub=hub)


def open_inputs(
    specs: Sequence[str | Path], *, ranges: bool = False, companions: Sequence[bool] | None = None
) -> list[Checkpoint]:
    """Open several checkpoint arguments side by side, as `open_input` each: the round trips of
    one Hub id's metadata overlap another's instead of following them.

    Args:
        specs: local paths or Hub ids.
        ranges: as `open_input`.
        companions: per spec, as `open_input` (default: True for each).

    Returns:
        The checkpoints, in the order of `specs`.

    Raises:
        CheckpointError: as `open_input`; every argument is checked first (a mistyped folder
            never goes to the network), and of several errors the first argument's is raised.
    """
    from surgery.hub.remote import at_once

    for spec in specs:
        check_input(spec)
    if not all(Path(spec).exists() for spec in specs):
        # Once, before threads share huggingface_hub's client; local inputs never import it
        # (0.3-0.5 s of a local revert's 2.7 s).
        bound_requests()
    wanted = [True] * len(specs) if companions is None else list(companions)
    calls = [
        functools.partial(open_input, spec, ranges=ranges, companions=c)
        for spec, c in zip(specs, wanted, strict=True)
    ]
    return at_once(calls)

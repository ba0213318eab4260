"""A timeout on every request huggingface_hub sends for surgery.

huggingface_hub's shared HTTP client has no timeout, and its API calls (repo info, file lists,
repository creation, commits) pass none, so an endpoint that accepts the connection and never
answers would hold a command forever. `bound_requests` gives each request that has no timeout
the download timeout huggingface_hub documents, HF_HUB_DOWNLOAD_TIMEOUT (seconds, default 10),
for connecting and for each read or write; requests that set their own (file downloads, HEAD
requests under HF_HUB_ETAG_TIMEOUT) keep it.
"""

from __future__ import annotations


def _timeout_unset(request) -> None:
    """httpx request hook: fill in a timeout when the request has none at all."""
    from huggingface_hub import constants
    from huggingface_hub.utils import httpx

    timeout = request.extensions.get("timeout")
    if not timeout or all(value is None for value in timeout.values()):
        bounded = httpx.Timeout(float(constants.HF_HUB_DOWNLOAD_TIMEOUT))
        request.extensions = {**request.extensions, "timeout": bounded.as_dict()}


def bound_requests() -> None:
    """Make huggingface_hub's current shared client time out requests that set no timeout.

    Called before surgery talks to the Hub (a new client, after huggingface_hub replaces it,
    gets the hook the next time); calling it again does nothing.
    """
    from huggingface_hub.utils import get_session

    hooks = get_session().event_hooks["request"]
    if _timeout_unset not in hooks:
        hooks.append(_timeout_unset)

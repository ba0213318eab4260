"""Hub requests time out, and a mistyped local path never reaches the Hub.

The endpoint used is `SilentHub`: it accepts connections and never answers. Without a timeout
on every request, the commands below would wait forever (the subprocess limit would fail the
test); HF_HUB_DOWNLOAD_TIMEOUT=1 keeps them quick.
"""

from __future__ import annotations

import subprocess

import pytest
from click.testing import CliRunner

from cli import cli
from tests.support.hub_server import SilentHub, run_surgery


def _surgery(*args: object, env: dict) -> subprocess.CompletedProcess:
    # far above what the 1-second timeouts allow; reached only by a hang
    return run_surgery(*args, env=env, timeout=300)


@pytest.fixture
def silent(tmp_path):
    with SilentHub() as hub:
        yield {
            "HF_ENDPOINT": hub.endpoint,
            "HF_HOME": str(tmp_path / "hf"),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DOWNLOAD_TIMEOUT": "1",
            "HF_HUB_ETAG_TIMEOUT": "1",
        }


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "acme/model"],
        ["drift", "acme/base", "acme/trained"],
        ["eval", "acme/model", "-t", "copain"],
    ],
    ids=["inspect-by-ranges", "drift-by-ranges", "eval-download"],
)
def test_a_hub_that_never_answers_times_out_in_one_line(silent, args):
    result = _surgery(*args, env=silent)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: acme/"), result.stderr[-2000:]
    assert "cannot be reached" in lines[0] or "could not be fetched" in lines[0], lines[0]


def test_requests_without_a_timeout_get_the_download_timeout(monkeypatch):
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session, httpx

    from surgery.hub.timeouts import bound_requests

    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.2)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the tests run offline
    bound_requests()
    bound_requests()  # once is enough; twice adds nothing
    hooks = get_session().event_hooks["request"]
    assert len([h for h in hooks if h.__module__ == "surgery.hub.timeouts"]) == 1
    with SilentHub() as hub, pytest.raises(httpx.TimeoutException):
        get_session().get(f"{hub.endpoint}/api/models/acme/model", timeout=None)


@pytest.mark.parametrize("command", ["eval", "train"])
def test_a_mistyped_local_path_is_no_such_folder_at_once(tmp_path, command):
    """As revert, inspect and drift say it: no request to the Hub, no data read first."""
    data = tmp_path / "data.txt"
    data.write_text("text\n")
    args = {
        "eval": ["eval", tmp_path / "traind", "-t", "copain"],
        "train": [
            "train",
            tmp_path / "traind",
            tmp_path / "out",
            "--data",
            data,
            "--max-steps",
            "1",
        ],
    }[command]
    for spec in (tmp_path / "traind", "traind"):
        args = [spec if a == tmp_path / "traind" else a for a in args]
        result = CliRunner().invoke(cli, [str(a) for a in args])
        assert result.exit_code == 2, result.output
        # One line (with the nearest names in the folder, where there are any: `train` here).
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"error: {spec}: no such file or folder"), line
        args = [tmp_path / "traind" if a == spec else a for a in args]
    assert not (tmp_path / "out").exists()

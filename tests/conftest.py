"""Session fixtures: tiny checkpoints of real architectures, built once per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Commands run in this process choose their threads by the rule; pinned here to every usable
# core (torch's own default), so a test's outcome never depends on the machine's load. The
# rule itself is tested in tests/test_threads.py, with this variable removed.
os.environ.setdefault("SURGERY_THREADS", str(len(os.sched_getaffinity(0))))

from tests.support import tiny_models

# .ci/run sets this: there a test module skipped as a whole (the lm-eval parity tests skip so
# without the lm-eval extra) fails the run instead, so CI never passes without running them.
REQUIRE_EXTRAS = os.environ.get("SURGERY_REQUIRE_EXTRAS") == "1"
_skipped_modules: list[str] = []


@pytest.hookimpl(tryfirst=True)
def pytest_collectreport(report: pytest.CollectReport) -> None:
    """Under SURGERY_REQUIRE_EXTRAS=1, a module skipped at import is reported as an error."""
    if REQUIRE_EXTRAS and report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        _skipped_modules.append(report.nodeid)
        report.outcome = "failed"
        report.longrepr = (
            f"{report.nodeid} was skipped ({reason}), but SURGERY_REQUIRE_EXTRAS=1 needs "
            "every test module to run: pip install -e '.[dev]'"
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """... and the run fails, whatever else passed."""
    if _skipped_modules:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def families(tmp_path_factory: pytest.TempPathFactory):
    """`families(arch)` -> {"base", "trained", "experts"} paths, built on first use."""
    root = tmp_path_factory.mktemp("families")
    built: dict[str, dict] = {}

    def get(arch: str) -> dict:
        if arch not in built:
            built[arch] = tiny_models.build_family(arch, root / arch)
            if arch == "bert":
                for path in [built[arch]["base"], built[arch]["trained"], *built[arch]["experts"]]:
                    tiny_models.add_position_ids(path)
        return built[arch]

    return get


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory):
    """The quick demo's folder (`surgery demo --quick`, minutes of CPU), built once for the slow
    tests that read it: tests/test_demo.py and the docs examples on the demo's world."""
    from demo.pipeline import run_demo

    out = tmp_path_factory.mktemp("demo") / "run"
    run_demo(out, quick=True, device="cpu")
    return out

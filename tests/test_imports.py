"""The engine stands alone: importing it (or the CLI) must not import transformers."""

import re
import subprocess
import sys
from pathlib import Path


def test_engine_and_cli_do_not_import_transformers():
    code = (
        "import sys, cli, surgery.api, surgery.engine.ops.soup, surgery.engine.ops.revert, "
        "surgery.engine.ops.interpolate, surgery.checks.verify, surgery.checks.inspection\n"
        "heavy = [m for m in ('transformers', 'peft', 'sacrebleu') if m in sys.modules]\n"
        "assert not heavy, heavy"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_byte_copy_operations_never_import_torch(families, tmp_path):
    """A revert (all byte copies), inspect and verify start without torch's second of imports."""
    paths = families("llama")
    code = (
        "import sys\n"
        "from surgery.api import revert\n"
        "from surgery.checks.inspection import describe\n"
        "from surgery.engine.reader import open_checkpoint\n"
        "from surgery.checks.verify import verify\n"
        f"out = revert({str(paths['base'])!r}, {str(paths['trained'])!r}, {str(tmp_path / 'o')!r},"
        " '1:3', quiet=True)\n"
        "describe(open_checkpoint(out)); assert verify(out).ok\n"
        "assert 'torch' not in sys.modules"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_revert_from_the_command_line_never_imports_numpy(families, tmp_path):
    """`surgery revert` copies bytes: numpy (0.15 s of start-up) comes only with a blend."""
    paths = families("llama")
    argv = ["surgery", "revert", "--quiet", "--layers", "1:3"]
    argv += [str(paths["base"]), str(paths["trained"]), str(tmp_path / "o")]
    code = (
        "import sys, cli\n"
        "from pathlib import Path\n"
        f"sys.argv = {argv!r}\n"
        "try:\n    cli.main()\nexcept SystemExit as stop:\n    assert not stop.code, stop.code\n"
        "assert Path(sys.argv[-1]).is_dir(), 'no output'\n"
        "assert 'numpy' not in sys.modules, 'numpy was imported'"
    )
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert result.returncode == 0, result.stderr


# `lint-imports`, run by the interpreter of this test session.
_LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"


def test_layers_contract_holds():
    """pyproject.toml's import-linter contracts: every import points down, the engine never
    imports transformers or the Hub client, and no module cycles."""
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-c", _LINT_IMPORTS, "--no-cache"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def test_no_package_imports_the_cli():
    root = Path(__file__).resolve().parents[1]
    offenders = [
        str(path.relative_to(root))
        for package in ("surgery", "train", "eval", "demo", "diagnose")
        for path in (root / package).rglob("*.py")
        if re.search(r"^\s*(from cli import|import cli\b)", path.read_text(), re.MULTILINE)
    ]
    assert offenders == []

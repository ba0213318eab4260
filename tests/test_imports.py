"""The engine stands alone: importing it (or the CLI) must not import transformers."""

import subprocess
import sys


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

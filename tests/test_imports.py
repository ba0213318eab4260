"""The engine stands alone: importing it (or the CLI) must not import transformers."""

import subprocess
import sys


def test_engine_and_cli_do_not_import_transformers():
    code = (
        "import sys, cli, surgery.ops.soup, surgery.ops.revert, surgery.ops.interpolate, "
        "surgery.verify, surgery.inspection\n"
        "heavy = [m for m in ('transformers', 'peft', 'sacrebleu') if m in sys.modules]\n"
        "assert not heavy, heavy"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr

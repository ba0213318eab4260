"""Helpers for the training-wrapper tests: tiny corpora, tiny runs, checkpoint comparisons."""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import torch
from safetensors import safe_open

from surgery.core.layers import layer_of
from train.config import TrainConfig

_VOCABULARY = (
    "the cat sat on the mat a dog ran in the park hello world halo dunia numbers "
    "letters answer question passage sentence target english"
)
WORDS = _VOCABULARY.split()


def write_corpus(
    path: Path, docs: int = 60, words: int = 30, seed: int = 0, prefix: str = ""
) -> Path:
    """A small corpus in the format its suffix names (.txt, .jsonl, .jsonl.gz)."""
    rng = random.Random(seed)
    texts = [prefix + " ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(docs)]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".txt"):
        path.write_text("\n\n".join(texts) + "\n", encoding="utf-8")
    else:
        lines = "".join(json.dumps({"text": t}) + "\n" for t in texts)
        if path.name.endswith(".gz"):
            with gzip.open(path, "wt", encoding="utf-8") as handle:
                handle.write(lines)
        else:
            path.write_text(lines, encoding="utf-8")
    return path


def tiny_config(base: Path, out: Path, data: list[str], **overrides) -> TrainConfig:
    """A TrainConfig that trains a tiny model for a few steps in about a second; `overrides`
    by their command-line names (`l2sp_form="half"`), as `TrainConfig.from_options` takes them."""
    values = dict(
        max_steps=4,
        block_size=16,
        batch_size=2,
        learning_rate=1e-2,
        lr_scheduler="constant",
        logging_steps=2,
        progress=False,
        seed=0,
    )
    values.update(overrides)
    return TrainConfig.from_options(base=str(base), output=out, data=data, **values)


def load_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder."""
    tensors = {}
    for shard in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(shard, framework="pt") as handle:
            tensors.update({name: handle.get_tensor(name) for name in handle.keys()})  # noqa: SIM118
    return tensors


def headers(folder: Path) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    """name -> (shard file, dtype, shape) from the safetensors headers: what the engine needs."""
    result = {}
    for shard in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(shard, framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118
                view = handle.get_slice(name)
                result[name] = (shard.name, view.get_dtype(), tuple(view.get_shape()))
    return result


def in_layers(name: str, layers: set[int]) -> bool:
    """Whether a tensor belongs to one of `layers` of the text stack (not a vision tower)."""
    ref = layer_of(name)
    return ref is not None and ref[1] in layers and "vision" not in ref[0]


def relative_drift(trained: dict, base: dict, names: list[str]) -> float:
    """||w - w0|| / ||w0|| over the given tensors."""
    diff = sum(float((trained[n].float() - base[n].float()).square().sum()) for n in names)
    norm = sum(float(base[n].float().square().sum()) for n in names)
    return (diff / norm) ** 0.5


ROOT = Path(__file__).parents[2]


def train_command(base: Path, out: Path, corpus: str | Path, options: list[str]) -> list[str]:
    """This checkout's `cli.py train BASE OUT --data CORPUS OPTIONS`, for an interpreter or a
    launcher to run."""
    return [str(ROOT / "cli.py"), "train", str(base), str(out), "--data", str(corpus), *options]


def torchrun_train(
    ranks: int, base: Path, out: Path, corpus: str | Path, options: list[str], timeout: int = 300
) -> subprocess.CompletedProcess:
    """`surgery train BASE OUT --data CORPUS OPTIONS` under `torchrun --nproc-per-node RANKS`
    (offline, one thread per rank, this checkout first on the path)."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    launcher += ["--nproc-per-node", str(ranks)]
    command = [*launcher, *train_command(base, out, corpus, options)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )

"""Benchmark: a union soup of three experts whose vocabularies differ, against mergekit.

Each expert is bench_engine's Llama-shaped bf16 checkpoint (about 0.97B parameters) with 1,000
tokens added to a 32,000-token tokenizer and its embedding and head grown by 1,000 rows. The
added tokens overlap in part: expert1 adds new0..new999, expert2 new500..new1499 and expert3
new1000..new1999, so the union has 34,000 tokens and 1,000 of its rows are the mean of the two
experts that have the token (mergekit's default row). Alternately, `surgery soup
--tokenizer-source union` and `mergekit-yaml` (linear, `tokenizer_source: union`) run with warm
inputs; the row gives wall time and peak private memory (RssAnon) of each and their ratios.
Shards that hold no vocabulary tensor are symlinks to the inputs' (bench_engine's two shards
hold the embedding and the head, so both are rewritten).
Run by hand:  python bench/bench_tokenizers.py [--inputs DIR] [--work DIR] [--repeat 3]
              (--inputs: where bench_engine's expert1..3 are, built there when missing)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).parent))
from bench_engine import VOCAB, ensure_checkpoints, mergekit, size_arguments, surgery
from measure import Measurement, median_run

ADDED = 1000
EXPERTS = ("expert1", "expert2", "expert3")
VOCAB_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")


def base_tokenizer():
    """A 32,000-token BPE tokenizer (one token per word `w<i>`, no merges): deterministic and
    offline, the size of the checkpoints' vocabulary."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials)}
    vocab |= {f"w{i}": i for i in range(len(specials), VOCAB)}
    model = tokenizers.models.BPE(vocab=vocab, merges=[], unk_token="<unk>")
    inner = tokenizers.Tokenizer(model)
    inner.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=inner, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def grow_expert(source: Path, target: Path, number: int) -> None:
    """`source` with tokens new{500(n-1)}..new{500(n-1)+999} added: vocabulary tensors grown by
    seeded bf16 rows, other shards and files linked or copied."""
    target.mkdir(parents=True)
    index = json.loads((source / "model.safetensors.index.json").read_text())
    vocab_files = {index["weight_map"][name] for name in VOCAB_TENSORS}
    gen = torch.Generator().manual_seed(100 + number)
    for shard in sorted(set(index["weight_map"].values())):
        if shard not in vocab_files:
            (target / shard).symlink_to(source / shard)
            continue
        tensors = load_file(source / shard)
        for name in VOCAB_TENSORS:
            if name in tensors:
                old = tensors[name]
                added = (torch.randn(ADDED, old.shape[1], generator=gen) * 0.02).to(old.dtype)
                tensors[name] = torch.cat([old, added])
        save_file(tensors, target / shard, metadata={"format": "pt"})
        del tensors
    shutil.copy(source / "model.safetensors.index.json", target)
    config = json.loads((source / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(config | {"vocab_size": VOCAB + ADDED}))
    tokenizer = base_tokenizer()
    first = 500 * (number - 1)
    tokenizer.add_tokens([f"new{i}" for i in range(first, first + ADDED)])
    tokenizer.save_pretrained(target)


def ensure_experts(inputs: Path, work: Path, layers: int, hidden: int) -> list[str]:
    """The three grown experts under `work`, built from `inputs` (and those first) if missing."""
    missing = [name for name in EXPERTS if not (work / name).exists()]
    if missing:
        ensure_checkpoints(inputs, layers, hidden, EXPERTS)
    for number, name in enumerate(EXPERTS, start=1):
        if name in missing:
            print(f"growing {name} ...", file=sys.stderr)
            grow_expert(inputs / name, work / name, number)
    return [str(work / name) for name in EXPERTS]


def config_text(experts: list[str]) -> str:
    """The soup as mergekit YAML: linear, equal weights, the union of the tokenizers."""
    models = "".join(f"  - model: {e}\n    parameters: {{weight: 1.0}}\n" for e in experts)
    return f"merge_method: linear\ndtype: bfloat16\ntokenizer_source: union\nmodels:\n{models}"


def run(inputs: Path, work: Path, layers: int, hidden: int, repeat: int) -> tuple:
    """(ours, mergekit's): the median of `repeat` alternated runs of each."""
    experts = ensure_experts(inputs, work, layers, hidden)
    ours_runs: list[Measurement] = []
    theirs_runs: list[Measurement] = []
    soup = ["soup", "--tokenizer-source", "union", *experts]
    for _ in range(repeat):  # alternated, so that a slow spell of the machine hits both
        ours_runs.append(surgery(soup, work / "out-soup", experts))
        theirs_runs.append(mergekit(config_text(experts), work, "out-mk", experts))
        print(f"surgery {ours_runs[-1].seconds:.1f} s, mergekit {theirs_runs[-1].seconds:.1f} s")
    return median_run(ours_runs), median_run(theirs_runs)


def report(ours: Measurement, theirs: Measurement) -> str:
    """The row of docs/benchmarks.md: times, peaks and their ratios."""
    failed = " (failed)" if ours.returncode or theirs.returncode else ""
    return (
        "| operation | surgery s | mergekit s | ratio | surgery MB | mergekit MB | memory ratio |\n"
        "|---|---|---|---|---|---|---|\n"
        f"| union soup, 3 x {ADDED} added tokens{failed} | {ours.seconds:.1f} | "
        f"{theirs.seconds:.1f} | {ours.seconds / theirs.seconds:.2f}x | "
        f"{ours.peak_anon / 2**20:.0f} | {theirs.peak_anon / 2**20:.0f} | "
        f"{ours.peak_anon / theirs.peak_anon:.2f}x |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=Path, default=Path("bench/out"))
    parser.add_argument("--repeat", type=int, default=1, help="runs per tool (median time)")
    args = size_arguments(__doc__, "bench/out-tokenizers", parser)
    ours, theirs = run(args.inputs, args.work, args.layers, args.hidden, args.repeat)
    print(report(ours, theirs))


if __name__ == "__main__":
    main()

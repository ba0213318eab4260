"""Honest multi-device runs (no DataParallel replay, exact token counts), a seed that seeds,
and LoRA merged from gathered state dicts (the FSDP save path) against peft's own merge."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import train.assemble as train_assemble
from tests.support.train_helpers import load_tensors, tiny_config, write_corpus
from train.api import train
from train.layer_map import layer_map
from train.strategies.lora import apply_lora, merge_lora, merge_lora_state_dict, parse_lora


@pytest.fixture
def corpus(tmp_path):
    return str(write_corpus(tmp_path / "data" / "sk.jsonl", docs=80))


def _two_devices(monkeypatch, guard: bool) -> None:
    """Simulate a machine with two GPUs and one process: the Trainer's DataParallel case.

    On CPU, DataParallel has no devices to split over and runs the module as it is, but the
    Trainer still takes a batch per "device" per step, which is what used to exhaust the data.
    """
    build = train_assemble.training_arguments

    def arguments(*given):
        args = build(*given)
        _ = args.device  # let TrainingArguments set itself up, then claim two GPUs
        args._n_gpu = 2
        return args

    monkeypatch.setattr(train_assemble, "training_arguments", arguments)
    if not guard:
        monkeypatch.setattr(
            train_assemble, "single_device_instead_of_data_parallel", lambda a: False
        )


def _record(folder) -> dict:
    return json.loads((folder / "surgery_train.json").read_text())


@pytest.mark.parametrize("guard", [True, False])
def test_data_parallel_never_replays_and_counts_tokens_exactly(
    families, tmp_path, corpus, monkeypatch, caplog, guard
):
    _two_devices(monkeypatch, guard)
    base = families("llama")["base"]
    steps, batch, block = 4, 2, 16
    with caplog.at_level(logging.WARNING):
        out = train(
            tiny_config(base, tmp_path / "out", [corpus], max_steps=steps, batch_size=batch)
        )
    record = _record(out)
    # One device with a warning; with the guard off, the schedule follows the Trainer's real
    # global batch (two devices' worth). Either way each step holds what the Trainer takes.
    devices = 1 if guard else 2
    assert record["global_batch_blocks"] == batch * devices
    assert record["tokens"] == steps * batch * devices * block
    assert record["steps"] == steps
    # The Trainer never ran out of data and started it over (a second epoch).
    assert max(line["epoch"] for line in record["log_history"]) <= 1.0
    assert not any("ran out" in r.getMessage() for r in caplog.records)
    warned = [
        r.getMessage() for r in caplog.records if "torchrun --nproc-per-node 2" in r.getMessage()
    ]
    assert bool(warned) == guard


def test_seeds_give_different_checkpoints(families, tmp_path, corpus):
    base = families("llama")["base"]
    runs = {
        name: load_tensors(train(tiny_config(base, tmp_path / name, [corpus], **options)))
        for name, options in {
            "s0": {"seed": 0},
            "s0again": {"seed": 0},
            "s1": {"seed": 1},
            "ordered0": {"seed": 0, "shuffle_buffer": 0},
            "ordered1": {"seed": 1, "shuffle_buffer": 0},
        }.items()
    }

    def same(a, b):
        return all(torch.equal(runs[a][n], runs[b][n]) for n in runs[a])

    assert same("s0", "s0again")
    assert not same("s0", "s1")
    # Without shuffling one source in file order is the same data whatever the seed.
    assert same("ordered0", "ordered1")


def test_lora_merge_of_a_gathered_state_dict_equals_peft_merge(families):
    from transformers import AutoModelForCausalLM

    base = families("llama")["base"]
    spec = parse_lora("r=4,alpha=8")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base)
    layers = layer_map((n for n, _ in model.named_parameters()), 4).layers
    model = apply_lora(model, spec, None, "model.layers", layers)
    with torch.no_grad():  # B starts at zero: give the adapters something to merge
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    gathered = {k: v.clone() for k, v in model.state_dict().items()}
    ours = merge_lora_state_dict(gathered, spec)
    peft = merge_lora(model).state_dict()
    assert ours.keys() == peft.keys()
    before = AutoModelForCausalLM.from_pretrained(base).state_dict()
    assert sum(not torch.equal(ours[n], before[n]) for n in ours) >= 4 * 7  # 4 layers x 7
    assert max(float((ours[n] - peft[n]).abs().max()) for n in ours) < 1e-6

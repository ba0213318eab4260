"""--grad-noise: seeded Gaussian noise on the trained parameters' gradients."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from cli import cli
from tests.support.train_helpers import in_layers, load_tensors, tiny_config, write_corpus
from train.api import strategies, train
from train.errors import TrainConfigError


@pytest.fixture
def corpus(tmp_path):
    return str(write_corpus(tmp_path / "data" / "sk.jsonl", docs=80))


def test_noise_moves_trained_weights_only_and_repeats_with_the_seed(families, tmp_path, corpus):
    base = families("llama")["base"]
    runs = {
        name: load_tensors(train(tiny_config(base, tmp_path / name, [corpus], **options)))
        for name, options in {
            "plain": dict(freeze="1:3"),
            "noisy": dict(freeze="1:3", grad_noise=0.5),
            "again": dict(freeze="1:3", grad_noise=0.5),
        }.items()
    }
    frozen = [n for n in runs["plain"] if in_layers(n, {1, 2})]
    trained = [n for n in runs["plain"] if n not in frozen]
    assert all(torch.equal(runs["noisy"][n], runs["plain"][n]) for n in frozen)
    assert not any(torch.equal(runs["noisy"][n], runs["plain"][n]) for n in trained)
    assert all(torch.equal(runs["noisy"][n], runs["again"][n]) for n in runs["plain"])


def test_option_help_summary_and_errors(families, tmp_path, corpus):
    assert "--grad-noise SIGMA" in CliRunner().invoke(cli, ["train", "--help"]).output
    config = tiny_config(families("llama")["base"], tmp_path / "o", [corpus], grad_noise=0.1)
    assert strategies(config) == "strategies: --grad-noise 0.1"
    for bad in (0.0, -1.0, float("nan")):
        config.grad_noise = bad
        with pytest.raises(TrainConfigError, match="--grad-noise must be positive"):
            config.validate()

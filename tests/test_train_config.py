"""Option parsing and validation of the training wrapper (no training)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from cli import cli
from surgery.core.errors import CheckpointError, LayerSpecError, OutputError
from surgery.core.layers import layer_groups
from tests.support.train_helpers import tiny_config, write_corpus
from train.arguments import training_arguments
from train.errors import TrainConfigError
from train.fields import cli as option
from train.sources import DataSource, normalize_shares, parse_data_source
from train.strategies.curriculum import apply_mix_until
from train.strategies.lora import parse_lora


def test_data_source_forms(tmp_path):
    path = write_corpus(tmp_path / "sk.jsonl")
    assert parse_data_source(f"slavic={path}:0.8") == DataSource("slavic", str(path), 0.8)
    assert parse_data_source(str(path)) == DataSource("sk", str(path), None)
    hub = parse_data_source("en=hub:allenai/madlad-400#en@clean:0.2")
    assert (hub.name, hub.location, hub.share, hub.hub) == (
        "en",
        "allenai/madlad-400#en@clean",
        0.2,
        True,
    )
    assert parse_data_source("hub:org/set").location == "org/set"


@pytest.mark.parametrize(
    "spec", ["en=data.txt:abc", "en=data.txt:-0.2", "en=data.txt:0", "en=data.txt:nan", "en=:0.5"]
)
def test_bad_shares(spec):
    with pytest.raises(TrainConfigError):
        parse_data_source(spec)


def test_shares_normalize_and_must_be_all_or_none():
    sources = normalize_shares([DataSource("a", "x", 4.0), DataSource("b", "y", 1.0)])
    assert [s.share for s in sources] == pytest.approx([0.8, 0.2])
    equal = normalize_shares([DataSource("a", "x"), DataSource("b", "y")])
    assert [s.share for s in equal] == [0.5, 0.5]
    with pytest.raises(TrainConfigError, match="every --data source or to none"):
        normalize_shares([DataSource("a", "x", 0.5), DataSource("b", "y")])
    with pytest.raises(TrainConfigError, match="unique"):
        normalize_shares([DataSource("a", "x"), DataSource("a", "y")])


def test_mix_until():
    sources = normalize_shares([DataSource("sk", "x", 0.8), DataSource("en", "y", 0.2)])
    assert apply_mix_until(sources, ["0.1"])[1].until == 0.1
    assert apply_mix_until(sources, ["sk=0.5"])[0].until == 0.5
    for bad, message in [
        ("fr=0.1", "no --data source"),
        ("1.5", r"\(0, 1\]"),
        ("x", "not a number"),
    ]:
        with pytest.raises(TrainConfigError, match=message):
            apply_mix_until(sources, [bad])
    with pytest.raises(TrainConfigError, match="leave at least one"):
        apply_mix_until(sources, ["sk=0.5", "en=0.5"])
    with pytest.raises(TrainConfigError, match="two --data"):
        apply_mix_until(sources[:1], ["0.1"])


def test_lora_spec():
    spec = parse_lora("r=16,alpha=32")
    assert (spec.r, spec.alpha, spec.dropout, spec.targets) == (16, 32.0, 0.0, "all-linear")
    assert parse_lora("r=4,targets=q_proj+v_proj").targets == ("q_proj", "v_proj")
    for bad in ["alpha=3", "r=0", "r=4,beta=1", "r=x", "r=4,dropout=1"]:
        with pytest.raises(TrainConfigError):
            parse_lora(bad)


def test_drift_groups_follow_the_named_ranges():
    assert [g for _, g in layer_groups(None, 34, range(9, 28))] == [
        tuple(range(9)),
        tuple(range(9, 28)),
        tuple(range(28, 34)),
    ]
    labels = [label for label, _ in layer_groups(None, 34)]
    assert labels == ["layers_0:11", "layers_11:22", "layers_22:34"]
    assert [g for _, g in layer_groups("0:2,2:4", 4)] == [(0, 1), (2, 3)]


@pytest.fixture
def llama(families):
    return families("llama")["base"]


def test_validate_resolves_specs(llama, tmp_path):
    data = write_corpus(tmp_path / "d.txt")
    plan = tiny_config(
        llama, tmp_path / "out", [str(data)], freeze="1:3", l2sp="1:3=0.05,*=0.001"
    ).validate()
    strategies = plan.strategies
    assert plan.layout.text_stack.num_layers == 4 and strategies.frozen_layers == (1, 2)
    assert strategies.l2sp.value_for(1) == 0.05 and strategies.l2sp.value_for(None) == 0.001
    assert plan.sources[0].share == 1.0
    # Parsed once, at the boundary: the steps below get typed values, never spec strings.
    assert plan.dtype is torch.float32
    assert strategies.drift_groups == (
        ("layers_0", (0,)),
        ("layers_1:3", (1, 2)),
        ("layers_3", (3,)),
    )
    early = (
        tiny_config(
            llama,
            tmp_path / "out",
            [str(data)],
            eval_every=2,
            eval_tasks=("ppl:x",),
            early_stopping="ppl/ppl",
            lora="r=4",
        )
        .validate()
        .strategies
    )
    assert early.early_stopping.metric == "ppl/ppl" and not early.early_stopping.greater_is_better
    assert early.lora.r == 4 and early.lora.alpha == 4.0


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ({"freeze": "2:9"}, LayerSpecError, "outside the model"),
        ({"l2sp": "1:3=-0.05"}, TrainConfigError, "lambda must be >= 0"),
        ({"l2sp": "0:9=0.1"}, LayerSpecError, "outside the model"),
        ({"max_steps": None}, TrainConfigError, "exactly one budget"),
        ({"ema": 1.0}, TrainConfigError, "in \\(0, 1\\)"),
        ({"lora": "r=4", "ema": 0.9}, TrainConfigError, "baseline on its own"),
        ({"dtype": "int8"}, TrainConfigError, "--train-dtype"),
        ({"block_size": 4096}, TrainConfigError, "exceeds the model's context"),
        ({"batch_size": 0}, TrainConfigError, "--batch-size must be positive"),
        ({"eval_every": 0, "eval_tasks": ["copain"]}, TrainConfigError, "--eval-every must be"),
        ({"eval_every": 2}, TrainConfigError, "go together"),
        ({"eval_tasks": ["copain"]}, TrainConfigError, "go together"),
    ],
)
def test_validate_errors(llama, tmp_path, overrides, error, message):
    data = write_corpus(tmp_path / "d.txt")
    with pytest.raises(error, match=message):
        tiny_config(llama, tmp_path / "out", [str(data)], **overrides).validate()


def test_specs_that_need_no_layer_count_are_refused_before_base_is_opened(tmp_path):
    """--modules and --dtype are parsed at the boundary: a bad one is refused before BASE is
    looked up (here BASE does not exist)."""
    data = write_corpus(tmp_path / "d.txt")
    missing = tmp_path / "no-such-base"
    with pytest.raises(LayerSpecError, match="not a valid regex"):
        tiny_config(missing, tmp_path / "out", [str(data)], freeze="0", modules="(").validate()
    with pytest.raises(TrainConfigError, match="--train-dtype"):
        tiny_config(missing, tmp_path / "out", [str(data)], dtype="int8").validate()


def test_data_errors(llama, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text('{"text": " "}\n\n')
    (tmp_path / "notext.jsonl").write_text('{"body": "hello"}\n')
    (tmp_path / "data.csv").write_text("a,b\n")
    cases = {
        str(tmp_path / "missing.txt"): "does not exist",
        str(tmp_path / "empty.jsonl"): "is empty",
        str(tmp_path / "blank.jsonl"): "has no text",
        str(tmp_path / "notext.jsonl"): "no string 'text' field",
        str(tmp_path / "data.csv"): "is not one of",
    }
    for data, message in cases.items():
        with pytest.raises(TrainConfigError, match=message):
            tiny_config(llama, tmp_path / "out", [data]).validate()


def test_output_rules(llama, tmp_path):
    data = write_corpus(tmp_path / "d.txt")
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    with pytest.raises(OutputError, match="already exists"):
        tiny_config(llama, out, [str(data)]).validate()
    assert tiny_config(llama, out, [str(data)], resume=True).validate().resume_from is None
    (out / "config.json").write_text("{}")
    with pytest.raises(OutputError, match="not resumed"):
        tiny_config(llama, out, [str(data)], resume=True).validate()


def test_force_and_resume_rules(llama, tmp_path):
    """A finished run in OUT is refused unless --force; --resume still continues OUT/checkpoints
    (with --force too); without --resume, --force discards them when training starts."""
    data = write_corpus(tmp_path / "d.txt")
    out = tmp_path / "out"
    (out / "checkpoints" / "checkpoint-3").mkdir(parents=True)
    (out / "config.json").write_text("{}")
    with pytest.raises(OutputError, match="pass --force to replace it"):
        tiny_config(llama, out, [str(data)]).validate()
    with pytest.raises(OutputError, match=r"not resumed \(--force replaces it\)"):
        tiny_config(llama, out, [str(data)], resume=True).validate()
    forced = tiny_config(llama, out, [str(data)], force=True).validate()
    assert forced.resume_from is None and forced.discard_checkpoints
    both = tiny_config(llama, out, [str(data)], force=True, resume=True).validate()
    assert both.resume_from == out / "checkpoints" / "checkpoint-3"
    assert not both.discard_checkpoints
    # Validation touches nothing.
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "config.json"]
    (out / "file").write_text("")
    with pytest.raises(OutputError, match="not a folder"):
        tiny_config(llama, out / "file", [str(data)], force=True).validate()


def test_force_never_replaces_an_input(llama, tmp_path):
    """OUT may not be BASE, lie inside it, or hold or lie inside a --data source, --force or
    not: replacing OUT would delete them."""
    corpus = tmp_path / "corpus"
    data = write_corpus(corpus / "d.txt")
    cases = [
        (llama, [str(data)], "lies inside the input"),
        (llama / "sub", [str(data)], "lies inside the input"),
        (llama.parent, [str(data)], "contains the input"),
        (corpus / "out", [str(corpus)], "lies inside the input"),
        (corpus, [str(data)], "contains the input"),
    ]
    for out, sources, message in cases:
        with pytest.raises(OutputError, match=message):
            tiny_config(llama, out, sources, force=True).validate()
    assert not (llama / "sub").exists() and not (corpus / "out").exists()


def test_base_must_exist(tmp_path):
    data = write_corpus(tmp_path / "d.txt")
    # Resolved by the one Hub resolver (surgery.hub.resolve); the suite runs offline.
    with pytest.raises(CheckpointError, match="not a local path and not in the Hub cache"):
        tiny_config("nobody/no-such-model", tmp_path / "o", [str(data)]).validate()
    (tmp_path / "weights").mkdir()
    save_file({"w": torch.ones(2)}, tmp_path / "weights" / "model.safetensors")
    with pytest.raises(CheckpointError, match="has no config.json"):
        tiny_config(tmp_path / "weights", tmp_path / "o", [str(data)]).validate()


def test_output_inside_base_is_refused(llama, tmp_path):
    data = write_corpus(tmp_path / "d.txt")
    with pytest.raises(OutputError, match="lies inside the input"):
        tiny_config(llama, llama / "out", [str(data)]).validate()
    assert not (llama / "out").exists()


def test_report_to_and_precision_pass_through(llama, tmp_path):
    data = write_corpus(tmp_path / "d.txt")
    plan = tiny_config(
        llama, tmp_path / "out", [str(data)], report_to="tensorboard", warmup=0.1, grad_accum=3
    ).validate()
    args = training_arguments(plan.config, plan.checkpoints_dir, plan.strategies.arguments())
    assert args.report_to == ["tensorboard"]
    assert args.gradient_accumulation_steps == 3 and args.warmup_steps == 0.1
    assert args.output_dir == str(tmp_path / "out" / "checkpoints")


def test_cli_reports_errors_in_one_line(llama, tmp_path):
    data = write_corpus(tmp_path / "d.txt")
    runner = CliRunner()
    cases = [
        (["--data", f"{data}:x"], "share 'x' does not parse"),
        (["--data", str(data), "--freeze", "0:40"], "outside the model"),
        (["--data", str(data), "--l2sp", "*=-1"], "lambda must be >= 0"),
        (["--data", str(tmp_path / "none.jsonl")], "does not exist"),
    ]
    for extra, message in cases:
        result = runner.invoke(
            cli, ["train", str(llama), str(tmp_path / "o"), "--max-steps", "2", *extra]
        )
        assert result.exit_code == 2, result.output
        assert result.output.startswith("error: ") and message in result.output
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    result = runner.invoke(
        cli, ["train", str(llama), str(tmp_path / "taken"), "--data", str(data), "--max-steps", "2"]
    )
    assert result.exit_code == 2 and "already exists" in result.output


def test_cli_options_are_generated_from_the_config_fields(monkeypatch, tmp_path):
    """Every TrainConfig field, and every field of a strategy's option group, has its option,
    in field order; values arrive typed in the config, in their groups."""
    import train.api
    from train.config import TrainConfig
    from train.fields import flag_of, options_of

    captured = {}

    def fake_train(config, score=None):
        captured["config"] = config
        return config.output

    monkeypatch.setattr(train.api, "train", fake_train)
    runner = CliRunner()
    help_text = runner.invoke(cli, ["train", "--help"]).output
    flags = [
        flag_of(option.key, option.field.metadata)
        for option in options_of(TrainConfig)
        if not option.field.metadata["cli"]["argument"]
        and not option.field.metadata["cli"]["hidden"]
    ]
    assert {"--l2sp", "--l2sp-form", "--no-drift", "--mix-until", "--patience"} <= set(flags)
    options = help_text[help_text.index("Options:") :]
    places = [options.find(f" {flag} ") for flag in flags]
    assert -1 not in places and places == sorted(places), flags
    args = [
        "train",
        "b",
        str(tmp_path / "o"),
        "--data",
        "x.txt",
        "--data",
        "y.txt:2",
        "--lr",
        "0.5",
        "--max-steps",
        "3",
        "--ema",
        "0.9",
        "--no-drift",
        "-q",
        "--fsdp",
        "full_shard auto_wrap",
        "--mixed-precision",
        "bf16",
        "--shuffle-buffer",
        "0",
    ]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    config = captured["config"]
    assert config.data == ("x.txt", "y.txt:2") and config.learning_rate == 0.5
    assert config.max_steps == 3 and config.max_tokens is None and config.ema.alpha == 0.9
    assert config.drift.log is False and config.progress is False and config.shuffle_buffer == 0
    assert config.fsdp == "full_shard auto_wrap" and config.mixed_precision == "bf16"
    assert config.batch_size == 8 and config.save_total_limit == 2  # the fields' defaults
    bad = runner.invoke(cli, ["train", "b", "o", "--data", "x", "--mixed-precision", "fp8"])
    assert bad.exit_code == 2


def test_cli_eval_every_errors_are_one_line_and_come_first(llama, tmp_path):
    """--eval-every and -t go together; a bad task string or missing task data fails before
    any weight is loaded, in one line, leaving no OUT."""
    data = write_corpus(tmp_path / "d.txt")
    held = write_corpus(tmp_path / "held.txt", docs=4)
    out = tmp_path / "o"
    common = ["train", str(llama), str(out), "--data", str(data), "--max-steps", "2"]
    cases = [
        (["--eval-every", "2"], "--eval-every N and -t/--task TASK go together"),
        (["-t", f"ppl:{held}"], "--eval-every N and -t/--task TASK go together"),
        (["--eval-every", "2", "-t", "nope:x"], "unknown kind 'nope'"),
        (["--eval-every", "2", "-t", f"ppl:{tmp_path / 'missing.txt'}"], "missing.txt"),
        (["--eval-every", "0", "-t", f"ppl:{held}"], "--eval-every must be positive"),
    ]
    runner = CliRunner()
    for extra, message in cases:
        result = runner.invoke(cli, [*common, *extra])
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
        assert not out.exists()


def test_options_by_flag_name_build_the_strategies_groups():
    """`from_options` takes the command line's flat names; `as_options` gives them back, in the
    order of `--help`, as the training record holds them."""
    from train.config import TrainConfig
    from train.strategies.drift import DriftOptions
    from train.strategies.l2sp import L2SPOptions

    flat = dict(base="b", output="o", data=["x.txt"], l2sp="1:3=0.1", l2sp_form="half")
    config = TrainConfig.from_options(**flat, drift=False, max_steps=2)
    nested = TrainConfig(
        base="b",
        output="o",
        data=["x.txt"],
        max_steps=2,
        l2sp=L2SPOptions(lambdas="1:3=0.1", form="half"),
        drift=DriftOptions(log=False),
    )
    assert config == nested and config.ema.alpha is None and config.drift.groups is None
    options = config.as_options()
    assert list(options)[:6] == ["base", "output", "data", "max_steps", "max_tokens", "mix_until"]
    assert options["l2sp_form"] == "half" and options["drift"] is False
    assert TrainConfig.from_options(**options) == config
    with pytest.raises(TypeError, match="no option 'l2sp_lambdas'"):
        TrainConfig.from_options(**flat, l2sp_lambdas="1")


@dataclasses.dataclass
class _Seeded:
    seed: int = dataclasses.field(default=1, metadata=option("Another seed.", flag="--seed"))


@dataclasses.dataclass
class _TwiceSeeded:
    seed: int = dataclasses.field(default=0, metadata=option("The seed."))
    seeded: _Seeded = dataclasses.field(default_factory=_Seeded)


def test_a_flag_named_twice_is_refused():
    """A strategy's option whose flag another option has would share its command-line name."""
    from train.fields import options_of

    with pytest.raises(TypeError, match="options named twice: seed"):
        options_of(_TwiceSeeded)

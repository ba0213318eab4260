"""The `surgery` CLI: each command end to end, and each bad input's one-line error, exit code 2,
and nothing left behind."""

import json
import shutil
import struct

import pytest
from click.testing import CliRunner

from cli import cli
from tests.support.checks import assert_valid_output, load_state, same_bits


def run(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args])


def assert_refused(result, message: str, folder):
    """Exit 2, one line on stderr naming the problem, no traceback, nothing new in `folder`."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0], lines[0]
    assert not [p for p in folder.iterdir() if p.name.startswith(".") or p.name == "out"]


@pytest.fixture
def llama(families, tmp_path):
    """Private copies of the llama family that a test may damage."""
    paths = families("llama")
    work = tmp_path / "inputs"
    for name in ("base", "trained"):
        shutil.copytree(paths[name], work / name)
    return work / "base", work / "trained"


def test_commands_end_to_end(families, tmp_path):
    paths = families("gemma3mm")
    base, trained, experts = paths["base"], paths["trained"], paths["experts"]
    result = run("revert", "--layers", "1:3", "-q", base, trained, tmp_path / "rev")
    assert result.exit_code == 0, result.output
    result = run("soup", "--weights", "1,2,1", "-q", *experts, tmp_path / "soup")
    assert result.exit_code == 0, result.output
    result = run("interpolate", "--alpha", "1:3=0.5,*=1", "-q", base, trained, tmp_path / "int")
    assert result.exit_code == 0, result.output
    for name in ("rev", "soup", "int"):
        assert_valid_output(tmp_path / name)
    result = run("inspect", tmp_path / "rev")
    assert result.exit_code == 0
    assert "text: 4 layers (language_model.model.layers.N)" in result.output
    assert "vision: 2 layers" in result.output and "recipe      revert" in result.output
    info = json.loads(run("inspect", "--json", tmp_path / "soup").output)
    assert info["recipe"]["weights"] == [1.0, 2.0, 1.0] and info["parameters"] > 0
    result = run("verify", tmp_path / "int")
    assert result.exit_code == 0 and result.output.strip().endswith("ok")


def test_progress_bar_on_stderr_unless_quiet(families, tmp_path):
    paths = families("llama")
    loud = run("revert", "--layers", "0", paths["base"], paths["trained"], tmp_path / "a")
    quiet = run("revert", "--layers", "0", "-q", paths["base"], paths["trained"], tmp_path / "b")
    assert "revert:" in loud.stderr and "wrote" in loud.stderr
    assert quiet.stderr == "" and quiet.output == ""


def test_existing_output_needs_force(families, tmp_path):
    paths = families("llama")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    result = run("revert", "--layers", "0", paths["base"], paths["trained"], tmp_path / "out")
    assert result.exit_code == 2 and "pass --force" in result.stderr
    assert (tmp_path / "out" / "keep.txt").exists()
    result = run(
        "revert",
        "--layers",
        "0",
        "-q",
        "--force",
        paths["base"],
        paths["trained"],
        tmp_path / "out",
    )
    assert result.exit_code == 0 and not (tmp_path / "out" / "keep.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_output_inside_or_containing_an_input_is_refused(llama):
    base, trained = llama
    before = sorted(p.name for p in trained.iterdir())
    for out in (trained, trained / "sub", base.parent):
        result = run("revert", "--layers", "0", "--force", base, trained, out)
        assert result.exit_code == 2 and "input" in result.stderr, result.stderr
    assert sorted(p.name for p in trained.iterdir()) == before


def _damage_header(shard, edit):
    raw = shard.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    edit(header)
    text = json.dumps(header).encode()
    shard.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length :])


def _overlap(header):
    names = sorted(
        (k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"]
    )
    first, second = header[names[0]], header[names[1]]
    size = second["data_offsets"][1] - second["data_offsets"][0]
    second["data_offsets"] = [first["data_offsets"][0], first["data_offsets"][0] + size]


def _reshape(header):
    name = next(k for k in header if k.endswith("up_proj.weight"))
    header[name]["shape"] = header[name]["shape"][::-1]


DAMAGE = {
    "truncated": (lambda s: s.write_bytes(s.read_bytes()[:-100]), "truncated"),
    "corrupt_header": (
        lambda s: s.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage!!!!!!!}"),
        "not JSON",
    ),
    "overlapping": (lambda s: _damage_header(s, _overlap), "overlaps"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_damaged_shards_are_refused(llama, tmp_path, case):
    base, trained = llama
    damage, message = DAMAGE[case]
    damage(sorted(trained.glob("*.safetensors"))[1])
    result = run("revert", "--layers", "0", base, trained, tmp_path / "out")
    assert_refused(result, message, tmp_path)
    verdict = run("verify", trained)
    assert verdict.exit_code == 1 and "defect:" in verdict.output


def test_shape_mismatch_and_missing_tensor_are_refused(llama, tmp_path):
    base, trained = llama
    shard = sorted(trained.glob("*.safetensors"))[0]
    original = shard.read_bytes()
    _damage_header(shard, _reshape)
    result = run("soup", base, trained, tmp_path / "out")
    assert_refused(result, "has shape", tmp_path)
    shard.write_bytes(original)
    index_path = trained / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    from safetensors.torch import load_file, save_file

    last = sorted(trained.glob("*.safetensors"))[-1]
    tensors = load_file(last)
    dropped = sorted(tensors)[0]
    del tensors[dropped], index["weight_map"][dropped]
    save_file(tensors, last, metadata={"format": "pt"})
    index_path.write_text(json.dumps(index))
    result = run("interpolate", "--alpha", "0.5", base, trained, tmp_path / "out")
    assert_refused(result, f"different tensors: only in base: {dropped}", tmp_path)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["revert", "--layers", "2:9"], "outside the model's 4 layers"),
        (["revert", "--layers", "3:3"], "selects no layers"),
        (["revert", "--layers", "0", "--stack", "vision"], "no layer stack named 'vision'"),
        (["interpolate", "--alpha", "x"], "not a number"),
        (["interpolate", "--alpha", "nan"], "not a finite number"),
        (["revert", "--layers", "0", "--dtype", "int8"], "unknown dtype"),
        (["revert", "--layers", "0", "--max-shard-size", "lots"], "cannot parse size"),
    ],
)
def test_bad_requests_are_refused(llama, tmp_path, args, message):
    base, trained = llama
    assert_refused(run(*args, base, trained, tmp_path / "out"), message, tmp_path)


def test_soup_weight_errors_and_missing_input(llama, tmp_path):
    base, trained = llama
    assert_refused(
        run("soup", "--weights", "1", base, trained, tmp_path / "out"), "1 values for 2", tmp_path
    )
    assert_refused(run("soup", base, tmp_path / "nope", tmp_path / "out"), "no such file", tmp_path)
    assert run("verify", tmp_path / "nope").exit_code == 2


def test_debug_shows_traceback(llama, tmp_path):
    base, trained = llama
    result = run("--debug", "revert", "--layers", "9", base, trained, tmp_path / "out")
    assert result.exit_code != 0 and result.exception is not None
    assert "LayerSpecError" in type(result.exception).__name__


def test_inputs_are_never_modified(llama, tmp_path):
    base, trained = llama
    before = {p: p.read_bytes() for p in [*base.iterdir(), *trained.iterdir()]}
    for args in (["revert", "--layers", "0:2"], ["interpolate", "--alpha", "0.3"], ["soup"]):
        assert run(*args, "-q", base, trained, tmp_path / args[0]).exit_code == 0
    assert {p: p.read_bytes() for p in before} == before
    reverted = load_state(tmp_path / "revert")
    assert same_bits(
        reverted["model.layers.0.mlp.up_proj.weight"],
        load_state(base)["model.layers.0.mlp.up_proj.weight"],
    )


def test_verify_values_flags_nan(tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file(
        {"w": torch.tensor([1.0, float("nan")]), "i": torch.tensor([1])}, tmp_path / "m.safetensors"
    )
    assert run("verify", tmp_path / "m.safetensors").exit_code == 0
    result = run("verify", "--values", "-q", tmp_path / "m.safetensors")
    assert result.exit_code == 1 and "'w': 1 NaN or infinite values" in result.output


@pytest.mark.parametrize(
    "command",
    [
        ["interpolate", "--alpha", "1.5"],
        ["interpolate", "--alpha", "-0.2"],
        ["interpolate", "--alpha", "2:4=0.3,*=2"],
        ["sweep", "--alphas", "0:1.5:0.5", "-o", "{out}"],
    ],
)
def test_alphas_outside_0_1_need_extrapolate(llama, tmp_path, command):
    base, trained = llama
    out = str(tmp_path / "out")
    # sweep names its folder with -o; the others take OUT last.
    args = (
        [a.format(out=out) for a in command] + [base, trained] + ([] if "-o" in command else [out])
    )
    result = run(*args, "-q")
    assert_refused(result, "outside [0, 1]", tmp_path)


def test_extrapolation_when_asked_is_recorded(llama, tmp_path):
    base, trained = llama
    result = run(
        "interpolate", "--alpha", "1.5", "--extrapolate", "-q", base, trained, tmp_path / "o"
    )
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "o" / "surgery_recipe.json").read_text())["extrapolate"] is True
    assert "extrapolate beyond the inputs" in (tmp_path / "o" / "README.md").read_text()
    b, t, o = load_state(base), load_state(trained), load_state(tmp_path / "o")
    name = next(n for n in o if n.endswith("q_proj.weight"))
    expected = (b[name].float() * -0.5 + t[name].float() * 1.5).to(o[name].dtype)
    assert (o[name].float() - expected.float()).abs().max() <= 2**-6 * expected.float().abs().max()


def test_mismatched_architectures_are_named_first(families, tmp_path):
    bert, llama = families("bert")["base"], families("llama")["base"]
    result = run("soup", "-q", bert, llama, tmp_path / "out")
    assert_refused(result, "are different architectures (bert, llama)", tmp_path)
    assert len(result.stderr) < 300


def test_swapped_base_and_trained_are_warned_about(llama, tmp_path):
    base, trained = llama
    record = {"config": {"base": str(base)}, "steps": 1}
    (trained / "surgery_train.json").write_text(json.dumps(record))
    swapped = run("revert", "--layers", "0:1", "-q", trained, base, tmp_path / "o")
    assert swapped.exit_code == 0, swapped.output
    assert swapped.stderr.startswith("warning: BASE ") and "swapped?" in swapped.stderr
    right = run("revert", "--layers", "0:1", "-q", base, trained, tmp_path / "o2")
    assert right.exit_code == 0 and "warning" not in right.stderr


def test_outputs_never_carry_the_training_record_of_an_input(llama, tmp_path):
    """TRAINED's surgery_train.json describes TRAINED's run: an output that copied it would be
    pushed with it and later named as a training output of BASE by the swap warning."""
    base, trained = llama
    (trained / "surgery_train.json").write_text(json.dumps({"config": {"base": str(base)}}))
    commands = {
        "rev": ["revert", "--layers", "0:1"],
        "int": ["interpolate", "--alpha", "0.5"],
        "sweep": ["sweep", "--alphas", "0,1", "-o"],
    }
    for out, command in commands.items():
        where = (
            [tmp_path / out, base, trained]
            if command[-1] == "-o"
            else [base, trained, tmp_path / out]
        )
        result = run(*command, *where, "-q")
        assert result.exit_code == 0, result.output
    written = [p.relative_to(tmp_path) for p in tmp_path.rglob("surgery_train.json")]
    assert written == [trained.relative_to(tmp_path) / "surgery_train.json"]
    # The output is no training output of BASE: used as BASE it draws no swap warning.
    again = run("revert", "--layers", "0:1", "-q", tmp_path / "rev", base, tmp_path / "o")
    assert again.exit_code == 0 and "warning" not in again.stderr


def test_inspect_prints_the_recipe_one_setting_a_line(families, tmp_path):
    import yaml

    paths = families("llama")
    out = tmp_path / "int"
    made = run(
        "interpolate", "--alpha", "0:1=0.2,*=0.7", "-q", paths["base"], paths["trained"], out
    )
    assert made.exit_code == 0, made.output
    lines = run("inspect", out).output.splitlines()
    start = lines.index("recipe      interpolate")
    end = next(i for i, line in enumerate(lines) if line.startswith("inputs"))
    block = "\n".join(line[12:] for line in lines[start + 1 : end])
    recipe = json.loads((out / "surgery_recipe.json").read_text())
    skip = ("tool", "version", "inputs", "operation")
    assert yaml.safe_load(block) == {k: v for k, v in recipe.items() if k not in skip}
    assert lines[end:] == [
        f"inputs      base: {paths['base']}",
        f"            trained: {paths['trained']}",
    ]
    assert max(len(line) for line in lines[start:end]) <= 100


def test_top_level_help_lists_every_command_by_section():
    result = run("--help")
    assert result.exit_code == 0
    for section in ("Surgery:", "Diagnostics:", "Training and eval:", "Hub:"):
        assert section in result.output
    for name in cli.commands:
        assert f"\n  {name} " in result.output, name
    assert "Other:" not in result.output  # every command has a section


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (["revert", "--layers"], " revert --help`"),
        (["soup", "--bogus"], " soup --help`"),
        (["nope"], " --help`"),
    ],
)
def test_usage_errors_are_one_line(args, where):
    result = run(*args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and where in lines[0]


def test_subfolders_of_the_trained_checkpoint_are_carried(llama, tmp_path):
    """A sentence-transformers layout: modules.json names 1_Pooling/, which must come along;
    hidden folders and a training run's resumable checkpoints do not."""
    base, trained = llama
    (trained / "1_Pooling").mkdir()
    (trained / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (trained / "modules.json").write_text('[{"idx": 1, "path": "1_Pooling"}]')
    (trained / "checkpoints" / "checkpoint-5").mkdir(parents=True)
    (trained / "checkpoints" / "checkpoint-5" / "trainer_state.json").write_text("{}")
    (trained / ".cache").mkdir()
    (trained / ".cache" / "x.json").write_text("{}")
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "key.txt").write_text("private")
    (trained / "linked").symlink_to(outside)
    result = run("revert", "--layers", "0:1", "-q", base, trained, tmp_path / "o")
    assert result.exit_code == 0, result.output
    out = tmp_path / "o"
    assert (out / "1_Pooling" / "config.json").read_text() == '{"pooling_mode_mean_tokens": true}'
    assert (out / "modules.json").is_file()
    assert not (out / "checkpoints").exists() and not (out / ".cache").exists()
    assert not (out / "linked").exists() and "private" not in str(list(out.rglob("*")))
    assert_valid_output(out)

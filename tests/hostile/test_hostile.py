"""Hostile inputs and environments, one small case per class of issue 11. Every refusal: exit 2,
one line on stderr, nothing at OUT, no staging litter, inputs' bytes unchanged."""

import json
import os
import resource
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from surgery.core.errors import OutputError
from surgery.engine import output_dir
from surgery.engine.output_dir import staged_output
from tests.hostile.support import (
    assert_refused,
    copy_family,
    fingerprint,
    invoke,
    litter,
    run,
)
from tests.support.checks import assert_valid_output


@pytest.fixture
def llama(families, tmp_path):
    return copy_family(families("llama"), tmp_path / "inputs")


# 1. Code from a checkpoint never runs; pickle-only folders are refused in one line.
def test_remote_code_is_never_executed(llama, tmp_path):
    _, trained = llama
    marker = tmp_path / "pwned"
    (trained / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    config = json.loads((trained / "config.json").read_text())
    config |= {"model_type": "evil", "auto_map": {"AutoConfig": "evil.EvilConfig"}}
    (trained / "config.json").write_text(json.dumps(config))
    before = fingerprint(trained)
    out = tmp_path / "scores.json"
    result = run("eval", trained, "-t", "copain", "--limit", "1", "-o", out, input="y\n")
    assert_refused(result, out)
    assert not marker.exists() and fingerprint(trained) == before


def test_pickle_only_folder_is_one_line(tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    torch.save({"w": torch.ones(2)}, folder / "pytorch_model.bin")
    result = invoke("revert", "--layers", "0", folder, folder, tmp_path / "out")
    assert_refused(result, tmp_path / "out", message="no .safetensors files")


# 2. Headers safetensors refuses are refused (the fuzz test covers thousands more).
def test_header_with_a_boolean_shape(llama, tmp_path):
    base, trained = llama
    shard = sorted(trained.glob("*.safetensors"))[0]
    text = shard.read_bytes()
    length = int.from_bytes(text[:8], "little")
    header = json.loads(text[8 : 8 + length])
    name = next(n for n in header if n != "__metadata__")
    header[name]["shape"] = [True] * len(header[name]["shape"])
    raw = json.dumps(header).encode()
    shard.write_bytes(len(raw).to_bytes(8, "little") + raw + text[8 + length :])
    before = fingerprint(base, trained)
    result = invoke("revert", "--layers", "0", base, trained, tmp_path / "out")
    assert_refused(result, tmp_path / "out", message="bad shape")
    assert fingerprint(base, trained) == before


# 3. Values: non-finite weights, overflow on a narrowing dtype; zero-element and FP8 blends work.
def test_nan_weights_and_fp16_overflow_are_refused(tmp_path):
    inputs = tmp_path / "inputs"
    for i, scale in enumerate((1e6, 2e6)):
        (inputs / f"e{i}").mkdir(parents=True)
        save_file(
            {"w": torch.full((4,), scale), "z": torch.ones(0)}, inputs / f"e{i}" / "m.safetensors"
        )
    before = fingerprint(inputs)
    out = tmp_path / "out"
    result = invoke("soup", "--weights", "nan,1", inputs / "e0", inputs / "e1", out)
    assert_refused(result, out, message="must be finite")
    result = invoke("soup", "--dtype", "fp16", inputs / "e0", inputs / "e1", out)
    assert_refused(result, out, message="'w': 4 value(s) overflow F16")
    assert fingerprint(inputs) == before


def test_zero_element_and_fp8_blends(tmp_path):
    experts = []
    for i in range(2):
        folder = tmp_path / f"e{i}"
        folder.mkdir()
        values = torch.linspace(-4, 4, 64) * (i + 1)
        state = {
            "f8": values.to(torch.float8_e4m3fn),
            "empty": torch.ones(0, 3, dtype=torch.bfloat16),
        }
        save_file(state, folder / "model.safetensors")
        experts.append(folder)
    result = invoke("soup", "-q", *experts, tmp_path / "out")
    assert result.exit_code == 0, result.output
    state = load_file(tmp_path / "out" / "model.safetensors")
    inputs = [load_file(e / "model.safetensors")["f8"].float() for e in experts]
    expected = ((inputs[0] + inputs[1]) / 2).to(torch.float8_e4m3fn)  # float32, rounded once
    assert torch.equal(state["f8"].view(torch.uint8), expected.view(torch.uint8))
    assert state["empty"].shape == (0, 3)
    assert_valid_output(tmp_path / "out")


# 4. Operating-system errors are one line.
def test_file_size_limit_and_parent_that_is_a_file(llama, tmp_path):
    base, trained = llama
    before = fingerprint(base, trained)

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    out = tmp_path / "out"
    result = run("revert", "--layers", "0", "-q", base, trained, out, preexec_fn=small_files)
    assert_refused(result, out, message="file too large")
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "out"
    result = invoke("revert", "--layers", "0", "-q", base, trained, out)
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "is not a folder" in result.stderr and (tmp_path / "afile").read_text() == "x"
    assert fingerprint(base, trained) == before


def test_long_output_name_is_written(llama, tmp_path):
    base, trained = llama
    out = tmp_path / ("x" * 250)  # the staging name would pass NAME_MAX unshortened
    result = invoke("revert", "--layers", "0", "-q", base, trained, out)
    assert result.exit_code == 0, result.stderr
    assert_valid_output(out) and not litter(tmp_path)


def test_free_space_counts_companion_files(llama, tmp_path):
    base, trained = llama
    with open(trained / "huge_notes.txt", "wb") as handle:
        # A sparse file a GB larger than the free space: the check must count companion files.
        handle.truncate(shutil.disk_usage(tmp_path).free + 2**30)
    result = invoke("revert", "--layers", "0", "-q", base, trained, tmp_path / "out")
    assert_refused(result, tmp_path / "out", message="the output needs")


# 5. Leftovers of a run that died are removed by the next run beside them (signals: test_signals).
def _dead_pid() -> int:
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    return dead


def test_stale_staging_of_a_dead_run_is_removed(llama, tmp_path):
    base, trained = llama
    stale = output_dir.sibling(tmp_path / "other", "partial", pid=_dead_pid())
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(bytes(1000))
    result = invoke("revert", "--layers", "0", "-q", base, trained, tmp_path / "out")
    assert result.exit_code == 0 and not stale.exists() and not litter(tmp_path)
    assert f"note: removed {stale}" in result.stderr


def test_staging_of_another_host_survives(llama, tmp_path):
    """On a shared file system a pid unknown here may be a live run on another node (or in
    another container, or a staging name of an older version): only this host's dead runs go."""
    base, trained = llama
    dead = _dead_pid()
    mine = output_dir.sibling(tmp_path / "mine", "partial", pid=dead)
    other_host = "0" * 12 if output_dir.host_tag() != "0" * 12 else "1" * 12
    foreign = [tmp_path / f".runA.partial-{dead}-{other_host}", tmp_path / f".runB.old-{dead}"]
    for folder in [mine, *foreign]:
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(bytes(100))
    result = invoke("revert", "--layers", "0", "-q", base, trained, tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    assert not mine.exists() and f"note: removed {mine}" in result.stderr
    for folder in foreign:
        assert (folder / "model.safetensors").read_bytes() == bytes(100)
        assert f"note: kept {folder}: left by a run of another host" in result.stderr
    assert not (tmp_path / "runB").exists()  # another host's `.old` is not restored either


def test_host_tag_tells_apart_hosts_boots_and_pid_namespaces(monkeypatch):
    """The tag changes with each of the three things that give a pid its meaning."""
    tags = set()
    for host, boot, namespace in [
        ("a", "1", "pid:[1]"),
        ("b", "1", "pid:[1]"),
        ("a", "2", "pid:[1]"),
        ("a", "1", "pid:[2]"),
    ]:
        output_dir.host_tag.cache_clear()
        monkeypatch.setattr(output_dir.socket, "gethostname", lambda host=host: host)
        monkeypatch.setattr(output_dir, "_read_first_line", lambda path, boot=boot: boot)
        monkeypatch.setattr(output_dir.os, "readlink", lambda path, ns=namespace: ns)
        tags.add(output_dir.host_tag())
    output_dir.host_tag.cache_clear()
    assert len(tags) == 4


# 6. Two runs, one OUT: publishing never replaces what appeared meanwhile; --force restores.
def test_output_that_appears_meanwhile_is_not_replaced(tmp_path):
    out = tmp_path / "out"
    refused = pytest.raises(OutputError, match="appeared while this run was writing")
    with refused, staged_output(out) as staging:
        (staging / "mine").write_text("new")
        out.mkdir()
        (out / "theirs").write_text("first")
    assert [p.name for p in out.iterdir()] == ["theirs"] and not litter(tmp_path)


def test_force_restores_the_old_output_when_the_swap_fails(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old").write_text("keep me")
    real = output_dir.rename_noreplace

    def failing(source, target):
        if ".partial-" in source.name:
            raise OSError(5, "Input/output error", str(target))
        real(source, target)

    monkeypatch.setattr(output_dir, "rename_noreplace", failing)
    with pytest.raises(OSError), staged_output(out, replace=True) as staging:
        (staging / "new").write_text("new")
    assert (out / "old").read_text() == "keep me" and not litter(tmp_path)


def test_two_concurrent_soups_one_wins(families, tmp_path):
    import subprocess

    from tests.hostile.support import surgery_command

    experts = families("llama")["experts"]
    out = tmp_path / "out"
    args = [*surgery_command(), "soup", "-q", *map(str, experts), str(out)]
    runs = [subprocess.Popen(args, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(r.wait(120), r.stderr.read()) for r in runs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2).strip().splitlines()
    assert len(loser) == 1 and ("appeared while" in loser[0] or "already exists" in loser[0])
    assert_valid_output(out) and not litter(tmp_path)


# 7. Companion files: no link leaves the folder, no FIFO is opened, index paths checked first.
def test_fifo_shard_is_refused_without_blocking(llama, tmp_path):
    _, trained = llama
    shard = sorted(trained.glob("*.safetensors"))[0]
    shard.unlink()
    os.mkfifo(shard)
    result = run("inspect", trained, timeout=60)
    assert result.returncode == 2 and "not a regular file" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_index_leaving_the_folder_is_refused_before_opening(llama, tmp_path):
    base, trained = llama
    outside = tmp_path / "outside.safetensors"
    os.mkfifo(outside)  # opening it would block: the refusal must come first
    index = json.loads((trained / "model.safetensors.index.json").read_text())
    index["weight_map"] = dict.fromkeys(index["weight_map"], "../outside.safetensors")
    (trained / "model.safetensors.index.json").write_text(json.dumps(index))
    result = run("revert", "--layers", "0", base, trained, tmp_path / "out", timeout=60)
    assert_refused(result, tmp_path / "out", message="outside the checkpoint folder")


def _as_cache_snapshot(folder, cache):
    """`folder` laid out as a Hugging Face cache snapshot: files in blobs/, links in snapshots/."""
    repo = cache / "models--acme--tiny"
    snapshot = repo / "snapshots" / ("a" * 40)
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, path in enumerate(sorted(folder.iterdir())):
        blob = repo / "blobs" / f"blob{i}"
        shutil.copyfile(path, blob)
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


def test_a_cache_snapshot_given_as_a_path_is_read_but_links_stay_inside_its_repo(llama, tmp_path):
    base, trained = llama
    snapshot = _as_cache_snapshot(trained, tmp_path / "hub")
    result = invoke("revert", "--layers", "0", "-q", base, snapshot, tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    assert_valid_output(tmp_path / "out")
    # A link out of the repository's cache folder is still refused, before anything is opened.
    outside = tmp_path / "outside.safetensors"
    os.mkfifo(outside)
    shard = sorted(snapshot.glob("*.safetensors"))[0]
    shard.unlink()
    shard.symlink_to(outside)
    result = run("revert", "--layers", "0", base, snapshot, tmp_path / "out2", timeout=60)
    assert_refused(result, tmp_path / "out2", message="outside the checkpoint folder")


def test_empty_weight_map_next_to_shards_is_a_defect(llama, tmp_path):
    base, trained = llama
    (trained / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    result = invoke("revert", "--layers", "0", base, trained, tmp_path / "out")
    assert_refused(result, tmp_path / "out", message="weight_map is empty")
    result = invoke("verify", trained)
    assert result.exit_code == 1 and "weight_map is empty" in result.output


def test_symlink_leaving_the_folder_is_not_copied(llama, tmp_path):
    base, trained = llama
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY")
    (trained / "notes.txt").symlink_to(secret)
    (trained / "inside.txt").symlink_to(trained / "config.json")
    result = invoke("revert", "--layers", "0", "-q", base, trained, tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    assert "warning: skipped notes.txt" in result.stderr
    assert not (tmp_path / "out" / "notes.txt").exists()
    assert (tmp_path / "out" / "inside.txt").read_text() == (trained / "config.json").read_text()
    assert not (tmp_path / "out" / "inside.txt").is_symlink()


# 8. Integrity: flipped bytes, swapped shards and edited recipes fail `surgery verify`.
def test_verify_catches_flips_swaps_and_edits(families, tmp_path):
    paths = families("llama")
    for name, layers in (("a", "0"), ("b", "1")):
        result = invoke(
            "revert", "--layers", layers, "-q", paths["base"], paths["trained"], tmp_path / name
        )
        assert result.exit_code == 0, result.stderr
    assert invoke("verify", tmp_path / "a").exit_code == 0
    cases = {}
    for case in ("flip", "swap", "edit"):
        shutil.copytree(tmp_path / "a", tmp_path / case)
        cases[case] = tmp_path / case
    shard = sorted(cases["flip"].glob("*.safetensors"))[-1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    name = sorted(cases["swap"].glob("*.safetensors"))[0].name
    shutil.copyfile(tmp_path / "b" / name, cases["swap"] / name)
    recipe = json.loads((cases["edit"] / "surgery_recipe.json").read_text())
    recipe["layers"] = "0:4"
    (cases["edit"] / "surgery_recipe.json").write_text(json.dumps(recipe))
    for case, expected in (("flip", "sha256"), ("swap", "sha256"), ("edit", "recipe")):
        result = invoke("verify", cases[case])
        assert result.exit_code == 1 and expected in result.output, (case, result.output)


# 9. Byte order: safetensors values are little-endian; a big-endian host is refused, not misread.
@pytest.mark.parametrize("command", ["soup", "revert", "inspect"])
def test_a_big_endian_host_is_refused(llama, tmp_path, monkeypatch, command):
    from surgery.core import dtypes

    base, trained = llama
    before = fingerprint(base), fingerprint(trained)
    monkeypatch.setattr(dtypes, "HOST_BYTE_ORDER", "big")
    out = tmp_path / "out"
    args = {
        "soup": ["soup", "-q", base, trained, out],
        "revert": ["revert", "-q", "--layers", "0", base, trained, out],
        "inspect": ["inspect", base],
    }[command]
    assert_refused(invoke(*args), out, message="this host is big-endian")
    assert (fingerprint(base), fingerprint(trained)) == before

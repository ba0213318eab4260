"""Hub ids read by HTTP range requests, against the loopback fake Hub: what each command
transfers (the server's byte counts), outputs identical to a whole download, resumed drops, a
repository that changes mid-run, the cache and offline mode. CLI runs happen in subprocesses so
each sees its own HF_* environment."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from surgery.engine.reader import INDEX_NAME, open_checkpoint
from surgery.hub.range_source import HEAD_PROBE
from tests.support import tiny_models
from tests.support.checks import assert_valid_output, text_layer
from tests.support.hub_server import FakeHub, Link, run_surgery

SHA_BASE, SHA_TRAINED = "a" * 40, "b" * 40
LAYERS = 12
# The realistic Hub: a round trip per request, a shared link, shards from a CDN host.
LINK = Link(latency=0.003, bandwidth=500e6)
# Correctness tests run on both the plain loopback Hub and the realistic one.
BOTH_HUBS = pytest.mark.parametrize("hub", ["plain", "link"], indirect=True)


def surgery(*args: object, env: dict) -> subprocess.CompletedProcess:
    return run_surgery(*args, env=env)


def _llama(seed: int | None) -> LlamaForCausalLM:
    """A Llama of about 25 MB in bf16: large enough that headers are a small share of it."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tiny_models.vocab_size(),
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    return model if seed is None else tiny_models.perturb(model, seed)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ranges")
    return {
        "base": tiny_models.save(_llama(None), root / "base", shard_size="10MB"),
        "trained": tiny_models.save(_llama(100), root / "trained", shard_size="10MB"),
    }


@pytest.fixture
def hub(pair, request):
    link = LINK if getattr(request, "param", "plain") == "link" else None
    with FakeHub(link) as hub:
        hub.add_model("acme/base", pair["base"], SHA_BASE)
        hub.add_model("acme/trained", pair["trained"], SHA_TRAINED)
        yield hub


def hub_env(hub: FakeHub, home: Path) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1"}


def shard_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.safetensors"))


def shard_gets(hub: FakeHub) -> list[str]:
    """GETs of shard bytes: `resolve` URLs of the plain Hub, signed URLs on the CDN host."""
    return [
        p
        for m, p in hub.state.requests
        if m == "GET" and (p.endswith(".safetensors") or p.startswith("/objects/"))
    ]


def shard_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def served_shard_bytes(hub: FakeHub, repo: str) -> int:
    served = hub.state.served
    return sum(b - a for r, f, a, b in served if r == repo and f.endswith(".safetensors"))


def tensor_ranges(folder: Path, keep) -> dict[str, list[tuple[int, int]]]:
    """Byte ranges of the tensors `keep(name)` selects, plus each shard's head probe, by file."""
    checkpoint = open_checkpoint(folder)
    ranges: dict[str, list[tuple[int, int]]] = {}
    for shard in checkpoint.shards:
        ranges[shard.path.name] = [(0, min(HEAD_PROBE, shard.size))] + [
            (t.start, t.start + t.nbytes) for t in shard.tensors if keep(t.name)
        ]
    return ranges


def covered(inner: list[tuple[int, int]], outer: list[tuple[int, int]]) -> bool:
    """Whether every range of `inner` lies inside the union of `outer`."""
    position_ok = []
    merged: list[list[int]] = []
    for start, stop in sorted(outer):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    for start, stop in inner:
        position_ok.append(any(a <= start and stop <= b for a, b in merged))
    return all(position_ok)


def same_files(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_inspect_reads_headers_only(hub, pair, tmp_path):
    env = hub_env(hub, tmp_path / "hf")
    result = surgery("inspect", "--json", "acme/base", env=env)
    assert result.returncode == 0, result.stderr
    local = surgery("inspect", "--json", pair["base"], env=env)
    remote_info, local_info = json.loads(result.stdout), json.loads(local.stdout)
    assert remote_info.pop("path").endswith(f"snapshots/{SHA_BASE}")
    local_info.pop("path")
    assert remote_info == local_info and remote_info["stacks"][0]["layers"] == LAYERS
    served = served_shard_bytes(hub, "acme/base")
    print(f"inspect: {served} of {shard_bytes(pair['base'])} shard bytes")
    assert 0 < served < 0.01 * shard_bytes(pair["base"])
    # Small files: only the config and the index, not the tokenizer.
    fetched = {f for r, f, _, _ in hub.state.served if r == "acme/base"}
    assert fetched == {"config.json", INDEX_NAME, *shard_files(pair["base"])}


@BOTH_HUBS
def test_half_layer_revert_reads_what_it_needs(hub, pair, tmp_path):
    env = hub_env(hub, tmp_path / "hf")
    out = tmp_path / "ranges" / "out"  # same name: same model card title
    result = surgery("revert", "--layers", "0:6", "-q", "acme/base", "acme/trained", out, env=env)
    assert result.returncode == 0, result.stderr
    assert_valid_output(out)
    names = open_checkpoint(pair["base"]).tensors
    # Adjacent tensors coalesce: far fewer shard requests than tensors read (one each).
    assert 0 < 4 * len(shard_gets(hub)) < len(names)
    reverted = lambda name: text_layer(name, names) in range(6)  # noqa: E731
    for repo, folder, keep in [
        ("acme/base", pair["base"], reverted),
        ("acme/trained", pair["trained"], lambda name: not reverted(name)),
    ]:
        needed = tensor_ranges(folder, keep)
        for file, allowed in needed.items():
            served = hub.state.ranges(repo, file)
            assert covered(served, allowed), (repo, file)  # nothing the plan does not need
            assert covered(allowed[1:], served), (repo, file)  # and all that it does
        merged = sum(b - a for file in needed for a, b in hub.state.ranges(repo, file))
        assert served_shard_bytes(hub, repo) == merged  # each byte once
    base_served, base_total = served_shard_bytes(hub, "acme/base"), shard_bytes(pair["base"])
    print(f"revert 0:6 of {LAYERS}: {base_served} of {base_total} BASE shard bytes")
    assert 0.4 < base_served / base_total < 0.55
    recipe = json.loads((out / "surgery_recipe.json").read_text())
    assert [i["revision"] for i in recipe["inputs"]] == [SHA_BASE, SHA_TRAINED]

    # The same command on whole downloads gives the same bytes, card and recipe included.
    downloaded = tmp_path / "download" / "out"  # same name: same model card title
    result = surgery(
        "revert",
        "--download",
        "--layers",
        "0:6",
        "-q",
        "acme/base",
        "acme/trained",
        downloaded,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    same_files(out, downloaded)

    # Shards complete in the cache now are read from disk: no shard byte crosses the wire.
    before = len(hub.state.served)
    again = tmp_path / "again" / "out"  # same name: same model card title
    result = surgery("revert", "--layers", "0:6", "-q", "acme/base", "acme/trained", again, env=env)
    assert result.returncode == 0, result.stderr
    assert not [s for s in hub.state.served[before:] if s[1].endswith(".safetensors")]
    same_files(out, again)

    # Offline, the cache serves as it always did: no request at all.
    requests = len(hub.state.requests)
    offline = tmp_path / "offline" / "out"  # same name: same model card title
    result = surgery(
        "revert",
        "--layers",
        "0:6",
        "-q",
        "acme/base",
        "acme/trained",
        offline,
        env={**env, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert len(hub.state.requests) == requests
    same_files(out, offline)


@pytest.mark.parametrize("hub", ["link"], indirect=True)
def test_inputs_open_side_by_side(hub, pair, tmp_path):
    # The round trips of opening inputs overlap: both repositories' info at once, then every
    # shard's first bytes (its header) at once, each shard's HEAD before it; the output is the
    # same as a download's.
    shards = len(shard_files(pair["base"])) + len(shard_files(pair["trained"]))
    hub.gather(2, lambda host, method, path, headers: path.startswith("/api/models/"))
    probe = f"bytes=0-{HEAD_PROBE - 1}"
    hub.gather(shards, lambda host, method, path, headers: headers.get("range") == probe)
    env = hub_env(hub, tmp_path / "hf")
    out = tmp_path / "ranges" / "out"
    result = surgery("revert", "--layers", "0:6", "-q", "acme/base", "acme/trained", out, env=env)
    assert result.returncode == 0, result.stderr
    assert [left for _, _, left in hub.state.gathers] == [0, 0]  # all came ...
    assert hub.state.gathered_apart == 0  # ... together
    probes = [p for m, p, h in hub.received("cdn") if h.get("range") == probe]
    assert len(probes) == shards  # each header fetched once
    downloaded = tmp_path / "download" / "out"
    args = ["revert", "--download", "--layers", "0:6", "-q", "acme/base", "acme/trained"]
    result = surgery(*args, downloaded, env=hub_env(hub, tmp_path / "hf-download"))
    assert result.returncode == 0, result.stderr
    same_files(out, downloaded)


def first_shard(folder: Path) -> str:
    return shard_files(folder)[0]


@BOTH_HUBS
def test_dropped_connection_is_resumed(hub, pair, tmp_path):
    env = hub_env(hub, tmp_path / "hf")
    shard = first_shard(pair["base"])
    hub.drop_next("acme/base", shard, after=100_000)
    out = tmp_path / "ranges" / "out"
    result = surgery("revert", "--layers", "0:6", "-q", "acme/base", "acme/trained", out, env=env)
    assert result.returncode == 0, result.stderr
    assert hub.state.drops == {}  # the connection was dropped ...
    sent = [(a, b) for r, f, a, b in hub.state.served if (r, f) == ("acme/base", shard)]
    dropped = next(b for a, b in sent if b - a == 100_000)
    assert any(a == dropped for a, _ in sent)  # ... and the next request began where it stopped
    downloaded = tmp_path / "download" / "out"
    args = ["revert", "--download", "--layers", "0:6", "-q", "acme/base", "acme/trained"]
    result = surgery(*args, downloaded, env=env)
    assert result.returncode == 0, result.stderr
    same_files(out, downloaded)


def ranged_and_downloaded(hub: FakeHub, tmp_path: Path, command: list[str]) -> None:
    """Run `command` on Hub ids by ranges and by download (separate caches): same files."""
    outs = []
    for mode in ("ranges", "download"):
        out = tmp_path / mode / "out"  # same name: same model card title
        flags = ["--download"] if mode == "download" else []
        result = surgery(*command, *flags, "-q", out, env=hub_env(hub, tmp_path / f"hf-{mode}"))
        assert result.returncode == 0, result.stderr
        outs.append(out)
    same_files(*outs)


@BOTH_HUBS
def test_blends_by_ranges_match_downloads(hub, pair, tmp_path):
    # A drop in the middle of a blended tensor's blocks, too.
    hub.drop_next("acme/trained", first_shard(pair["trained"]), after=300_000)
    command = ["interpolate", "--alpha", "0.3", "--layers", "2:8", "acme/base", "acme/trained"]
    ranged_and_downloaded(hub, tmp_path, command)
    assert hub.state.drops == {}


@BOTH_HUBS
def test_soup_by_ranges_matches_download(hub, tmp_path):
    ranged_and_downloaded(hub, tmp_path, ["soup", "--weights", "2,1", "acme/trained", "acme/base"])


@BOTH_HUBS
def test_drift_by_ranges_matches_local(hub, pair, tmp_path):
    from surgery.diagnostics.drift import drift, format_drift

    result = surgery("drift", "-q", "acme/base", "acme/trained", env=hub_env(hub, tmp_path / "hf"))
    assert result.returncode == 0, result.stderr
    local = drift(open_checkpoint(pair["base"]), open_checkpoint(pair["trained"]))
    assert result.stdout == format_drift(local) + "\n"
    # Headers and every (float) tensor of both, each byte once.
    for repo, folder in (("acme/base", pair["base"]), ("acme/trained", pair["trained"])):
        assert served_shard_bytes(hub, repo) == shard_bytes(folder)


def test_a_repository_that_changes_mid_run_is_an_error(hub, pair, tmp_path):
    env = hub_env(hub, tmp_path / "hf")
    shard = shard_files(pair["trained"])[1]
    changed = bytearray((pair["trained"] / shard).read_bytes())
    changed[-1000:] = bytes(1000)  # same size, other content: only the ETag tells
    (tmp_path / "changed.safetensors").write_bytes(changed)
    hub.change_file("acme/trained", shard, tmp_path / "changed.safetensors", after=1)
    out = tmp_path / "work" / "out"
    result = surgery("revert", "--layers", "0:6", "-q", "acme/base", "acme/trained", out, env=env)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: acme/trained@{SHA_TRAINED[:12]}/{shard} changed on the Hub")
    assert not (tmp_path / "work").exists()  # nothing at OUT, no staging folder left


def test_unknown_repository_or_revision(hub, tmp_path):
    env = hub_env(hub, tmp_path / "hf")
    missing = surgery("inspect", "acme/missing", env=env)
    assert missing.returncode == 2
    assert "is neither a local path nor a Hub repository you can read" in missing.stderr
    revision = surgery("inspect", "acme/base@nope", env=env)
    assert revision.returncode == 2
    assert revision.stderr.strip() == "error: acme/base@nope has no revision 'nope' on the Hub"


class MemorySource:
    """Bytes in memory behind the `ByteSource` protocol (no mapping, like a Hub file)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.size, self.reads = data, len(data), []

    def view(self, offset: int, nbytes: int) -> memoryview:
        return memoryview(self.data)[offset : offset + nbytes]

    def read_into(self, offset: int, buffer: memoryview) -> None:
        self.reads.append(len(buffer))
        buffer[:] = self.data[offset : offset + len(buffer)]

    def close(self) -> None:
        pass


def test_streamed_values_slice_like_the_tensor(monkeypatch):
    from surgery.engine import values
    from surgery.engine.reader import TensorInfo

    monkeypatch.setattr(values, "BLOCK_BYTES", 4096)
    tensor = torch.randn(10_000).to(torch.bfloat16)
    prefix = b"\x00" * 24
    source = MemorySource(prefix + tensor.view(torch.uint8).numpy().tobytes())
    info = TensorInfo("w", "BF16", (10_000,), Path("x"), len(prefix), 20_000)
    streamed = values.tensor_values(source, info)
    assert isinstance(streamed, values.StreamedValues)
    for start, stop in [(0, 100), (100, 3000), (3000, 10_000), (50, 60), (9_990, 20_000)]:
        assert torch.equal(streamed[start:stop], tensor[start:stop])
    assert max(source.reads) <= 7000 * 2  # bounded by the block or the slice asked for


@BOTH_HUBS
@pytest.mark.parametrize(
    ("body", "by"),
    [
        # Reduction passes read every input twice: the Hub inputs are downloaded instead.
        (
            "merge_method: slerp\nbase_model: {b}\nmodels: [{{model: {b}}}, {{model: {t}}}]\n"
            "parameters: {{t: 0.3}}\n",
            "download",
        ),
        (
            "merge_method: dare_linear\nbase_model: {b}\n"
            "models: [{{model: {t}, parameters: {{weight: 1.0, density: 0.5}}}}]\n",
            "download",
        ),
        (
            "merge_method: task_arithmetic\nbase_model: {b}\n"
            "models: [{{model: {t}, parameters: {{weight: 0.5}}}}]\n",
            "ranges",
        ),
    ],
    ids=["slerp", "dare_linear", "task_arithmetic"],
)
def test_merge_by_ranges_matches_local(hub, pair, tmp_path, body, by):
    # Merge kernels read Hub inputs block by block (reductions, then the map in segments):
    # the weights equal those of the same merge of local folders. Both models' info is asked
    # at once when they are opened, and again when they are downloaded (side by side).
    infos = lambda host, method, path, headers: path.startswith("/api/models/")  # noqa: E731
    for _ in range(1 if by == "ranges" else 2):
        hub.gather(2, infos)
    outs, notes = [], []
    for name, base, trained in (
        ("ranges", "acme/base", "acme/trained"),
        ("local", pair["base"], pair["trained"]),
    ):
        config = tmp_path / f"{name}.yml"
        config.write_text("dtype: bfloat16\n" + body.format(b=base, t=trained))
        out = tmp_path / name / "out"
        result = surgery("merge", config, out, "-q", env=hub_env(hub, tmp_path / "hf"))
        assert result.returncode == 0, result.stderr
        outs.append(assert_valid_output(out))
        notes.append(result.stderr.strip())
    ranged, local = outs
    downloaded = list((tmp_path / "hf").rglob("*.safetensors"))
    if by == "ranges":
        assert not downloaded and notes == ["", ""]  # read in place, not downloaded
    else:
        assert downloaded
        note = "note: merge: reduction passes read inputs twice; downloading Hub inputs"
        assert notes[0].splitlines()[0] == note and notes[1] == ""  # (then the download's bars)
    assert served_shard_bytes(hub, "acme/trained") > 0
    assert [left for _, _, left in hub.state.gathers] == [0] * len(hub.state.gathers)
    assert hub.state.gathered_apart == 0
    assert ranged.keys() == local.keys()
    assert all(torch.equal(ranged[k].view(torch.uint8), local[k].view(torch.uint8)) for k in local)


def authorized(requests: list[tuple[str, str, dict[str, str]]]) -> list[str]:
    return [path for _, path, headers in requests if "authorization" in headers]


@pytest.mark.parametrize("hub", ["link"], indirect=True)
def test_the_token_never_reaches_the_cdn(hub, pair, tmp_path):
    env = {**hub_env(hub, tmp_path / "hf"), "HF_TOKEN": "hf_secret_token"}
    command = ["revert", "--layers", "0:6", "-q", "acme/base", "acme/trained"]
    for flags in ([], ["--download"]):
        result = surgery(*command, *flags, tmp_path / f"run{len(flags)}" / "out", env=env)
        assert result.returncode == 0, result.stderr
    cdn = hub.received("cdn")
    assert {p.split("?")[0] for _, p, _ in cdn} == {
        f"/objects/{etag}" for etag in hub.state.objects
    }  # every shard byte came from the CDN host ...
    assert authorized(hub.received("hub"))  # ... the Hub got the token ...
    assert authorized(cdn) == []  # ... and the CDN never did
    # The CDN location is resolved once per file (one HEAD per shard of each run) and reused:
    # no GET of a shard's `resolve` URL (a download, too, fetches from the location).
    shards = len(shard_files(pair["base"])) + len(shard_files(pair["trained"]))
    for method, count in (("HEAD", 2 * shards), ("GET", 0)):
        asked = [p for m, p, _ in hub.received("hub") if m == method and p.endswith("tensors")]
        assert len(asked) == count, method
    same_files(tmp_path / "run0" / "out", tmp_path / "run1" / "out")


@pytest.mark.parametrize("hub", ["link"], indirect=True)
def test_an_expired_signed_url_is_resolved_again(hub, pair, tmp_path):
    env = hub_env(hub, tmp_path / "hf")
    hub.expire_urls(after=8)  # mid-run: every signed URL given so far stops working
    hub.throttle("cdn", 2, retry_after=0)  # and two 429s, waited out
    out = tmp_path / "ranges" / "out"
    result = surgery("revert", "--layers", "0:6", "-q", "acme/base", "acme/trained", out, env=env)
    assert result.returncode == 0, result.stderr
    heads = [p for m, p, _ in hub.received("hub") if m == "HEAD" and p.endswith(".safetensors")]
    shards = len(shard_files(pair["base"])) + len(shard_files(pair["trained"]))
    assert shards < len(heads) <= 2 * shards  # the refused files were resolved again, once
    assert hub.state.throttled["cdn"][0] == 0
    downloaded = tmp_path / "download" / "out"
    args = ["revert", "--download", "--layers", "0:6", "-q", "acme/base", "acme/trained"]
    result = surgery(*args, downloaded, env=hub_env(hub, tmp_path / "hf-download"))
    assert result.returncode == 0, result.stderr
    same_files(out, downloaded)

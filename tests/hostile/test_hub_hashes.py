"""For a Hub checkpoint, `surgery verify` compares each shard's sha256 with the one the Hub
reported: huggingface_hub's cache names each LFS blob by it (snapshots link to blobs/<sha256>)."""

import hashlib
import os
import subprocess

from tests.hostile.support import ROOT, surgery_command

SHA = "4" * 40


def cache_with_blobs(hub_cache, repo_id, folder, corrupt: str | None = None):
    """huggingface_hub's real layout: blobs named by sha256, snapshot files linking to them;
    `corrupt` names a shard whose blob content no longer matches its name."""
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SHA)
    snapshot = repo / "snapshots" / SHA
    snapshot.mkdir(parents=True)
    for path in sorted(folder.iterdir()):
        data = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        if path.name == corrupt:
            data = data[:-1] + bytes([data[-1] ^ 1])
        blob.write_bytes(data)
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))


def test_verify_compares_shards_with_the_hub_sha256(families, tmp_path):
    trained = families("llama")["trained"]
    hub = tmp_path / "hf_home" / "hub"
    shard = sorted(p.name for p in trained.glob("*.safetensors"))[1]
    cache_with_blobs(hub, "acme/good", trained)
    cache_with_blobs(hub, "acme/bad", trained, corrupt=shard)
    env = {**os.environ, "HF_HOME": str(hub.parent), "HF_HUB_OFFLINE": "1"}
    results = {
        repo: subprocess.run(
            [*surgery_command(), "verify", repo], capture_output=True, text=True, env=env, cwd=ROOT
        )
        for repo in ("acme/good", "acme/bad")
    }
    assert results["acme/good"].returncode == 0, results["acme/good"].stdout
    bad = results["acme/bad"]
    assert bad.returncode == 1 and f"{shard}: sha256" in bad.stdout and "the Hub's" in bad.stdout

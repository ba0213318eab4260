"""Hub ids as inputs (from a pre-populated cache, offline), model cards, and push over HTTP to a
fake Hub on loopback. CLI runs happen in subprocesses so each sees its own HF_* environment."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from surgery.hub.model_card import render_card
from tests.support.checks import assert_valid_output, load_state, same_bits
from tests.support.hub_server import FakeHub
from tests.support.train_helpers import headers, write_corpus

ROOT = Path(__file__).parents[1]
SHA_BASE, SHA_TRAINED, SHA_V1 = "1" * 40, "2" * 40, "3" * 40


def surgery(*args, env: dict, cwd: Path | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return subprocess.run(
        [sys.executable, "-m", "cli", *map(str, args)],
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
    )


def _cache_repo(hub_cache: Path, repo_id: str, folder: Path, refs: dict[str, str]) -> None:
    """Lay out `folder` as huggingface_hub's cache does: refs/<name> -> sha, snapshots/<sha>/."""
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    for ref, sha in refs.items():
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(sha)
        if not (repo / "snapshots" / sha).exists():
            shutil.copytree(folder, repo / "snapshots" / sha)


@pytest.fixture
def hf_home(families, tmp_path) -> Path:
    paths = families("llama")
    home = tmp_path / "hf_home"
    _cache_repo(home / "hub", "acme/tiny-base", paths["base"], {"main": SHA_BASE})
    _cache_repo(home / "hub", "acme/tiny-trained", paths["trained"], {"main": SHA_TRAINED})
    _cache_repo(home / "hub", "acme/tiny-trained", paths["experts"][0], {"v1": SHA_V1})
    return home


def test_hub_ids_resolve_offline_from_the_cache(hf_home, tmp_path, families):
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "out"
    result = surgery(
        "revert", "--layers", "1:3", "-q", "acme/tiny-base", "acme/tiny-trained@v1", out, env=env
    )
    assert result.returncode == 0, result.stderr
    assert_valid_output(out)
    recipe = json.loads((out / "surgery_recipe.json").read_text())
    assert recipe["inputs"] == [
        {
            "role": "base",
            "path": "acme/tiny-base",
            "repo_id": "acme/tiny-base",
            "revision": SHA_BASE,
        },
        {
            "role": "trained",
            "path": "acme/tiny-trained@v1",
            "repo_id": "acme/tiny-trained",
            "revision": SHA_V1,
        },
    ]
    # @v1 is the expert snapshot, not main: its config and weights came through.
    expert = families("llama")["experts"][0]
    assert (out / "tokenizer.json").read_bytes() == (expert / "tokenizer.json").read_bytes()
    card = (out / "README.md").read_text()
    front = yaml.safe_load(card.split("---")[1])
    assert front["base_model"] == ["acme/tiny-base", "acme/tiny-trained"]
    assert front["base_model_relation"] == "merge" and front["library_name"] == "transformers"
    inspect = surgery("inspect", "acme/tiny-base", env=env)
    assert inspect.returncode == 0 and "4 layers" in inspect.stdout


def test_local_path_wins_over_hub_id(hf_home, tmp_path, families):
    shutil.copytree(families("llama")["base"], tmp_path / "acme" / "tiny-base")
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    result = surgery(
        "soup", "-q", "acme/tiny-base", "acme/tiny-trained", tmp_path / "out", env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    inputs = json.loads((tmp_path / "out" / "surgery_recipe.json").read_text())["inputs"]
    assert "repo_id" not in inputs[0] and inputs[1]["repo_id"] == "acme/tiny-trained"


def test_local_inputs_never_set_up_the_hub_client(families, tmp_path, monkeypatch):
    # The client's timeout hook imports huggingface_hub's HTTP stack (a few tenths of a second
    # of a local revert); only an input that is not on disk can need it.
    from surgery.api import revert
    from surgery.hub import resolve

    def refuse() -> None:
        raise AssertionError("the Hub client was set up for local inputs")

    monkeypatch.setattr(resolve, "bound_requests", refuse)
    paths = families("llama")
    assert_valid_output(
        revert(paths["base"], paths["trained"], tmp_path / "out", "1:3", quiet=True)
    )
    with pytest.raises(AssertionError, match="set up"):
        resolve.open_inputs([paths["base"], "acme/not-on-disk"])


def test_offline_with_nothing_cached_is_a_clear_error(tmp_path):
    env = {"HF_HOME": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"}
    result = surgery(
        "revert", "--layers", "0", "acme/missing", "acme/other", tmp_path / "out", env=env
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: acme/missing is not a local path and not in the Hub cache, and the Hub cannot be "
        "reached (HF_HUB_OFFLINE set, or no network)"
    ]
    assert not (tmp_path / "out").exists()


def _local_folders(families, root: Path) -> None:
    """ckpt/plain and ckpt/expert: the folders a user means when typing `ckpt/plian`."""
    paths = families("llama")
    shutil.copytree(paths["base"], root / "ckpt" / "plain")
    shutil.copytree(paths["trained"], root / "ckpt" / "expert")


@pytest.mark.parametrize("where", ["offline", "fake-hub"])
def test_a_mistyped_local_folder_is_named_before_the_hub(families, tmp_path, where):
    _local_folders(families, tmp_path)
    hub_says = {
        "offline": "it is not in the Hub cache, and the Hub cannot be reached "
        "(HF_HUB_OFFLINE set, or no network)",
        "fake-hub": "it is not a repository you can read (private? HF_TOKEN)",
    }[where]
    with FakeHub() as hub:  # knows no repository: ckpt/plian is not on it
        env = {"HF_HOME": str(tmp_path / "hf")}
        env |= {"HF_HUB_OFFLINE": "1"} if where == "offline" else {"HF_ENDPOINT": hub.endpoint}
        args = ("revert", "--layers", "1:2", "ckpt/plian", "ckpt/expert", "out")
        result = surgery(*args, env=env, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: ckpt/plian: no such file or folder (nearest: ckpt/plain); as a Hub id, {hub_says}"
    ]
    assert not (tmp_path / "out").exists()


def test_a_mistyped_path_that_cannot_be_a_hub_id_names_the_nearest_at_once(families, tmp_path):
    from surgery.core.errors import CheckpointError
    from surgery.hub.resolve import check_input

    _local_folders(families, tmp_path)
    for typo, nearest in [
        (tmp_path / "ckpt" / "expret", tmp_path / "ckpt" / "expert"),  # absolute: never the Hub
        (tmp_path / "ckpt" / "zzz", None),  # a folder that exists, nothing near in it
        (tmp_path / "nowhere" / "plain", None),  # no such folder either
    ]:
        hint = f" (nearest: {nearest})" if nearest else ""
        with pytest.raises(CheckpointError) as raised:
            check_input(typo)
        assert str(raised.value) == f"{typo}: no such file or folder{hint}"


@pytest.mark.parametrize("where", ["offline", "fake-hub"])
def test_a_hub_id_whose_organisation_is_a_local_folder_still_resolves(
    hf_home, families, tmp_path, where
):
    # acme/ is a local folder, with a name close to the repository's in it: the Hub id wins
    # over a suggestion (only an existing local path does).
    shutil.copytree(families("llama")["base"], tmp_path / "acme" / "tiny-bas")
    with FakeHub() as hub:
        hub.add_model("acme/tiny-base", families("llama")["base"], SHA_BASE)
        if where == "offline":
            env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
        else:
            env = {"HF_HOME": str(tmp_path / "empty"), "HF_ENDPOINT": hub.endpoint}
        result = surgery("inspect", "acme/tiny-base", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "4 layers" in result.stdout


def test_training_from_a_hub_id_goes_through_the_one_resolver(hf_home, tmp_path, families):
    corpus = write_corpus(tmp_path / "sk.jsonl", docs=20)
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "out"
    options = ["--max-steps", "1", "--block-size", "16", "--batch-size", "2", "-q"]
    result = surgery("train", "acme/tiny-base", out, "--data", corpus, *options, env=env)
    assert result.returncode == 0, result.stderr
    assert_valid_output(out)
    assert headers(out) == headers(families("llama")["base"])
    recipe = json.loads((out / "surgery_recipe.json").read_text())
    assert recipe["operation"] == "train" and recipe["steps"] == 1 and recipe["tokens"] == 32
    base = {"role": "base", "path": "acme/tiny-base", "repo_id": "acme/tiny-base"}
    assert recipe["inputs"] == [base | {"revision": SHA_BASE}]
    assert "log_history" not in recipe  # kept in surgery_train.json, not in every shard header
    assert json.loads((out / "surgery_train.json").read_text())["log_history"]
    front = yaml.safe_load((out / "README.md").read_text().split("---")[1])
    assert front["base_model"] == ["acme/tiny-base"] and front["base_model_relation"] == "finetune"


def _uploaded(folder: Path) -> dict[str, bytes]:
    """Every file `surgery push` would send of `folder`, by name, with the generated card."""
    from surgery.hub.push import plan_upload

    files, card = plan_upload(folder, f"acme/{folder.name}")
    sent = {n: c if isinstance(c, bytes) else c.read_bytes() for n, c in files}
    return sent | ({"README.md": card.encode()} if card is not None else {})


def test_published_files_name_local_inputs_by_folder_name_only(families, tmp_path):
    """Card, recipe, mergekit config, training record and shard headers as pushed show no local
    path, and still verify; the local copies keep the full paths that replay needs."""
    from surgery import api
    from surgery.checks.verify import verify
    from tests.support.train_helpers import tiny_config
    from train.api import train

    paths = families("llama")
    base, trained, expert = paths["base"], paths["trained"], paths["experts"][0]
    private = str(base.parent).encode()  # the folder of the inputs: no uploaded byte names it
    config = tmp_path / "ties.yml"
    models = [
        {"model": str(m), "parameters": {"weight": w, "density": 0.5}}
        for m, w in ((trained, 1.0), (expert, 0.5))
    ]
    config.write_text(
        yaml.safe_dump({"merge_method": "ties", "base_model": str(base), "models": models})
    )
    corpus = write_corpus(tmp_path / "sk.jsonl", docs=20)
    outputs = [
        api.revert(base, trained, tmp_path / "reverted", "1:2", quiet=True),
        api.merge(config, tmp_path / "ties_out", quiet=True),
        train(tiny_config(base, tmp_path / "trained_out", [f"sk={corpus}:1.0"], max_steps=1)),
    ]
    for out in outputs:
        uploaded = _uploaded(Path(out))
        for folder in (private, str(tmp_path).encode()):
            assert [name for name, data in uploaded.items() if folder in data] == [], out
        hub_copy = tmp_path / "hub" / Path(out).name
        for name, data in uploaded.items():
            (hub_copy / name).parent.mkdir(parents=True, exist_ok=True)
            (hub_copy / name).write_bytes(data)
        assert verify(hub_copy, quiet=True).ok, out
    recipe = json.loads((tmp_path / "reverted" / "surgery_recipe.json").read_text())
    assert [i["path"] for i in recipe["inputs"]] == [str(base), str(trained)]
    published = json.loads(_uploaded(tmp_path / "reverted")["surgery_recipe.json"])
    assert [i["path"] for i in published["inputs"]] == ["base", "trained"]
    ties = yaml.safe_load(_uploaded(tmp_path / "ties_out")["mergekit_config.yml"])
    assert ties["base_model"] == "base"
    assert [m["model"] for m in ties["models"]] == ["trained", expert.name]
    # What push sends is what plan_upload planned: the dry run and a real push agree.
    with FakeHub() as hub:
        env = {"HF_ENDPOINT": hub.endpoint, "HF_TOKEN": "hf_test", "HF_HOME": str(tmp_path)}
        dry = surgery("push", tmp_path / "ties_out", "acme/ties_out", "--dry-run", env=env)
        pushed = surgery("push", tmp_path / "ties_out", "acme/ties_out", env=env)
    assert dry.returncode == 0 and pushed.returncode == 0, dry.stderr + pushed.stderr
    assert "- model: trained" in dry.stdout and private.decode() not in dry.stdout
    (commit,) = hub.state.commits
    assert dict(commit["files"]) == _uploaded(tmp_path / "ties_out")


def test_public_copies_keep_names_and_drop_folders():
    from surgery.engine.recipe import public_copy

    data = {
        "inputs": [{"path": "runs/slavic-expert"}, {"path": "/home/me/base/"}],
        "data": ["sk=/home/me/corpus/sk.jsonl:0.8", "/home/me/en.txt", "hub:org/set@train"],
        "keep": ["acme/tiny-base@v1", "https://huggingface.co/acme/x", "1:3=0.5,*=1", 0.5],
    }
    assert public_copy(data, {"runs/slavic-expert"}) == {
        "inputs": [{"path": "slavic-expert"}, {"path": "base"}],
        "data": ["sk=sk.jsonl:0.8", "en.txt", "hub:org/set@train"],
        "keep": data["keep"],
    }


def test_an_outputs_mergekit_config_replays_from_any_working_directory(families, tmp_path):
    """Inputs typed as relative paths are recorded absolute in the local mergekit config, so it
    replays from elsewhere: for an interpolation and for a merge of a relative config."""
    paths = families("llama")
    work = tmp_path / "work"
    for name in ("base", "trained"):
        shutil.copytree(paths[name], work / name)
    (work / "linear.yml").write_text(
        "merge_method: linear\nmodels:\n"
        "  - {model: base, parameters: {weight: 0.3}}\n"
        "  - {model: trained, parameters: {weight: 0.7}}\n"
    )
    made = [
        surgery(
            "interpolate", "--alpha", "0.25", "-q", "base", "trained", "interp", env={}, cwd=work
        ),
        surgery("merge", "-q", "linear.yml", "merged", env={}, cwd=work),
    ]
    assert all(r.returncode == 0 for r in made), [r.stderr for r in made]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("interp", "merged"):
        config = work / name / "mergekit_config.yml"
        replay = surgery("merge", "-q", config, "replay-" + name, env={}, cwd=elsewhere)
        assert replay.returncode == 0, replay.stderr
        original, again = load_state(work / name), load_state(elsewhere / f"replay-{name}")
        assert original.keys() == again.keys()
        assert all(same_bits(original[k], again[k]) for k in original)


def test_merge_cards_name_the_base_and_speak_of_masks_only_for_random_methods(families, tmp_path):
    from surgery import api

    paths = families("llama")
    models = [
        {"model": str(m), "parameters": {"weight": 1.0, "density": 0.5}}
        for m in paths["experts"][:2]
    ]
    cards = {}
    for method in ("ties", "dare_ties"):
        config = tmp_path / f"{method}.yml"
        spec = {"merge_method": method, "base_model": str(paths["base"]), "models": models}
        config.write_text(yaml.safe_dump(spec))
        cards[method] = (api.merge(config, tmp_path / method, quiet=True) / "README.md").read_text()
    experts = ", ".join(f"**{p.name}**" for p in paths["experts"][:2])
    assert f"merge of {experts} onto the base **base**" in cards["ties"]
    assert "| base | base | local |" in cards["ties"] and "model3" not in cards["ties"]
    assert "mask" not in cards["ties"] and "seed" not in cards["ties"]
    assert "Random masks seeded with 0." in cards["dare_ties"]


GOLDEN = Path(__file__).parent / "data" / "model_card_revert.md"


def test_model_card_matches_golden_file():
    recipe = {
        "tool": "checkpoint-surgery",
        "version": "0.1.0",
        "operation": "revert",
        "inputs": [
            {
                "role": "base",
                "path": "google/gemma-3-4b-pt",
                "repo_id": "google/gemma-3-4b-pt",
                "revision": "cc012e0a6d0787b4adcc0fa2c4da74402494554d",
            },
            {"role": "trained", "path": "runs/slavic-expert"},
        ],
        "layers": "9:28",
        "stack": "text",
        "num_layers": 34,
        "license": "gemma",
    }
    results = {"metrics": {"belebele/acc": 0.5123, "belebele/n": 900, "flores/chrf": 41.27}}
    card = render_card(recipe, "my-org/slavic-reverted", results)
    assert card == GOLDEN.read_text()


@pytest.fixture
def merged(families, tmp_path) -> Path:
    from surgery.api import soup

    out = soup(families("llama")["experts"], tmp_path / "merged", quiet=True)
    (out / "eval_results.json").write_text(json.dumps({"metrics": {"copain/acc": 0.25}}))
    return out


def test_push_uploads_folder_and_card(merged):
    with FakeHub() as hub:
        env = {"HF_ENDPOINT": hub.endpoint, "HF_TOKEN": "hf_test", "HF_HOME": str(merged.parent)}
        result = surgery("push", merged, "acme/merged", "--private", "--revision", "exp", env=env)
    assert result.returncode == 0, result.stderr
    assert "pushed" in result.stdout
    assert hub.state.repos["acme/merged"] == {"private": True, "branches": {"main", "exp"}}
    (commit,) = hub.state.commits
    assert commit["revision"] == "exp"
    local = {p.name: p.read_bytes() for p in merged.iterdir() if p.name != "README.md"}
    uploaded = dict(commit["files"])
    card = uploaded.pop("README.md").decode()
    assert uploaded.keys() == local.keys()
    published = ("surgery_recipe.json", "mergekit_config.yml", "eval_results.json")
    assert all(uploaded[name] == local[name] for name in local if name not in published)
    assert card.startswith("---\nlibrary_name: transformers") and "# acme/merged" in card
    assert "| copain/acc | 0.25 |" in card


def test_push_to_after_an_operation(families, tmp_path):
    paths = families("llama")
    with FakeHub() as hub:
        env = {"HF_ENDPOINT": hub.endpoint, "HF_TOKEN": "hf_test", "HF_HOME": str(tmp_path)}
        result = surgery(
            "revert",
            "--layers",
            "0",
            "-q",
            "--push-to",
            "acme/reverted",
            paths["base"],
            paths["trained"],
            tmp_path / "out",
            env=env,
        )
    assert result.returncode == 0, result.stderr
    (commit,) = hub.state.commits
    shards = sorted(p.name for p in (tmp_path / "out").glob("*.safetensors"))
    assert commit["repo"] == "acme/reverted" and set(shards) <= set(commit["files"])


def test_push_refusals(merged, tmp_path):
    with FakeHub() as hub:
        hub.state.read_only.add("acme/locked")
        base_env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "home")}
        no_token = surgery("push", merged, "acme/merged", env=base_env)
        no_token_after = surgery(
            "soup",
            merged,
            merged,
            out_never := tmp_path / "never2",
            "--push-to",
            "acme/merged",
            env=base_env,
        )
        env = {**base_env, "HF_TOKEN": "hf_test"}
        locked = surgery("push", merged, "acme/locked", env=env)
        dry = surgery("push", merged, "acme/merged", "--dry-run", env=env)
        invalid = surgery("push", merged, "acme/bad name!", env=env)
        out = tmp_path / "never"
        invalid_push_to = surgery("soup", merged, merged, out, "--push-to", "a--/b", env=env)
        shard = next(merged.glob("*.safetensors"))
        shard.write_bytes(shard.read_bytes()[:-10])
        broken = surgery("push", merged, "acme/merged", env=env)
    # The token is checked first: nothing said about pushing, nothing written for --push-to.
    for refused in (no_token, no_token_after):
        assert refused.returncode == 2 and refused.stdout == "", refused.stdout
        assert refused.stderr.startswith("error: no Hugging Face token"), refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    assert not out_never.exists()
    assert locked.returncode == 2
    assert locked.stderr.strip() == "error: acme/locked: not writable with this token (HTTP 403)"
    assert dry.returncode == 0 and "README.md (generated)" in dry.stdout
    first = dry.stdout.splitlines()[0]
    assert first.startswith("dry run: pushing ") and "to acme/merged, branch main, public" in first
    for refused in (invalid, invalid_push_to):
        assert refused.returncode == 2 and "is not a valid Hub repository id" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    assert not out.exists()
    assert broken.returncode == 2 and "fails verify, not pushed" in broken.stderr
    assert hub.state.commits == []
    # Only the locked push reached the commit endpoint; the dry run and the broken one sent nothing.
    commits = [path for method, path in hub.state.requests if "/commit/" in path]
    assert commits == ["/api/models/acme/locked/commit/main"]


def test_card_keeps_the_input_license_and_never_shows_local_paths(families, tmp_path):
    from huggingface_hub import ModelCard

    from surgery.api import revert

    paths = families("llama")
    trained = tmp_path / "trained"
    shutil.copytree(paths["trained"], trained)
    (trained / "README.md").write_text("---\nlicense: mit\n---\n# trained\n")
    out = revert(paths["base"], trained, tmp_path / "out", "1:2", quiet=True)
    text = (out / "README.md").read_text()
    card = ModelCard(text)  # huggingface_hub's own parser and metadata checks
    assert card.data.license == "mit"
    assert card.data.library_name == "transformers"
    assert str(tmp_path) not in text and "| trained | trained | local |" in text
    assert json.loads((out / "surgery_recipe.json").read_text())["license"] == "mit"

"""`surgery extract-lora`: a PEFT adapter from the SVD of each weight's change.

Oracles: peft loads the adapter onto BASE (transformers) and its merged weights must equal
TRAINED's up to the discarded singular values (Eckart-Young: the Frobenius error of each weight
is their norm); mergekit-extract-lora, run in process on the same inputs, must give the same
tensor names, config and factors.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from cli import cli
from surgery import api
from surgery.engine.lowrank import Solver, singular_values
from surgery.engine.ops.extract_lora import ADAPTER_WEIGHTS, PREFIX, LoraOptions
from tests.support import tiny_models

RANK = 4


def _float32_family(arch: str, root: Path) -> dict[str, Path]:
    base = tiny_models.save(tiny_models.build_model(arch).float(), root / "base")
    trained = tiny_models.perturb(tiny_models.build_model(arch).float(), seed=100)
    return {"base": base, "trained": tiny_models.save(trained, root / "trained")}


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """float32 checkpoints (so float32 tolerances apply), built once per architecture."""
    built: dict[str, dict[str, Path]] = {}

    def get(arch: str) -> dict[str, Path]:
        if arch not in built:
            built[arch] = _float32_family(arch, tmp_path_factory.mktemp(arch))
        return built[arch]

    return get


def _state(path: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(shard))
    return tensors


def _extract(paths: dict, out: Path, **kwargs) -> tuple[dict, dict]:
    layer_kwargs = {k: kwargs.pop(k) for k in ("layers", "stack", "modules") if k in kwargs}
    options = LoraOptions(**{"rank": RANK, **kwargs})
    api.extract_lora(paths["base"], paths["trained"], out, options, quiet=True, **layer_kwargs)
    return load_file(out / ADAPTER_WEIGHTS), json.loads((out / "adapter_config.json").read_text())


def _factored(adapter: dict) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """module -> (A, B) of every factored module (embeddings' A and B as peft holds them)."""
    pairs = {}
    for name, a in adapter.items():
        for kind in ("lora_A.weight", "lora_embedding_A"):
            if name.endswith(kind):
                module = name.removeprefix(PREFIX).removesuffix("." + kind)
                pairs[module] = (a, adapter[name.replace("_A", "_B")])
    return pairs


def _discarded_norm(delta: torch.Tensor, rank: int) -> float:
    values = torch.linalg.svdvals(delta.double())
    return float(values[rank:].norm())


def _merged_with_peft(paths: dict, adapter: Path) -> dict[str, torch.Tensor]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(paths["base"], dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return {k: v.detach() for k, v in merged.state_dict().items()}


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_peft_merge_reproduces_trained_within_the_truncation_error(family, tmp_path, arch):
    paths = family(arch)
    adapter, config = _extract(paths, tmp_path / "adapter")
    base, trained = _state(paths["base"]), _state(paths["trained"])
    merged = _merged_with_peft(paths, tmp_path / "adapter")
    factored = _factored(adapter)
    assert factored and config["r"] == RANK and config["lora_alpha"] == RANK
    for name, target in trained.items():
        module = name.removesuffix(".weight")
        if module in factored:
            delta = target.double() - base[name].double()
            error = float((merged[name].double() - target.double()).norm())
            assert error == pytest.approx(_discarded_norm(delta, RANK), rel=1e-4), name
            assert error > 0  # rank 4 of 32 truly truncates
        else:  # embeddings, head and norms are saved whole: TRAINED's exactly
            assert torch.equal(merged[name], target), name


def _mergekit(paths: dict, out: Path, *args: str) -> tuple[dict, dict]:
    from mergekit.scripts.extract_lora import main

    argv = ["--model", str(paths["trained"]), "--base-model", str(paths["base"])]
    main.main([*argv, "--out-path", str(out), *args], standalone_mode=False)
    return load_file(out / ADAPTER_WEIGHTS), json.loads((out / "adapter_config.json").read_text())


def _targeted(keys: list[str], modules: set[str]) -> set[str]:
    """The modules peft matches by a list of names (a full name or a last part)."""
    return {m for m in modules if any(m == k or m.endswith("." + k) for k in keys)}


def _same_config(
    ours: dict, theirs: dict, modules: set[str], left_out: frozenset = frozenset()
) -> None:
    """The same keys and values; name lists equal as the sets of `modules` peft matches by
    them, but for the `left_out` modules."""
    assert set(ours) == set(theirs) or set(ours) - set(theirs) == {"lora_bias"}
    for key, value in theirs.items():
        mine = ours[key]
        if isinstance(value, list):
            assert _targeted(mine, modules) == _targeted(value, modules) - left_out, key
        elif key != "base_model_name_or_path":
            assert mine == value, key


def _modules(paths: dict) -> set[str]:
    return {n.rsplit(".", 1)[0] for n in _state(paths["trained"])} | {"lm_head"}


def _same_factors(ours: dict, theirs: dict) -> None:
    assert set(ours) == set(theirs)
    pairs, reference = _factored(ours), _factored(theirs)
    assert pairs.keys() == reference.keys()
    for module, (a, b) in pairs.items():
        mine = b.double() @ a.double()
        other = reference[module][1].double() @ reference[module][0].double()
        values, expected = torch.linalg.svdvals(mine), torch.linalg.svdvals(other)
        torch.testing.assert_close(values, expected, rtol=1e-4, atol=1e-6)
        assert float((mine - other).norm()) <= 1e-4 * float(other.norm()), module
    for name, tensor in ours.items():
        if name.removeprefix(PREFIX).removesuffix(".weight") not in pairs and "lora" not in name:
            assert torch.equal(tensor, theirs[name]), name  # saved whole


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_agrees_with_mergekit_extract_lora(family, tmp_path, arch):
    paths = family(arch)
    ours, config = _extract(paths, tmp_path / "ours")
    theirs, reference = _mergekit(paths, tmp_path / "mk", "--max-rank", str(RANK))
    _same_factors(ours, theirs)
    _same_config(config, reference, _modules(paths))


@pytest.mark.parametrize(
    ("kwargs", "args"),
    [
        ({"embed_lora": True}, ["--embed-lora"]),
        ({"solver": Solver(distribute_scale=False)}, ["--no-distribute-scale"]),
        ({"include": ("mlp",), "exclude": ("down_proj",)}, ["-i", "mlp", "-e", "down_proj"]),
        ({"skip_undecomposable": True}, ["--skip-undecomposable"]),
    ],
    ids=["embed-lora", "no-distribute-scale", "include-exclude", "skip"],
)
def test_options_agree_with_mergekit(family, tmp_path, kwargs, args):
    paths = family("llama")
    ours, config = _extract(paths, tmp_path / "ours", **kwargs)
    theirs, reference = _mergekit(paths, tmp_path / "mk", "--max-rank", str(RANK), *args)
    _same_factors(ours, theirs)
    _same_config(config, reference, _modules(paths))


def test_threshold_keeps_the_singular_values_above_it_as_mergekit(family, tmp_path):
    paths = family("llama")
    base, trained = _state(paths["base"]), _state(paths["trained"])
    name = "model.layers.0.self_attn.q_proj.weight"
    values = torch.linalg.svdvals(trained[name] - base[name])
    epsilon = float(values[1] + values[2]) / 2  # q_proj 0 keeps 2
    ours, config = _extract(paths, tmp_path / "ours", sv_epsilon=epsilon)
    args = ["--max-rank", str(RANK), "--sv-epsilon", str(epsilon)]
    theirs, reference = _mergekit(paths, tmp_path / "mk", *args)
    # Where every singular value is at or below epsilon (the 16-row k_proj and v_proj here),
    # mergekit writes rank-0 factors that peft cannot load; the module is left out instead.
    empty = {n.removeprefix(PREFIX).split(".lora_")[0] for n, t in theirs.items() if not t.numel()}
    assert empty and not any(n.removeprefix(PREFIX).split(".lora_")[0] in empty for n in ours)
    theirs = {n: t for n, t in theirs.items() if t.numel()}
    for key in ("rank_pattern", "alpha_pattern"):
        reference[key] = {m: r for m, r in reference[key].items() if r}
    _same_factors(ours, theirs)
    _same_config(config, reference, _modules(paths), left_out=empty)
    assert config["rank_pattern"]["model.layers.0.self_attn.q_proj"] == 2
    for module, (a, _) in _factored(ours).items():
        values = torch.linalg.svdvals(trained[f"{module}.weight"] - base[f"{module}.weight"])
        assert a.shape[0] == min(RANK, int((values > epsilon).sum())), module
    _merged_with_peft(paths, tmp_path / "ours")  # loads: ranks differ by rank_pattern


def test_save_module_saves_it_whole(family, tmp_path):
    # (mergekit 0.1.5's --save-module fails: it appends to click's tuple, so no oracle here.)
    paths = family("llama")
    adapter, config = _extract(paths, tmp_path / "adapter", save_modules=("q_proj",))
    trained = _state(paths["trained"])
    assert "q_proj" in config["modules_to_save"] and "q_proj" not in config["target_modules"]
    for i in range(tiny_models.NUM_LAYERS):
        name = f"model.layers.{i}.self_attn.q_proj.weight"
        assert torch.equal(adapter[PREFIX + name], trained[name])
    assert not any("q_proj.lora" in name for name in adapter)
    merged = _merged_with_peft(paths, tmp_path / "adapter")
    assert torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"], trained[name.replace(str(i), "0", 1)]
    )


def test_embed_lora_merges_embeddings_with_peft(family, tmp_path):
    paths = family("llama")
    adapter, config = _extract(paths, tmp_path / "adapter", embed_lora=True)
    a = adapter[f"{PREFIX}model.embed_tokens.lora_embedding_A"]
    b = adapter[f"{PREFIX}model.embed_tokens.lora_embedding_B"]
    vocab = tiny_models.vocab_size()
    assert a.shape == (RANK, vocab) and b.shape == (32, RANK)
    assert "embed_tokens" in config["target_modules"] and config["modules_to_save"] == [
        "input_layernorm",
        "norm",
        "post_attention_layernorm",
    ]
    base, trained = _state(paths["base"]), _state(paths["trained"])
    merged = _merged_with_peft(paths, tmp_path / "adapter")
    name = "model.embed_tokens.weight"
    error = float((merged[name].double() - trained[name].double()).norm())
    assert error == pytest.approx(_discarded_norm(trained[name] - base[name], RANK), rel=1e-4)


def test_layers_and_modules_narrow_the_adapter(family, tmp_path):
    paths = family("llama")
    adapter, config = _extract(paths, tmp_path / "adapter", layers="1:3", modules="attn")
    modules = set(_factored(adapter))
    expected = {
        f"model.layers.{i}.self_attn.{p}"
        for i in (1, 2)
        for p in ("q_proj", "k_proj", "v_proj", "o_proj")
    }
    assert modules == expected
    assert set(adapter) == {f"{PREFIX}{m}.lora_{x}.weight" for m in expected for x in "AB"}
    assert sorted(config["target_modules"]) == sorted(expected)  # full names: not every layer
    assert config["modules_to_save"] == []
    base, trained = _state(paths["base"]), _state(paths["trained"])
    merged = _merged_with_peft(paths, tmp_path / "adapter")
    for name in trained:
        if name.removesuffix(".weight") not in expected:
            assert torch.equal(merged[name], base[name]), name  # BASE's where not extracted
    recipe = json.loads((tmp_path / "adapter" / "surgery_recipe.json").read_text())
    assert (recipe["layers"], recipe["modules"], recipe["rank"]) == ("1:3", "attn", RANK)


def _low_rank_trained(paths: dict, folder: Path, rank: int) -> Path:
    """TRAINED = BASE + an exact rank-`rank` change of every 2-D weight, same shards."""
    folder.mkdir()
    gen = torch.Generator().manual_seed(7)
    for shard in paths["base"].iterdir():
        if shard.suffix != ".safetensors":
            (folder / shard.name).write_bytes(shard.read_bytes())
            continue
        tensors = load_file(shard)
        for name, tensor in tensors.items():
            if tensor.dim() == 2:
                u = torch.randn(tensor.shape[0], rank, generator=gen)
                v = torch.randn(rank, tensor.shape[1], generator=gen)
                tensors[name] = tensor + 0.01 * u @ v
        save_file(tensors, folder / shard.name, metadata={"format": "pt"})
    return folder


def test_randomized_svd_recovers_a_low_rank_change_reproducibly(family, tmp_path):
    paths = family("llama")
    low = {"base": paths["base"], "trained": _low_rank_trained(paths, tmp_path / "low", 3)}
    solver = Solver("randomized", seed=5)
    first, _ = _extract(low, tmp_path / "a", solver=solver)
    again, _ = _extract(low, tmp_path / "b", solver=solver)
    assert all(torch.equal(first[k], again[k]) for k in first)  # seeded: the same bytes
    base, trained = _state(low["base"]), _state(low["trained"])
    for module, (a, b) in _factored(first).items():
        delta = trained[f"{module}.weight"].double() - base[f"{module}.weight"].double()
        error = float((b.double() @ a.double() - delta).norm())
        assert error <= 1e-5 * float(delta.norm()), module
    recipe = json.loads((tmp_path / "a" / "surgery_recipe.json").read_text())
    assert (recipe["svd"], recipe["seed"]) == ("randomized", 5)


def test_randomized_threshold_keeps_the_sketch_values_it_chose_the_rank_from(family, tmp_path):
    # The rank comes from the randomized sketch's singular values: the written factors must keep
    # those very values, all above epsilon. A sketch drawn with another number of columns (the
    # kept rank's instead of --rank's) estimates them differently, some at or below epsilon.
    paths = family("llama")
    base, trained = _state(paths["base"]), _state(paths["trained"])
    solver, rank = Solver("randomized", seed=0), 8

    def sketch(module: str) -> torch.Tensor:
        delta = trained[f"{module}.weight"] - base[f"{module}.weight"]  # float32, as the engine
        return singular_values(delta, min(rank, *delta.shape), solver, f"{module}.weight")

    # Epsilon just under one sketch value of a wide weight, where estimates differ the most.
    values = sketch("model.layers.0.mlp.up_proj")
    epsilon = float(values[4] - 0.01 * (values[4] - values[5]))
    adapter, config = _extract(paths, tmp_path / "a", rank=rank, sv_epsilon=epsilon, solver=solver)
    factored = _factored(adapter)
    assert len(factored) > 10 and config["r"] == max(a.shape[0] for a, _ in factored.values())
    for module, (a, b) in factored.items():
        chosen = sketch(module)
        kept = int((chosen > epsilon).sum())
        assert a.shape[0] == b.shape[1] == min(rank, kept), module
        written = torch.linalg.svdvals(b.double() @ a.double())[: a.shape[0]]
        assert bool((written > epsilon).all()), (module, written.tolist(), epsilon)
        assert written.float() == pytest.approx(chosen[: a.shape[0]], rel=1e-5), module


def test_card_names_the_adapter_relation(family, tmp_path):
    paths = family("llama")
    _extract(paths, tmp_path / "adapter")
    card = (tmp_path / "adapter" / "README.md").read_text()
    assert "base_model_relation: adapter" in card and "library_name: peft" in card
    files = {p.name for p in (tmp_path / "adapter").iterdir()}
    assert files == {"README.md", "adapter_config.json", ADAPTER_WEIGHTS, "surgery_recipe.json"}


def _run(*args: str):
    return CliRunner().invoke(cli, ["extract-lora", *map(str, args)])


def _refused(result, out: Path, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


def test_bad_inputs_are_refused_and_leave_nothing(family, tmp_path):
    paths = family("llama")
    out = tmp_path / "adapter"
    _refused(_run("--rank", 0, paths["base"], paths["trained"], out), out, "--rank")
    _refused(_run("--sv-epsilon", -1, paths["base"], paths["trained"], out), out, "--sv-epsilon")
    _refused(_run("-i", "(", paths["base"], paths["trained"], out), out, "does not compile")
    _refused(_run("--layers", "0:9", paths["base"], paths["trained"], out), out, "outside")
    _refused(_run("-i", "nothing", paths["base"], paths["trained"], out), out, "no weight left")
    other = tiny_models.random_llama(tmp_path / "wide", hidden=64, layers=4)
    _refused(_run(paths["base"], other, out), out, "shape")
    inside = paths["trained"] / "adapter"
    _refused(_run(paths["base"], paths["trained"], inside), inside, "inside")
    before = sorted(p.name for p in paths["trained"].iterdir())
    assert before == sorted(p.name for p in paths["trained"].iterdir())


def test_cli_writes_the_adapter(family, tmp_path):
    paths = family("llama")
    out = tmp_path / "adapter"
    result = _run("--rank", 2, "-q", "-e", "lm_head", paths["base"], paths["trained"], out)
    assert result.exit_code == 0, result.output
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 2 and "lm_head" not in config["modules_to_save"]
    assert f"{PREFIX}lm_head.weight" not in load_file(out / ADAPTER_WEIGHTS)


def _memory_checkpoint(path: Path, weights: int, seed: int) -> Path:
    path.mkdir(parents=True)
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        f"model.layers.{i}.mlp.up_proj.weight": torch.randn(1024, 1024, generator=gen).bfloat16()
        for i in range(weights)
    }
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return path


def _extract_peak(tmp_path: Path, weights: int) -> int:
    from bench.measure import measure

    base = _memory_checkpoint(tmp_path / f"base{weights}", weights, 0)
    trained = _memory_checkpoint(tmp_path / f"trained{weights}", weights, 1)
    code = (
        "import sys; from surgery.api import extract_lora; "
        "from surgery.engine.ops.extract_lora import LoraOptions; "
        "extract_lora(sys.argv[1], sys.argv[2], sys.argv[3], LoraOptions(rank=8), quiet=True)"
    )
    out = tmp_path / f"out{weights}"
    result = measure([sys.executable, "-c", code, str(base), str(trained), str(out)])
    assert result.returncode == 0
    return result.peak_anon


@pytest.mark.slow  # 2-9 min on 2 busy cores: 32 SVDs of 1024 x 1024 matrices
def test_memory_does_not_grow_with_the_number_of_weights(tmp_path):
    # Each weight's change is 4 MiB as float32; holding 24 of them (or their full U and V)
    # would add about 64 MiB over 8 weights, and factoring on every writer thread (each malloc
    # arena keeping a weight's freed heap) measured 11 MiB more. The peak is sampled every
    # 10 ms: 8 weights give the smaller run time enough for its sampling to find the same
    # transient peaks as the larger one's (with 4, one slow-suite run failed).
    small = _extract_peak(tmp_path, 8)
    large = _extract_peak(tmp_path, 24)
    print(f"peak RssAnon: {small / 2**20:.0f} MiB (8 weights), {large / 2**20:.0f} MiB (24)")
    assert large - small < 8 * 2**20, (small, large)

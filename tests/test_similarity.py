"""`surgery drift BASE EXPERT EXPERT...`: pairwise similarity of the experts' task vectors.

The numbers are checked against a direct float64 computation over whole tensors (torch, every
tensor loaded); experts perturbed in known layers show those layers; memory does not grow with
the number of layers.
"""

from __future__ import annotations

import json
import sys
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from bench.measure import measure
from cli import cli
from surgery.diagnostics.drift import drift, format_drift, module_kind, write_drift_csv
from surgery.diagnostics.similarity import similarity
from surgery.engine.reader import open_checkpoint
from tests.support import tiny_models
from tests.support.checks import load_state, text_layer

SHARED = 1  # the layer every expert moves in one shared direction (plus a little of its own)
OWN = 3  # the layer each expert moves in its own random direction
# Layers 0 and 2 (and everything outside the layers) stay the base's, bit for bit.


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


@torch.no_grad()
def _expert(arch: str, folder: Path, seed: int) -> Path:
    """The base of `arch` moved in layer SHARED along one direction common to every expert
    (scale 0.05) plus its own (0.005), and in layer OWN along its own direction only."""
    model = tiny_models.build_model(arch)
    names = [name for name, _ in model.named_parameters()]
    shared, own = torch.Generator().manual_seed(7), torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        layer = text_layer(name, names)
        if layer == SHARED:
            noise = torch.randn(param.shape, generator=shared) * 0.05
            noise += torch.randn(param.shape, generator=own) * 0.005
        elif layer == OWN:
            noise = torch.randn(param.shape, generator=own) * 0.05
        else:
            continue
        param.add_(noise.to(param.dtype))
    return tiny_models.save(model, folder)


@pytest.fixture(scope="module")
def perturbed(tmp_path_factory):
    """`perturbed(arch)` -> (base, [three experts moved in known layers])."""
    root = tmp_path_factory.mktemp("similarity")
    built: dict[str, tuple] = {}

    def get(arch: str):
        if arch not in built:
            base = tiny_models.save(tiny_models.build_model(arch), root / arch / "base")
            experts = [_expert(arch, root / arch / f"e{i}", 300 + i) for i in range(3)]
            built[arch] = (base, experts)
        return built[arch]

    return get


def _direct(base: Path, experts: list[Path]) -> dict:
    """Per layer and per kind: the float64 cosine and distance matrices of the task vectors,
    each the concatenation of whole tensors (every tensor loaded)."""
    b = load_state(base)
    states = [load_state(e) for e in experts]
    groups: dict[object, list[str]] = {}
    for name, tensor in b.items():
        if tensor.is_floating_point():
            groups.setdefault(("layer", text_layer(name, b)), []).append(name)
            groups.setdefault(("kind", module_kind(name)), []).append(name)
            groups.setdefault(("all", None), []).append(name)
    out = {}
    for key, names in groups.items():
        d = [torch.cat([(s[n].double() - b[n].double()).flatten() for n in names]) for s in states]
        cos, dist = np.eye(len(d)), np.zeros((len(d), len(d)))
        for i, j in combinations(range(len(d)), 2):
            norm = float(d[i].norm() * d[j].norm())
            both_zero = float(d[i].norm()) == 0 and float(d[j].norm()) == 0
            cos[i, j] = cos[j, i] = 1.0 if both_zero else float(d[i] @ d[j]) / norm
            dist[i, j] = dist[j, i] = float((d[i] - d[j]).norm())
        out[key] = (cos, dist)
    return out


def _open(base: Path, experts: list[Path]):
    return open_checkpoint(base), [open_checkpoint(e) for e in experts]


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_similarity_is_the_direct_float64_computation(families, arch):
    paths = families(arch)
    base, experts = paths["base"], paths["experts"]
    report = similarity(*_open(base, experts), ["a", "b", "c"])
    expected = _direct(base, experts)
    got = {("layer", i): s for i, s in report.layers.items()}
    got |= {("kind", k): s for k, s in report.kinds.items()}
    got[("all", None)] = report.total
    assert got.keys() == {k for k in expected if k != ("layer", None)}
    for key, sums in got.items():
        cos, dist = sums.cosine(), sums.distance()
        np.testing.assert_allclose(cos, expected[key][0], rtol=1e-9, atol=1e-12, err_msg=str(key))
        np.testing.assert_allclose(dist, expected[key][1], rtol=1e-9, err_msg=str(key))
        # Symmetric, with ones (cosine) and zeros (distance) on the diagonal, exactly.
        assert (cos == cos.T).all() and (dist == dist.T).all()
        assert (np.diag(cos) == 1).all() and (np.diag(dist) == 0).all()


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_similarity_shows_the_perturbed_layers(perturbed, arch):
    base, experts = perturbed(arch)
    report = similarity(*_open(base, experts), ["a", "b", "c"])
    assert list(report.layers) == list(range(tiny_models.NUM_LAYERS))
    off = ~np.eye(3, dtype=bool)
    for layer, sums in report.layers.items():
        cos, dist = sums.cosine(), sums.distance()
        if layer == SHARED:  # one direction in common: aligned, apart by their own parts only
            assert (cos[off] > 0.95).all() and (dist[off] > 0).all(), cos
        elif layer == OWN:  # independent directions: about orthogonal
            assert (abs(cos[off]) < 0.1).all() and (dist[off] > 0).all(), cos
        else:  # untouched: no task vector, the experts equal there
            assert (cos == 1).all() and (dist == 0).all(), (layer, cos, dist)
    # The reference's regions of 4 layers: early [0], middle [1], late [2, 3]; the mean of the
    # layers' matrices.
    assert report.regions() == {"early": [0], "middle": [1], "late": [2, 3]}
    late = (report.layers[2].cosine() + report.layers[3].cosine()) / 2
    np.testing.assert_array_equal(report.region_mean([2, 3], "cosine"), late)


def test_drift_command_with_experts_writes_tables_json_csv_and_heatmaps(perturbed, tmp_path):
    base, experts = perturbed("llama")
    files = {name: tmp_path / name for name in ("s.csv", "s.json", "r.png", "p.png")}
    result = run(
        "drift", "-q", base, *experts, "--labels", "sk,cs,pl", "--csv", files["s.csv"],
        "--json-file", files["s.json"], "--plot", files["r.png"], "--pair-plot", files["p.png"],
        "--pair", "cs,pl",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "mean cos" in result.stdout and "late layers 2-3: mean cosine" in result.stdout
    data = json.loads(files["s.json"].read_text())  # strict JSON: no NaN
    report = similarity(*_open(base, experts), ["sk", "cs", "pl"])
    assert data["labels"] == ["sk", "cs", "pl"]
    assert data["layers"][str(OWN)]["cosine"] == report.layers[OWN].cosine().tolist()
    assert data["regions"]["late"]["layers"] == [2, 3]
    rows = files["s.csv"].read_text().splitlines()
    # A row per pair (3) for each layer, (layer, kind), kind, region and all tensors.
    scopes = len(report.layers) + len(report.layer_kinds) + len(report.kinds) + 3 + 1
    assert len(rows) == 1 + 3 * scopes
    for name in ("r.png", "p.png"):
        assert files[name].read_bytes().startswith(b"\x89PNG")


def test_single_expert_drift_output_is_unchanged(families, tmp_path):
    paths = families("llama")
    csv = tmp_path / "d.csv"
    result = run("drift", "-q", paths["base"], paths["trained"], "--csv", csv)
    assert result.exit_code == 0, result.output
    report = drift(open_checkpoint(paths["base"]), open_checkpoint(paths["trained"]))
    assert result.stdout == format_drift(report) + "\n"
    assert csv.read_bytes() == write_drift_csv(report, tmp_path / "ref.csv").read_bytes()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--json-file", "{out}"], "--json-file: only with two or more TRAINED models"),
        (["--labels", "a,b"], "give 3 distinct names"),
        (["--pair", "a,z", "--labels", "a,b,c"], "'z' is not one of a, b, c"),
        (["--pair-plot", "{out}.txt"], "give a file name ending in .png"),
    ],
)
def test_drift_refuses_bad_similarity_options_before_reading(families, tmp_path, args, message):
    paths = families("llama")
    out = tmp_path / "out"
    inputs = [paths["base"], paths["trained"]]
    if "--json-file" not in args:
        inputs += paths["experts"][:2]
    result = run("drift", *inputs, *[a.format(out=out) for a in args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not list(tmp_path.iterdir())


def _stack(folder: Path, layers: int, hidden: int = 256) -> tuple[Path, list[Path]]:
    """A random Llama of `layers` layers and two experts, each the base plus seeded noise on
    every tensor (written with safetensors directly, beside the base's config)."""
    base = tiny_models.random_llama(folder / "base", hidden=hidden, layers=layers, shard_size="1GB")
    state = load_state(base)
    experts = []
    for seed in range(2):
        gen = torch.Generator().manual_seed(seed)
        moved = {n: (t.float() + 0.01 * torch.randn(t.shape, generator=gen)).to(t.dtype)
                 for n, t in state.items()}  # fmt: skip
        path = folder / f"e{seed}"
        path.mkdir()
        save_file(moved, path / "model.safetensors", metadata={"format": "pt"})
        (path / "config.json").write_bytes((base / "config.json").read_bytes())
        experts.append(path)
    return base, experts


def _similarity_peak(base: Path, experts: list[Path]) -> int:
    code = (
        "import sys; from surgery.engine.reader import open_checkpoint as o; "
        "from surgery.diagnostics.similarity import similarity; "
        "similarity(o(sys.argv[1]), [o(p) for p in sys.argv[2:]], ['a', 'b'])"
    )
    result = measure([sys.executable, "-c", code, str(base), *map(str, experts)])
    assert result.returncode == 0
    return result.peak_anon


def test_similarity_memory_does_not_grow_with_the_number_of_layers(tmp_path):
    # 590k parameters a layer: the six more layers of the deeper model hold 21 MB of bf16
    # weights in three inputs, 85 MB as float64 (what loading the models whole, as the
    # reference does, would add). Streamed, only N x N sums a layer grow.
    small = _similarity_peak(*_stack(tmp_path / "l2", layers=2))
    large = _similarity_peak(*_stack(tmp_path / "l8", layers=8))
    print(f"peak RssAnon: {small / 2**20:.0f} MiB (2 layers), {large / 2**20:.0f} MiB (8 layers)")
    assert large - small < 24 * 2**20, (small, large)


@pytest.mark.parametrize(
    "dtypes",
    [
        ["float32"] * 4,
        ["bfloat16"] * 4,
        ["float8_e4m3fn"] * 4,
        ["bfloat16", "float32", "float16", "bfloat16"],  # float dtypes may differ
    ],
)
def test_similarity_of_every_float_dtype_across_chunks(tmp_path, dtypes):
    """numpy decodes the 16- and 32-bit floats, torch float8; chunked sums across chunk
    boundaries (three experts: chunks of 2^19 elements) equal the whole tensors' float64 ones."""
    generator = torch.Generator().manual_seed(0)
    name = "model.layers.0.mlp.down_proj.weight"
    numel = 2**20 + 5
    common = torch.randn(numel, generator=generator)
    values = []
    for i, dtype in enumerate(dtypes):
        moved = common + (0 if i == 0 else 0.5) * torch.randn(numel, generator=generator)
        tensor = moved.to(getattr(torch, dtype))
        folder = tmp_path / str(i)
        folder.mkdir()
        save_file({name: tensor}, folder / "model.safetensors", metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
        values.append(tensor.double())
    folders = [tmp_path / str(i) for i in range(4)]
    report = similarity(*_open(folders[0], folders[1:]), ["a", "b", "c"])
    d = [v - values[0] for v in values[1:]]
    for i, j in combinations(range(3), 2):
        cosine = float(d[i] @ d[j]) / float(d[i].norm() * d[j].norm())
        assert report.total.cosine()[i, j] == pytest.approx(cosine, rel=1e-9)
        distance = float((d[i] - d[j]).norm())
        assert report.total.distance()[i, j] == pytest.approx(distance, rel=1e-9)

"""Donor grafts: a layer band taken from a model other than TRAINED's base.

`revert --layers A:B DONOR TRAINED` copies the band's bytes from any compatible model;
`interpolate --beta` takes the paper's strength (the donor's share, as
create_flores_transfer_hybrid.py computes `expert + beta * (donor - expert)`). The recipe names
the donor's role, and the card says "graft" when TRAINED names another base than the donor.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from cli import cli
from tests.support.checks import assert_valid_output, load_state, same_bits

BAND = (1, 2)  # the layers of `--layers 1:3`


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


def in_band(name: str) -> bool:
    return any(name.startswith(f"model.layers.{i}.") for i in BAND)


def recipe(out: Path) -> dict:
    return json.loads((out / "surgery_recipe.json").read_text())


def card(out: Path) -> str:
    return (out / "README.md").read_text()


@pytest.fixture(scope="module")
def lineage(families, tmp_path_factory):
    """Paths: base, donor (another model of the architecture), trained (nothing names its base),
    `named` (a surgery output whose recipe names base as its base), `carded` (trained with a
    card naming a Hub base) and `recorded` (trained with a training record naming base)."""
    paths = families("llama")
    root = tmp_path_factory.mktemp("grafts")
    named = root / "named"
    result = run("interpolate", "-q", "--alpha", "0.9", paths["base"], paths["trained"], named)
    assert result.exit_code == 0, result.output
    carded = Path(shutil.copytree(paths["trained"], root / "carded"))
    (carded / "README.md").write_text("---\nbase_model: acme/other-base\n---\n# carded\n")
    recorded = Path(shutil.copytree(paths["trained"], root / "recorded"))
    (recorded / "surgery_train.json").write_text(
        json.dumps({"config": {"base": str(paths["base"])}})
    )
    return {
        "base": paths["base"],
        "donor": paths["experts"][0],
        "trained": paths["trained"],
        "named": named,
        "carded": carded,
        "recorded": recorded,
    }


def test_revert_grafts_a_band_from_any_compatible_model(lineage, tmp_path):
    out = tmp_path / "out"
    result = run("revert", "-q", "--layers", "1:3", lineage["donor"], lineage["named"], out)
    assert result.exit_code == 0, result.output
    got = assert_valid_output(out)
    donor, trained = load_state(lineage["donor"]), load_state(lineage["named"])
    for name, tensor in got.items():
        assert same_bits(tensor, donor[name] if in_band(name) else trained[name]), name
    # TRAINED's recipe names BASE as its base: the band's source is a donor, and says so.
    made = recipe(out)
    assert [e["role"] for e in made["inputs"]] == ["donor", "trained"]
    assert made["trained_base"] == str(Path(lineage["base"]).absolute())
    text = card(out)
    assert "A graft: layers `1:3` of the text stack (4 layers) come from the donor" in text
    assert "the donor **expert0**, not **named**'s base **base**" in text
    assert "note: TRAINED" in result.stderr and "the donor of a graft" in result.stderr


@pytest.mark.parametrize(
    ("source", "trained", "role", "sentence"),
    [
        # TRAINED names BASE: a revert to its base, said so.
        ("base", "named", "base", "Layers `1:3` of the text stack (4 layers) are reverted to"),
        ("base", "recorded", "base", "are reverted to **base**, **recorded**'s base"),
        # TRAINED's card names a Hub base: the local BASE is a donor.
        ("base", "carded", "donor", "not **carded**'s base **acme/other-base**"),
        # Nothing names TRAINED's base: neither claim.
        ("donor", "trained", "base", "Layers `1:3` of the text stack (4 layers) come from "),
    ],
)
def test_the_card_says_graft_or_revert_only_when_trained_names_its_base(
    lineage, tmp_path, source, trained, role, sentence
):
    out = tmp_path / "out"
    result = run("revert", "-q", "--layers", "1:3", lineage[source], lineage[trained], out)
    assert result.exit_code == 0, result.output
    made = recipe(out)
    assert made["inputs"][0]["role"] == role
    assert ("trained_base" in made) == (trained != "trained")
    assert sentence in card(out)
    neutral = trained == "trained"
    assert ("graft" in card(out).lower()) == (role == "donor")
    assert ("reverted to" in card(out)) == (role == "base" and not neutral)


def _reference(expert: torch.Tensor, donor: torch.Tensor, beta: float) -> torch.Tensor:
    """create_flores_transfer_hybrid.py's formula, in float64."""
    return expert.double() + beta * (donor.double() - expert.double())


def test_beta_is_the_reference_graft_strength(lineage, tmp_path):
    donor, expert = lineage["donor"], lineage["named"]
    by_beta, by_alpha, by_layers = tmp_path / "beta", tmp_path / "alpha", tmp_path / "layers"
    for args, out in [
        (["--beta", "1:3=0.3"], by_beta),
        (["--alpha", "1:3=0.7,*=1"], by_alpha),
        (["--beta", "0.3", "--layers", "1:3"], by_layers),
    ]:
        result = run("interpolate", "-q", *args, donor, expert, out)
        assert result.exit_code == 0, result.output
    got = assert_valid_output(by_beta)
    d, e = load_state(donor), load_state(expert)
    for name, tensor in got.items():
        if not in_band(name):
            assert same_bits(tensor, e[name]), name
            continue
        exact = _reference(e[name], d[name], 0.3)
        magnitude = 0.7 * e[name].double().abs() + 0.3 * d[name].double().abs()
        # One bf16 rounding of the float32 blend (half an ulp, 2^-8 of the value) and float32's
        # own roundings (2^-22 of the terms' magnitudes).
        error = (tensor.double() - exact).abs()
        assert (error <= 2**-8 * exact.abs() + 2**-22 * magnitude).all(), name
    # `--alpha 1 - beta` on the band is the same checkpoint, bit for bit.
    for other in (by_alpha, by_layers):
        assert all(same_bits(t, load_state(other)[n]) for n, t in got.items())
    made = recipe(by_beta)
    assert made["beta"] == "1:3=0.3" and "alpha" not in made
    assert [e["role"] for e in made["inputs"]] == ["donor", "trained"]
    assert "**named** + beta * (**expert0** - **named**) with beta `1:3=0.3`" in card(by_beta)
    assert "the donor's share; alpha = 1 - beta" in card(by_beta)


def test_beta_one_copies_the_donors_band_bit_for_bit(lineage, tmp_path):
    # The reference copies the donor's bytes at beta 1 (its provenance check): so does --beta 1.
    out = tmp_path / "out"
    result = run("interpolate", "-q", "--beta", "1:3=1", lineage["donor"], lineage["trained"], out)
    assert result.exit_code == 0, result.output
    donor, trained = load_state(lineage["donor"]), load_state(lineage["trained"])
    for name, tensor in load_state(out).items():
        assert same_bits(tensor, donor[name] if in_band(name) else trained[name]), name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--beta", "0.3", "--alpha", "0.7"], "give --alpha (TRAINED's share) or --beta"),
        ([], "give --alpha (TRAINED's share) or --beta"),
        (["--beta", "1:3=1.5"], "beta 1.5 lies outside [0, 1]"),
        (["--beta", "1:3=0.3", "--layers", "1:3"], "per-range betas"),
    ],
)
def test_interpolate_refuses_bad_betas(lineage, tmp_path, args, message):
    out = tmp_path / "out"
    result = run("interpolate", *args, lineage["donor"], lineage["trained"], out)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not out.exists()

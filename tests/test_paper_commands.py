"""The "Reproducing the paper" commands of docs/training.md, replayed in miniature.

The bash block is read from docs/training.md, so a change there that no longer runs fails here. bash
itself expands it (variables, line continuations, the loop), with `surgery` defined as a
function that records each command's arguments; the recorded commands then run in order
through the CLI's entry point in this process (one import of torch, not one per command).

What changes for the miniature is listed in SUBSTITUTIONS (each must be found in the block):
only sizes, the base and the elided `...`. BASE is a Gemma-3 text model with the paper's 34
layers (hidden size 32), so every layer spec (`9:28`) stays as written. The MADLAD-style folders
(`madlad/data/<lang>/`) and the held-out folders (`valid/<family>/`) the training reads are
written by the test; the suite reads the published datasets from a local Hub (the test server,
at the commits the suite pins) holding a few of the paper's languages; the experts the block
does not train (germanic, indic, austronesian, romance: "the others likewise") are the base with
seeded noise.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
from pathlib import Path

import pytest
import torch

from tests.support import tiny_models
from tests.support.checks import assert_valid_output, load_state, same_bits
from tests.support.hub_server import FakeHub, hub_in_process
from tests.support.published import paper_datasets
from tests.support.train_helpers import in_layers, write_corpus

# The replay of the main block is slow (about 110 s of CPU, user + sys: 4 trainings, 4 suite
# evals on the local Hub); that of the text-only variant is not (no training).
slow = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "training.md"
MIDDLE = set(range(9, 28))  # the page's 9:28
OTHER_EXPERTS = ("germanic", "indic", "austronesian", "romance")
# (page text, miniature text): each replaced wherever it occurs, and it must occur.
SUBSTITUTIONS = (
    ("B=google/gemma-3-4b-pt", "B=base"),  # the tiny 34-layer Gemma-3 the test builds
    ("--block-size 2048", "--block-size 16"),
    ("--batch-size 4", "--batch-size 2"),
    ("--grad-accum 12", "--grad-accum 2"),
    ("--max-tokens 5000000000", "--max-tokens 256"),  # 4 optimizer steps of 2 x 2 x 16 tokens
    ("--warmup 200", "--warmup 1"),
    ("--warmup 500", "--warmup 1"),
    ("--eval-every 500", "--eval-every 2"),
    ("--data af=$M/af ...", "--data af=$M/af"),  # the other 25 languages of the dense run
    # The suite ships with the project; the commands run in a folder of their own.
    ("eval/study/suites/paper.yml", str(ROOT / "eval" / "study" / "suites" / "paper.yml")),
    # The suite's tasks on a few items each (Copain's 150 per task included).
    ("--allow-missing", "--allow-missing --limit 4"),
)
# bash runs the block with `surgery` recording its arguments, one NUL-separated command a line.
RECORDER = """set -euo pipefail
surgery() { printf "%s\\0" "$@" >> commands; printf "\\n" >> commands; }
"""


def paper_blocks() -> list[str]:
    """The bash blocks of docs/training.md's "## Reproducing the paper" section: the paper's
    commands, then their variant for text-only checkpoints made the reference's way."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## Reproducing the paper", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "the page's Reproducing the paper section needs its two bash blocks"
    return blocks


def paper_block() -> str:
    """The first bash block of docs/training.md's "## Reproducing the paper" section."""
    return paper_blocks()[0]


def miniature(block: str, substitutions=SUBSTITUTIONS) -> str:
    """The block with `substitutions` applied."""
    for old, new in substitutions:
        assert old in block, f"the page's paper block no longer has {old!r}"
        block = block.replace(old, new)
    return block


def recorded_commands(block: str, cwd: Path) -> list[list[str]]:
    """The `surgery` commands that bash runs for the block, arguments expanded."""
    script = cwd / "paper.sh"
    script.write_text(RECORDER + block, encoding="utf-8")
    subprocess.run(["bash", str(script)], cwd=cwd, check=True)
    lines = (cwd / "commands").read_bytes().split(b"\0\n")
    return [[a.decode() for a in line.split(b"\0")] for line in lines if line]


def run_surgery(args: list[str]) -> None:
    """One command through the CLI's entry point, as the `surgery` script runs it."""
    from cli import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main(args, prog_name="surgery")
            code = 0
        except SystemExit as stop:
            code = stop.code or 0
    assert code == 0, f"surgery {' '.join(args)}: exit {code}\n{err.getvalue()[-3000:]}"


def paper_text_config() -> dict:
    """A Gemma-3 text model's settings with the paper's 34 layers (its 4B has 34), tiny
    otherwise."""
    return dict(
        vocab_size=tiny_models.vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=34,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=16,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def build_base(folder: Path) -> Path:
    """A random Gemma-3 text model with 34 layers (the paper's 4B has 34), tiny otherwise."""
    torch.manual_seed(0)
    config = tiny_models.Gemma3TextConfig(**paper_text_config())
    return tiny_models.save(tiny_models.Gemma3ForCausalLM(config).to(torch.bfloat16), folder)


# The languages the local Hub holds, by the suite's task: MADLAD text for the languages trained
# on, Belebele for Slovak, Global-PIQA for Slovak and Spanish (regional variants). FLORES+ holds
# English only, so every translation unit is a missing one: 256-token translations on 34 layers
# would triple the replay's time (FLORES+ on the Hub is tests/test_eval_hub_data.py's).
TRAINED = ("mkd_Cyrl", "hrv_Latn", "rus_Cyrl", "slk_Latn", "srp_Cyrl", "ukr_Cyrl", "afr_Latn")
ON_THE_HUB = {
    "ppl": list(TRAINED),
    "belebele": ["slk_Latn"],
    "piqa": ["slk_Latn", "spa_Latn"],
    "flores": [],
}
PIQA_UNITS = (
    "slk_Latn",
    "spa_Latn/spa_latn_mexi",
    "spa_Latn/spa_latn_peru",
    "spa_Latn/spa_latn_spai",
)


def write_data(root: Path) -> None:
    """MADLAD-style text per language and held-out folders per family, for training."""
    languages = ("mk", "hr", "ru", "sk", "sr", "uk", "af")
    for seed, lang in enumerate(languages):
        write_corpus(root / "madlad" / "data" / lang / "train.txt", docs=30, seed=seed)
    for family, seed in (("slavic", 50), ("all", 60)):
        write_corpus(root / "valid" / family / "valid.txt", docs=4, words=20, seed=seed)


@contextlib.contextmanager
def paper_hub(root: Path):
    """A local Hub serving the suite's datasets (FLORES+ gated; a token is set)."""
    with FakeHub() as hub:
        for repo, (folder, revision) in paper_datasets(root / "hub", ON_THE_HUB).items():
            gated = repo == "openlanguagedata/flores_plus"
            hub.add_dataset(repo, folder, revision or "e" * 40, gated=gated)
        with hub_in_process(hub.endpoint, root / "hf_home", token="hf_test"):
            yield hub


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """The miniature block run in a fresh folder; the folder and the commands run."""
    root = tmp_path_factory.mktemp("paper")
    build_base(root / "base")
    write_data(root)
    for seed, name in enumerate(OTHER_EXPERTS, 300):
        noisy = tiny_models.perturb(load_model(root / "base"), seed=seed, scale=0.02)
        tiny_models.save(noisy, root / "ckpt" / name)
    commands = recorded_commands(miniature(paper_block()), root)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads only add contention
    try:
        with contextlib.chdir(root), paper_hub(root):
            for args in commands:
                run_surgery(args)
    finally:
        torch.set_num_threads(threads)
    return root, commands


def load_model(folder: Path):
    return tiny_models.Gemma3ForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)


@slow
def test_the_block_has_every_kind_of_command(replayed):
    _, commands = replayed
    kinds = [(c[0], "--freeze" in c, "--l2sp" in c, "--weights" in c) for c in commands]
    assert kinds.count(("train", False, False, False)) == 2  # expert and dense
    assert ("train", True, False, False) in kinds and ("train", False, True, False) in kinds
    assert [c[0] for c in commands].count("revert") == 2
    assert ("soup", False, False, False) in kinds and ("soup", False, False, True) in kinds
    assert [c[0] for c in commands].count("eval") == 4 and commands[-1][0] == "compare"


@slow
def test_trained_models_keep_the_base_layout_and_freezing_keeps_the_middle(replayed):
    root, _ = replayed
    base = load_state(root / "base")
    for name in ("slavic", "dense", "slavic-freeze", "slavic-l2sp"):
        state = assert_valid_output(root / "ckpt" / name)
        assert {n: (t.dtype, t.shape) for n, t in state.items()} == {
            n: (t.dtype, t.shape) for n, t in base.items()
        }, name
        record = json.loads((root / "ckpt" / name / "surgery_train.json").read_text())
        assert record["early_stopping"]["metric"].endswith("/ppl"), name
        moved = [n for n in base if not same_bits(state[n], base[n])]
        assert moved, f"{name} did not train"
        middle = [n for n in moved if in_layers(n, MIDDLE)]
        assert (not middle) == (name == "slavic-freeze"), name


@slow
def test_reverted_models_hold_the_base_middle_and_the_rest_trained(replayed):
    root, _ = replayed
    base = load_state(root / "base")
    for trained in ("dense", "slavic"):
        source = load_state(root / "ckpt" / trained)
        got = assert_valid_output(root / "ckpt" / f"{trained}-reverted")
        for name, tensor in got.items():
            expected = base[name] if in_layers(name, MIDDLE) else source[name]
            assert same_bits(tensor, expected), (trained, name)


@slow
@pytest.mark.parametrize(
    ("out", "weights", "with_base"),
    [("soup", [0.2] * 5, False), ("soup-anchored", [0.5] + [0.1] * 5, True)],
)
def test_soups_are_the_weighted_means(replayed, out, weights, with_base):
    """Each tensor is the float64 weighted mean, within one rounding of the result and one of the
    largest term in 16 bits: 2^-7 |mean| + 2^-8 max |w x| (where terms cancel, the sum's error
    scales with the terms, not with the near-zero mean; tests/test_ops.py holds soup to
    mergekit)."""
    root, _ = replayed
    experts = ["slavic", *OTHER_EXPERTS]
    states = ([load_state(root / "base")] if with_base else []) + [
        load_state(root / "ckpt" / name) for name in experts
    ]
    got = assert_valid_output(root / "ckpt" / out)
    for name, tensor in got.items():
        terms = [w * s[name].double() for w, s in zip(weights, states, strict=True)]
        mean, largest = sum(terms), torch.stack(terms).abs().amax(0)
        bound = 2**-7 * mean.abs() + 2**-8 * largest
        assert ((tensor.double() - mean).abs() <= bound).all(), (out, name)


@slow
def test_the_study_scores_what_is_there_lists_the_rest_and_compares(replayed):
    root, _ = replayed
    # What the local Hub holds (ppl of the languages trained on; Belebele and Global-PIQA of
    # Slovak; Global-PIQA's three Spanish variants) and Copain (no data).
    expected = {f"ppl/{lang}" for lang in TRAINED} | {"belebele/slk_Latn", "copain"}
    expected |= {f"piqa/{unit}" for unit in PIQA_UNITS}
    for model in ("base", "dense", "slavic", "soup"):
        results = json.loads((root / "results" / model / "results.json").read_text())
        assert results["complete"], model
        assert {u["id"] for u in results["units"]} == expected, model
        assert all(u["metrics"]["n"] > 0 for u in results["units"]), model
        # Every unit read from the Hub records the commit it read.
        for unit in results["units"]:
            assert (unit["task"] == "copain") == (unit["data"] is None), unit["id"]
            assert unit["task"] == "copain" or len(unit["data"]["commit"]) == 40, unit["id"]
        missing = {(m["task"], m["lang"]) for m in results["missing"]}
        assert {("piqa", "afr_Latn"), ("belebele", "hrv_Latn"), ("flores", "slk_Latn")} <= missing
        assert not missing & {(u["task"], u["lang"]) for u in results["units"]}, model
    # Global-PIQA demonstrations are the first rows (first_n, as the reference's tasks).
    samples = (root / "results/base/samples/piqa__slk_Latn.jsonl").read_text(encoding="utf-8")
    piqa = [json.loads(line) for line in samples.splitlines()]
    first_two = piqa[2]["context"].rsplit("\n\n", 1)[0]
    assert all(line["context"].startswith(first_two) for line in piqa[2:]), first_two
    comparison = json.loads((root / "report" / "comparison.json").read_text())
    assert set(comparison["models"]) >= {"dense", "slavic", "soup"}
    assert "`dense`, `slavic`, `soup`" in (root / "report" / "report.md").read_text()


# The variant for the reference's text-only checkpoints: only BASE changes for the miniature.
REFERENCE_SUBSTITUTIONS = (("B=google/gemma-3-4b-pt", "B=base"),)
REFERENCE_MODELS = ("dense", "slavic", *OTHER_EXPERTS)


def build_multimodal_base(folder: Path):
    """A random multimodal Gemma-3 (`Gemma3ForConditionalGeneration`, as google/gemma-3-4b-pt)
    with the paper's 34 text layers, tiny otherwise; saved as transformers saves it
    (`language_model.model.*` beside the vision tower). Returns the model."""
    torch.manual_seed(0)
    vocab = tiny_models.vocab_size()
    config = tiny_models.Gemma3Config(
        text_config=paper_text_config(),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
        ),
        mm_tokens_per_image=4,
        image_token_index=vocab - 1,
        boi_token_index=vocab - 2,
        eoi_token_index=vocab - 3,
    )
    model = tiny_models.Gemma3ForConditionalGeneration(config).to(torch.bfloat16)
    tiny_models.save(model, folder)
    return model


@pytest.fixture(scope="module")
def reference_replayed(tmp_path_factory):
    """The variant block run in miniature: a multimodal BASE, and text-only models made from it
    the reference's way (`tiny_models.text_only`) then trained (seeded noise)."""
    root = tmp_path_factory.mktemp("reference")
    model = build_multimodal_base(root / "base")
    for seed, name in enumerate(REFERENCE_MODELS, 400):
        trained = tiny_models.perturb(tiny_models.text_only(model), seed=seed, scale=0.02)
        tiny_models.save(trained, root / "reference" / "checkpoints" / name)
    block = miniature(paper_blocks()[1], REFERENCE_SUBSTITUTIONS)
    commands = recorded_commands(block, root)
    with contextlib.chdir(root):
        for args in commands:
            run_surgery(args)
    return root, commands


def test_the_variant_reverts_soups_and_anchors(reference_replayed):
    _, commands = reference_replayed
    assert [c[0] for c in commands] == ["revert", "revert", "soup", "interpolate"]


def test_reference_reverts_hold_the_multimodal_base_middle_under_text_only_names(
    reference_replayed,
):
    root, _ = reference_replayed
    base = load_state(root / "base")
    models = root / "reference" / "checkpoints"
    for trained in ("dense", "slavic"):
        source = load_state(models / trained)
        got = assert_valid_output(models / f"{trained}-reverted")
        assert got.keys() == source.keys()  # text-only, as the reference saved it
        for name, tensor in got.items():
            multimodal = "language_model.model." + name.removeprefix("model.")
            expected = base[multimodal] if in_layers(name, MIDDLE) else source[name]
            assert same_bits(tensor, expected), (trained, name)
        loaded = load_model(models / f"{trained}-reverted")
        assert type(loaded) is tiny_models.Gemma3ForCausalLM


def test_reference_anchored_soup_is_the_reference_blend(reference_replayed):
    """soup-anchored = 0.5 * base + 0.5 * soup within one rounding of the written soup, and the
    reference's (1 - alpha) * base + alpha * mean within the soup's rounding and that one."""
    root, _ = reference_replayed
    base = load_state(root / "base")
    models = root / "reference" / "checkpoints"
    experts = [load_state(models / name) for name in ("slavic", *OTHER_EXPERTS)]
    soup, anchored = load_state(models / "soup"), assert_valid_output(models / "soup-anchored")
    assert anchored.keys() == soup.keys()
    for name, tensor in anchored.items():
        theirs = base["language_model.model." + name.removeprefix("model.")].double()
        written = 0.5 * theirs + 0.5 * soup[name].double()
        magnitude = 0.5 * theirs.abs() + 0.5 * soup[name].double().abs()
        assert (
            (tensor.double() - written).abs() <= 2**-8 * written.abs() + 2**-22 * magnitude
        ).all()
        mean = sum(e[name].double() for e in experts) / len(experts)
        reference = 0.5 * theirs + 0.5 * mean
        largest = torch.stack([0.5 * theirs.abs(), 0.5 * mean.abs()]).amax(0)
        bound = 2**-7 * reference.abs() + 2**-8 * largest
        assert ((tensor.double() - reference).abs() <= bound).all(), name

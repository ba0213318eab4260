"""sweep, drift and localize on tiny models, scored with the eval wrapper."""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner

from cli import cli
from eval.api import evaluate, load_model
from eval.kinds.ppl import rate_metrics, ratio_stderr
from eval.scorer import TaskScorer
from surgery.core.errors import SurgeryError
from surgery.diagnostics.drift import drift, module_kind
from surgery.diagnostics.localize import (
    Localization,
    _recoveries,
    attribute,
    format_localization,
    noise,
    recovery,
    run_localize,
)
from surgery.diagnostics.plots import is_perplexity
from surgery.diagnostics.results import format_table, metric_names
from surgery.diagnostics.sweep import parse_alpha_grid, point_names, run_sweep
from surgery.engine.reader import open_checkpoint
from tests.support.checks import load_state, same_bits
from tests.support.tiny_models import build_model, save

DATA = "tests/data/eval"
TASKS = [f"ppl:{DATA}/held_out.txt", f"piqa:{DATA}/piqa.jsonl"]


def test_parse_alpha_grid():
    assert parse_alpha_grid("0:1:0.1") == [i / 10 for i in range(11)]
    assert parse_alpha_grid("0:1:0.3") == [0.0, 0.3, 0.6, 0.9]
    assert parse_alpha_grid("0,0.5,1") == [0.0, 0.5, 1.0]
    for bad in ("0:1", "1:0:0.1", "0:1:0", "a,b"):
        with pytest.raises(SurgeryError):
            parse_alpha_grid(bad)
    assert point_names([0.0, 0.3, 1.0]) == ["alpha-0.00", "alpha-0.30", "alpha-1.00"]
    assert point_names([0.0, 0.125]) == ["alpha-0.000", "alpha-0.125"]


def _scores(path) -> dict:
    model, tokenizer = load_model(path, progress=False)
    return evaluate(model, tokenizer, TASKS, progress=False)["metrics"]


def test_sweep_endpoints_score_as_base_and_trained(families, tmp_path):
    paths = families("llama")
    rows = run_sweep(
        paths["base"],
        paths["trained"],
        tmp_path / "s",
        [0.0, 0.5, 1.0],
        scorer=TaskScorer.of(TASKS),
        save=False,
        in_memory=True,
        quiet=True,
    )
    assert rows[0] | {"alpha": 0.0} == {"alpha": 0.0, **_scores(paths["base"])}
    assert rows[2] | {"alpha": 1.0} == {"alpha": 1.0, **_scores(paths["trained"])}
    assert rows[1]["piqa/acc"] is not None
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [
        "sweep.csv",
        "sweep.json",
        "sweep.png",
    ]
    assert (tmp_path / "s" / "sweep.png").stat().st_size > 10_000


def test_in_memory_and_written_sweeps_agree(families, tmp_path):
    paths = families("gemma3")
    common = dict(layers="1:3", scorer=TaskScorer.of(TASKS), quiet=True)
    memory = run_sweep(
        paths["base"],
        paths["trained"],
        tmp_path / "m",
        [0.0, 0.3, 1.0],
        save=False,
        in_memory=True,
        **common,
    )
    written = run_sweep(
        paths["base"],
        paths["trained"],
        tmp_path / "w",
        [0.0, 0.3, 1.0],
        save=True,
        in_memory=False,
        **common,
    )
    assert memory == written
    assert memory[0] != memory[1]  # the blend does move the scores
    folders = sorted(p.name for p in (tmp_path / "w").iterdir() if p.is_dir())
    assert folders == ["alpha-0.00", "alpha-0.30", "alpha-1.00"]
    base, zero = load_state(paths["base"]), load_state(tmp_path / "w" / "alpha-0.00")
    trained = load_state(paths["trained"])
    for name, tensor in zero.items():
        in_range = ".layers.1." in name or ".layers.2." in name
        assert same_bits(tensor, base[name] if in_range else trained[name])
    recorded = json.loads((tmp_path / "w" / "sweep.json").read_text())
    assert [row["alpha"] for row in recorded["rows"]] == [0.0, 0.3, 1.0]
    # The device and dtype that scored, resolved (never null), as results.json records them.
    assert (recorded["config"]["device"], recorded["config"]["dtype"]) == ("cpu", "float32")


class WeightNorm:
    """A scorer that is not the eval wrapper's (surgery never imports eval): it loads with
    transformers and scores the squared norm of the weights."""

    def __init__(self) -> None:
        self.config = {"scorer": "weight norm"}
        self.loaded: list[str] = []

    def load(self, folder):
        from transformers import AutoModelForCausalLM

        self.loaded.append(folder.name)
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), None

    def __call__(self, model, tokenizer, *, progress):
        return {
            "norm/sq": float(sum(p.detach().double().square().sum() for p in model.parameters()))
        }


def test_sweep_and_localize_score_with_any_scorer(families, tmp_path):
    paths = families("llama")
    norm = WeightNorm()
    rows = run_sweep(
        paths["base"], paths["trained"], tmp_path / "s", [0.0, 1.0], scorer=norm, quiet=True
    )
    # TRAINED loaded once and blended in memory; BASE's tensors read from its files.
    assert sorted(norm.loaded) == ["trained"]
    for row, key in zip(rows, ("base", "trained"), strict=True):
        model, _ = norm.load(paths[key])
        assert row["norm/sq"] == norm(model, None, progress=False)["norm/sq"]
    recorded = json.loads((tmp_path / "s" / "sweep.json").read_text())["config"]
    assert recorded["scorer"] == "weight norm" and recorded["in_memory"] is True
    result = run_localize(paths["base"], paths["trained"], norm, blocks="0:2", quiet=True)
    assert result.base["norm/sq"] == rows[0]["norm/sq"]
    assert result.trained["norm/sq"] == rows[1]["norm/sq"]


@pytest.mark.parametrize(
    ("narrowing", "label"),
    [
        ({}, "alpha (0 = base, 1 = trained)"),
        ({"layers": "1:3"}, "alpha (0 = base in layers 1:3, 1 = trained)"),
        (
            {"layers": "1:3", "modules": "attn"},
            "alpha (0 = base in attn of layers 1:3, 1 = trained)",
        ),
    ],
)
def test_sweep_plot_says_where_alpha_0_is_base(families, tmp_path, monkeypatch, narrowing, label):
    # With --layers (and --modules) alpha 0 is BASE only there: the axis must not say "0 = base".
    from surgery.diagnostics import plots

    figures = []

    def keep(*args, **kwargs):
        figures.append(metrics_figure(*args, **kwargs))
        return figures[-1]

    metrics_figure = plots.metrics_figure
    monkeypatch.setattr(plots, "metrics_figure", keep)
    paths = families("llama")
    run_sweep(
        paths["base"],
        paths["trained"],
        tmp_path / "s",
        [0.0, 1.0],
        scorer=TaskScorer.of(TASKS[:1]),
        save=False,
        in_memory=True,
        quiet=True,
        **narrowing,
    )
    (figure,) = figures
    assert {ax.get_xlabel() for ax in figure.axes if ax.lines} == {label}
    assert (tmp_path / "s" / "sweep.png").is_file()


def test_sweep_without_eval_writes_checkpoints_only(families, tmp_path):
    paths = families("gpt2")
    result = CliRunner().invoke(
        cli,
        [
            "sweep",
            "--alphas",
            "0,1",
            "-q",
            str(paths["base"]),
            str(paths["trained"]),
            "-o",
            str(tmp_path / "s"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["alpha-0.00", "alpha-1.00"]
    nothing = CliRunner().invoke(
        cli,
        [
            "sweep",
            "--no-save",
            str(paths["base"]),
            str(paths["trained"]),
            "-o",
            str(tmp_path / "t"),
        ],
    )
    assert nothing.exit_code == 2 and "nothing to do" in nothing.stderr
    assert not (tmp_path / "t").exists()


def test_drift_is_zero_for_identical_and_matches_direct_computation(families, tmp_path):
    paths = families("gemma3mm")
    same = drift(open_checkpoint(paths["base"]), open_checkpoint(paths["base"]))
    assert all(s.diff_sq == 0 and s.relative_l2 == 0 for s in same.tensors.values())
    assert all(math.isclose(s.cosine, 1.0) for s in same.tensors.values() if s.base_sq)
    report = drift(open_checkpoint(paths["base"]), open_checkpoint(paths["trained"]))
    base, trained = load_state(paths["base"]), load_state(paths["trained"])
    for name in (
        "language_model.model.layers.1.mlp.up_proj.weight",
        "language_model.model.embed_tokens.weight",
    ):
        b, t = base[name].double(), trained[name].double()
        assert math.isclose(
            report.tensors[name].relative_l2, float((t - b).norm() / b.norm()), rel_tol=1e-9
        )
        cosine = float(torch.nn.functional.cosine_similarity(t.flatten(), b.flatten(), dim=0))
        assert math.isclose(report.tensors[name].cosine, cosine, rel_tol=1e-9)
    layer = [n for n in base if n.startswith("language_model.model.layers.2.")]
    diff = sum(float((trained[n].double() - base[n].double()).square().sum()) for n in layer)
    norm = sum(float(base[n].double().square().sum()) for n in layer)
    assert math.isclose(report.layers[2].relative_l2, math.sqrt(diff / norm), rel_tol=1e-9)
    assert set(report.layers) == {0, 1, 2, 3}  # the vision tower's layers are not text layers
    assert module_kind("model.layers.0.self_attn.q_proj.weight") == "attention"
    assert module_kind("model.layers.0.mlp.down_proj.weight") == "mlp"
    assert module_kind("model.layers.0.input_layernorm.weight") == "norms"
    assert module_kind("transformer.wte.weight") == "embeddings"


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn]
)
def test_drift_of_every_float_dtype_matches_direct_computation(dtype, tmp_path):
    """numpy decodes the 16- and 32-bit floats, torch float8: both give the float64 sums."""
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(0)
    name = "model.layers.0.mlp.down_proj.weight"
    # Three chunks and a partial one, so chunked sums are checked across chunk boundaries.
    numel = 3 * 2**20 + 5
    states = {}
    for role in ("base", "trained"):
        values = torch.randn(numel, generator=generator).to(dtype)
        folder = tmp_path / role
        folder.mkdir()
        save_file({name: values}, folder / "model.safetensors", metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
        states[role] = values.double()
    sums = drift(open_checkpoint(tmp_path / "base"), open_checkpoint(tmp_path / "trained"))
    b, t = states["base"], states["trained"]
    got = sums.tensors[name]
    # A float64 sum of n terms, in any order, is within (n - 1) u sum|x_i| of the exact sum
    # (u = 2^-53; Higham, Accuracy and Stability of Numerical Algorithms, 4.2): ours and torch's
    # each, so twice that apart. (A relative 1e-12 held on one CPU only: t . b cancels to about
    # -78 from terms whose magnitudes add to 2e6, and came within 4.3e-13 there.)
    for value, terms in [
        (got.base_sq, b * b),
        (got.trained_sq, t * t),
        (got.dot, t * b),
        (got.diff_sq, (t - b) * (t - b)),
    ]:
        bound = 2 * numel * 2**-53 * float(terms.abs().sum())
        assert value == pytest.approx(float(terms.sum()), abs=bound)


def test_drift_command_writes_table_csv_and_plot(families, tmp_path):
    paths = families("llama")
    result = CliRunner().invoke(
        cli,
        [
            "drift",
            "-q",
            str(paths["base"]),
            str(paths["trained"]),
            "--csv",
            str(tmp_path / "d.csv"),
            "--plot",
            str(tmp_path / "d.png"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "rel. L2" in result.output and "attention" in result.output
    assert len((tmp_path / "d.csv").read_text().splitlines()) == 1 + len(load_state(paths["base"]))
    assert (tmp_path / "d.png").stat().st_size > 5_000


@pytest.fixture(scope="module")
def one_block_changed(tmp_path_factory):
    """BASE, and a TRAINED trained on the held-out text with only layers 2 and 3 (and the final
    norm) free: a change well beyond the noise of two documents, carried by one block."""
    from tests.support.train_helpers import tiny_config
    from train.api import train

    root = tmp_path_factory.mktemp("one_block")
    save(build_model("llama"), root / "base")
    data = [f"{DATA}/held_out.txt"]
    train(tiny_config(root / "base", root / "trained", data, freeze="0:2", freeze_embeddings=True))
    return root / "base", root / "trained"


def test_localize_attributes_the_effect_to_the_changed_block(one_block_changed, tmp_path):
    base, trained = one_block_changed
    out = tmp_path / "loc"
    result = run_localize(
        base,
        trained,
        TaskScorer.of(TASKS[:1]),
        blocks="0:2,2:4",
        alphas=[0.0, 0.5],
        out_dir=out,
        quiet=True,
    )
    assert result.metrics and result.base != result.trained
    by_block = {(r["block"], r["alpha"]): r for r in result.rows}
    assert result.within_noise == [] and result.improved() == result.metrics
    for metric in result.metrics:
        assert by_block["2:4", 0.0][f"recovery/{metric}"] > 0.9  # the final norm trained too
        assert by_block["0:2", 0.0][f"recovery/{metric}"] == 0.0
        assert by_block["0:2", 0.5][f"recovery/{metric}"] == 0.0
        assert result.best()[metric] == "2:4 @ alpha 0"
    assert (out / "localize.png").stat().st_size > 5_000
    assert len((out / "localize.csv").read_text().splitlines()) == 5


def test_localize_cli_and_block_size(one_block_changed, tmp_path):
    base, trained = one_block_changed
    args = [
        "localize",
        "-q",
        "--block-width",
        "2",
        "-t",
        TASKS[0],
        str(base),
        str(trained),
        "-o",
        str(tmp_path / "loc"),
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "ppl/held_out/ppl improved in training" in result.output
    assert "reverting block 2:4 @ alpha 0 gives back the most of the gain" in result.output
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 2 and "--force" in again.stderr
    no_task = CliRunner().invoke(cli, ["localize", "--blocks", "0:2", str(base), str(trained)])
    assert no_task.exit_code == 2


def test_recovery():
    assert recovery(5.0, trained=5.0, base=10.0) == 0.0
    assert recovery(10.0, trained=5.0, base=10.0) == 1.0
    assert math.isnan(recovery(3.0, trained=5.0, base=5.0))
    assert math.isnan(recovery(3.0, trained=5.0, base=5.004, floor=0.005))


def test_noise_floor_of_accuracies_and_perplexities():
    # A proportion with a known item count: twice the binomial standard error of the difference.
    base, trained = {"mc/acc": 0.50, "mc/n": 100}, {"mc/acc": 0.52, "mc/n": 100}
    assert noise("mc/acc", base, trained) == pytest.approx(2 * math.sqrt((0.25 + 0.2496) / 100))
    # A reported standard error wins.
    base["mc/acc_stderr"], trained["mc/acc_stderr"] = 0.03, 0.04
    assert noise("mc/acc", base, trained) == pytest.approx(0.1)
    # A metric without one (chrF, a corpus score): 0.01% of the larger magnitude...
    assert noise("mt/chrf", {"mt/chrf": 40.0}, {"mt/chrf": 30.0}) == pytest.approx(0.004)
    # ... of a perplexity's log: perplexities are judged on the log scale.
    floor = noise("ppl/x/ppl", {"ppl/x/ppl": 20.0}, {"ppl/x/ppl": 10.0})
    assert floor == pytest.approx(1e-4 * math.log(20.0))
    # A value in [0, 1] with an item count is no proportion unless its kind says so.
    base, trained = {"p/x/bits_per_byte": 0.95, "p/x/n": 9}, {"p/x/bits_per_byte": 0.97}
    assert noise("p/x/bits_per_byte", base, trained | {"p/x/n": 9}) == pytest.approx(0.97e-4)


def _perplexity_scores(rng, documents: int, rate: float, spread: float) -> dict:
    """Metrics as eval's ppl task reports them for documents whose NLL per byte varies."""
    sizes = [rng.randint(200, 2000) for _ in range(documents)]
    nll = [u * max(0.05, rng.gauss(rate, spread)) for u in sizes]
    tokens, words = [u // 4 for u in sizes], [u // 6 for u in sizes]
    metrics = {f"ppl/x/{k}": v for k, v in rate_metrics(nll, tokens, words, sizes).items()}
    return metrics | {"ppl/x/n": documents}


@pytest.mark.parametrize(("documents", "spread", "within"), [(9, 0.3, True), (400, 0.01, False)])
def test_bits_per_byte_and_byte_perplexity_get_the_same_verdict(documents, spread, within):
    """byte_perplexity = 2 ** bits_per_byte: a verdict on one is a verdict on the other. Noise
    comes from how much documents differ (few and varied: within noise; many and alike: not),
    never from where the value lies (bits per byte in [0, 1] is no proportion)."""
    import random

    rate = 0.95 * math.log(2)  # nats per byte: 0.95 bits per byte
    base = _perplexity_scores(random.Random(1), documents, rate, spread)
    trained = _perplexity_scores(random.Random(1), documents, rate * 0.97 / 0.95, spread)
    assert trained["ppl/x/bits_per_byte"] > base["ppl/x/bits_per_byte"]  # worse after training
    result = Localization(base=base, trained=trained)
    attribute(result)
    kinds = ("bits_per_byte", "byte_perplexity", "ppl", "word_perplexity")
    assert {f"ppl/x/{k}" for k in kinds} <= set(result.metrics)
    verdicts = {k: f"ppl/x/{k}" in result.within_noise for k in kinds}
    assert verdicts == dict.fromkeys(kinds, within)
    bpb, byte_ppl = (result.noise[f"ppl/x/{k}"] for k in kinds[:2])
    assert byte_ppl == pytest.approx(bpb * math.log(2))  # the same noise, on the log scale


def test_ratio_stderr_agrees_with_the_jackknife():
    """The delta-method standard error of a rate (NLL per byte over documents) against the
    jackknife's, computed independently (they agree to O(1/n))."""
    import random

    import numpy as np

    rng = random.Random(3)
    sizes = np.array([rng.randint(100, 3000) for _ in range(200)], dtype=float)
    nll = sizes * np.array([rng.gauss(1.3, 0.25) for _ in range(200)])
    leave_one_out = (nll.sum() - nll) / (sizes.sum() - sizes)
    n = len(sizes)
    jackknife = math.sqrt((n - 1) / n * ((leave_one_out - leave_one_out.mean()) ** 2).sum())
    assert ratio_stderr(list(nll), list(sizes)) == pytest.approx(jackknife, rel=0.02)
    assert math.isnan(ratio_stderr([1.0], [2.0]))


def _two_metric_result() -> Localization:
    """Training made ppl worse (forgot) and acc better (learned); block 0:2 moves both back."""
    base = {"t/ppl": 10.0, "t/ppl_stderr": 0.01, "m/acc": 0.40, "m/acc_stderr": 0.001}
    trained = {"t/ppl": 20.0, "t/ppl_stderr": 0.01, "m/acc": 0.60, "m/acc_stderr": 0.001}
    result = Localization(base=base, trained=trained)
    attribute(result)
    for block, ppl, acc in (("0:2", 11.0, 0.42), ("2:4", 19.0, 0.59)):
        metrics = {"t/ppl": ppl, "m/acc": acc}
        row = {"block": block, "alpha": 0.0, **metrics}
        result.rows.append(row | _recoveries(result, metrics))
    return result


def test_localize_knows_which_way_is_better():
    """Where training improved a metric, reverting gives the gain back: no "recovery"."""
    result = _two_metric_result()
    assert result.improved() == ["m/acc"]
    assert result.best() == {"t/ppl": "0:2 @ alpha 0", "m/acc": "0:2 @ alpha 0"}
    text = format_localization(result)
    assert "most recovery of t/ppl: block 0:2 @ alpha 0" in text
    assert "most recovery of m/acc" not in text
    assert "m/acc improved in training" in text and "gives back the most of the gain" in text
    # The ppl recovery is its NLL's: log(11 / 20) / log(10 / 20).
    row = result.rows[0]
    assert row["recovery/t/ppl"] == pytest.approx(math.log(11 / 20) / math.log(10 / 20))


def test_localize_files_are_strict_json_and_noise_cells_are_explained(tmp_path):
    from matplotlib.colors import to_rgba

    from surgery.diagnostics.heatmaps import recovery_figure
    from surgery.diagnostics.localize import save_localization
    from surgery.plotting import NOISE_COLOUR, NOISE_LABEL, close

    result = _two_metric_result()
    result.rows[1]["recovery/m/acc"] = math.nan
    save_localization(result, tmp_path / "loc", "title")

    def refuse(constant: str):
        raise AssertionError(f"{constant} is not JSON")

    data = json.loads((tmp_path / "loc" / "localize.json").read_text(), parse_constant=refuse)
    assert data["rows"][1]["recovery/m/acc"] is None
    assert data["config"]["improved_in_training"] == ["m/acc"]
    # The noise cell is the one grey of every figure, hatched, and the legend says what it is.
    fig = recovery_figure(result.rows, result.metrics, ["0:2", "2:4"], "title")
    (image,) = fig.axes[0].images
    assert image.cmap.get_bad() == pytest.approx(to_rgba(NOISE_COLOUR))
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [NOISE_LABEL]
    assert fig.axes[0].patches and fig.axes[0].patches[0].get_hatch() == "///"
    close(fig)


def test_localize_reports_no_recovery_within_noise():
    """TRAINED scores like BASE up to noise: no recovery like -6.24 and no best block."""
    result = Localization(
        base={"m/ppl": 10.000},
        trained={"m/ppl": 10.004},
        rows=[{"block": "0:2", "alpha": 0.0, "m/ppl": 10.03, "recovery/m/ppl": math.nan}],
        metrics=["m/ppl"],
        noise={"m/ppl": 0.01},
        within_noise=["m/ppl"],
    )
    text = format_localization(result)
    assert "within noise" in text and "most recovery" not in text
    assert result.best() == {}
    # A block whose own change is noise is not named best even if its ratio is large.
    result.within_noise = []
    result.base["m/ppl"] = 12.0
    result.rows[0].update({"m/ppl": 10.008, "recovery/m/ppl": 0.002})
    assert result.best() == {}
    assert "no block alone moves m/ppl beyond noise" in format_localization(result)


def test_sweep_table_is_aligned_and_perplexity_axes_are_logarithmic():
    rows = [
        {"alpha": 0.0, "ppl/gen/ppl": 5.3, "belebele/acc": 0.25},
        {"alpha": 0.25, "ppl/gen/ppl": 4654.123, "belebele/acc": 0.3},
    ]
    lines = format_table(rows, ["alpha", "ppl/gen/ppl", "belebele/acc"]).splitlines()
    assert len({len(line) for line in lines}) == 1
    assert [line.index("ppl/gen/ppl") + len("ppl/gen/ppl") for line in lines[:1]] == [
        line.index("5.3") + 3 for line in lines[1:2]
    ]
    assert is_perplexity("ppl/gen/ppl") and not is_perplexity("ppl/gen/bits_per_byte")


def test_sweep_plot_puts_forgetting_and_learning_on_one_axis_with_plain_ticks():
    """One panel per metric kind with a series per task (the forgetting `gen` and the learning
    `heldin` side by side), one NLL drawn once (bits per byte is the ppl's NLL), tick labels
    that are plain numbers, and a log axis only for a perplexity spanning more than 3x."""
    from surgery.diagnostics.plots import metrics_figure
    from surgery.plotting import close

    rows = [
        {"alpha": a, "gen/gen/ppl": 5 + 500 * a, "heldin/sla1/ppl": 900 - 800 * a}
        | {"gen/gen/bits_per_byte": 1.955 + 0.002 * a, "heldin/sla1/bits_per_byte": 1.96 - a / 100}
        | {"copain/acc": 0.25 + a / 4}
        for a in (0.0, 0.5, 1.0)
    ]
    fig = metrics_figure(rows, metric_names(rows), "sweep")
    fig.canvas.draw()
    panels = [ax for ax in fig.axes if ax.lines]
    assert [ax.get_ylabel() for ax in panels] == ["ppl (lower is better)", "acc (higher is better)"]
    assert [line.get_label() for line in panels[0].lines] == ["gen", "heldin"]
    # One legend for the figure names every task, each in one colour in every panel.
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["gen", "heldin", "copain"]
    colours = [line.get_color() for ax in panels for line in ax.lines]
    assert len(set(colours)) == 3
    # Three alphas are three points, not a curve.
    assert all(line.get_linestyle() == "None" for ax in panels for line in ax.lines)
    for ax in panels:
        labels = [t.get_text() for t in ax.get_yticklabels(minor=True) + ax.get_yticklabels()]
        numbers = [text.replace(".", "").replace(",", "") for text in labels if text]
        assert numbers and all(n.isdigit() for n in numbers), labels
        assert ax.yaxis.get_offset_text().get_text() == ""
    assert panels[0].get_yscale() == "log" and panels[1].get_yscale() == "linear"
    close(fig)

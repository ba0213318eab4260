"""`surgery demo --seeds N`: what holds over several runs of the demo."""

from __future__ import annotations

import json

from click.testing import CliRunner

from demo import spread
from demo.pipeline import AXES


def _entry(value: float, delta: float | None, significant: bool | None = None) -> dict:
    low = None if delta is None else (delta - 1 if significant else -abs(delta) - 1)
    high = None if delta is None else (delta + 1 if significant else abs(delta) + 1)
    return {"value": value, "delta": delta, "ci_low": low, "ci_high": high} | {
        "significant": significant
    }


def test_a_cell_is_bold_only_when_every_seed_moved_the_same_way():
    # Perplexity 10 -> 20, 30, 25 over three seeds: ratios x2, x3, x2.5, all beyond noise.
    held = [_entry(20, 10, True), _entry(30, 20, True), _entry(25, 15, True)]
    assert spread.spread_cell(held, ppl=True) == "**x2.5 (x2 to x3)**"
    # One seed within noise, or one on the other side: no longer a conclusion.
    assert not spread.spread_cell([*held[:2], _entry(11, 1, False)], ppl=True).startswith("**")
    few = [*held[:2], {**held[2], "few_items": True}]
    assert not spread.spread_cell(few, ppl=True).startswith("**")
    flipped = [_entry(5.0, 2.0, True), _entry(3.0, -1.5, True), _entry(4.0, 1.0, True)]
    assert spread.spread_cell(flipped, ppl=False) == "+1.0 (-1.5 to +2.0)"
    # The base: its values, median and range.
    base = [_entry(4.75, None), _entry(4.55, None), _entry(5.1, None)]
    assert spread.spread_cell(base, ppl=True) == "4.75 (4.55 to 5.1)"


def _table(scale: float) -> list[dict]:
    rows = [{"strategy": "Base", "model": "base"}, {"strategy": "EMA", "model": "ema"}]
    for label, _, _ in AXES:
        rows[0][label] = _entry(10.0, None)
        rows[1][label] = _entry(10 + scale, scale, True)
    return rows


def test_run_seeds_writes_one_table_over_the_runs(tmp_path, monkeypatch):
    seen = []

    def fake_demo(out, *, quick, seed, device):
        """Stands for run_demo (minutes of training): writes the results.json it would."""
        seen.append((out.name, quick, seed))
        out.mkdir(parents=True)
        (out / "results.json").write_text(json.dumps(_table(seed + 1.0)))

    monkeypatch.setattr(spread, "run_demo", fake_demo)
    path = spread.run_seeds(tmp_path / "spread", quick=True, seeds=[4, 5, 6])
    assert seen == [("seed-4", True, 4), ("seed-5", True, 5), ("seed-6", True, 6)]
    text = path.read_text()
    assert "Seeds 4, 5, 6 on " in text and "cores" in text
    ema = next(line for line in text.splitlines() if line.startswith("| EMA |"))
    # gen ppl: 10 -> 15, 16, 17 (x1.5, x1.6, x1.7); chrF: +5, +6, +7.
    assert "**x1.6 (x1.5 to x1.7)**" in ema and "**+6.0 (+5.0 to +7.0)**" in ema


def test_seeds_option_runs_consecutive_seeds_from_seed(tmp_path, monkeypatch):
    import cli

    calls = []
    monkeypatch.setattr(spread, "run_seeds", lambda out, **kw: calls.append(kw))
    args = ["demo", "--quick", "--seed", "3", "--seeds", "2", "-o", str(tmp_path / "o")]
    result = CliRunner().invoke(cli.cli, args)
    assert result.exit_code == 0, result.output
    assert calls == [{"quick": True, "seeds": [3, 4], "device": None}]
    refused = CliRunner().invoke(cli.cli, ["demo", "--seeds", "1", "-o", str(tmp_path / "p")])
    assert refused.exit_code == 2

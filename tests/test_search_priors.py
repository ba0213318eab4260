"""`surgery search --seed-profiles`: the families of priors, without a model (the search with
seeds and the localize identity are in test_search.py, on its world)."""

from __future__ import annotations

import pytest

from eval.search import priors
from eval.search.space import Space
from surgery.core.errors import SurgeryError


def test_lines_follow_the_line_at_each_blocks_mean_depth():
    """LiNeS: a + (b - a) * l / (L - 1); block 9:28 of 34 has mean depth 18/33."""
    space = Space(((0, 9), (9, 28), (28, 34)), 34, embeddings=True, step=0.05)
    seeds = {s.name: s.strengths for s in priors.lines(space)}
    assert len(seeds) == len(priors.LINES_A) * len(priors.LINES_B)
    for a in priors.LINES_A:
        for b in priors.LINES_B:
            strengths = seeds[f"lines {a:g}-{b:g}"]
            for (start, stop), name in zip(space.blocks, space.names, strict=False):
                depth = (start + stop - 1) / 2 / 33
                assert strengths[name] == pytest.approx(a + (b - a) * depth, abs=0.025)
            assert strengths["*"] == a


def test_reverted_is_the_paper_band_at_each_strength_and_drops_what_baselines_hold():
    space = Space(((0, 9), (9, 28), (28, 34)), 34, step=0.05)
    found = priors.reverted(space)
    assert [s.strengths["9:28"] for s in found] == list(priors.REVERTED)
    assert all(s.strengths["0:9"] == s.strengths["28:34"] == 1 for s in found)
    assert found[0].profile == "0:9=1,9:28=0,28:34=1"
    # A baseline holding the band at 0, and a family named twice: each profile once.
    kept = priors.seeds(space, ["reverted", "reverted"], "pair", taken=found[:1])
    assert [s.name for s in kept] == ["reverted 9:28 at 0.25", "reverted 9:28 at 0.5"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("linear", "write one of lines, reverted, 'localize DIR'"),
        ("localize", "write 'localize DIR'"),
        ("lines somewhere", "write lines"),
    ],
)
def test_a_family_that_is_not_one_is_refused(text, message):
    with pytest.raises(SurgeryError, match=message):
        priors.parse_seed(text)

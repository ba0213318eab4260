"""`surgery search --seed-profiles`: the families of priors, without a model (the search with
seeds and the localize identity are in test_search.py, on its world)."""

from __future__ import annotations

import pytest

from eval.search import priors
from eval.search.space import Space, baselines
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
        ("linear", "write one of lines, reverted, blocks, 'localize DIR'"),
        ("localize", "write 'localize DIR'"),
        ("lines somewhere", "write lines"),
    ],
)
def test_a_family_that_is_not_one_is_refused(text, message):
    with pytest.raises(SurgeryError, match=message):
        priors.parse_seed(text)


def test_blocks_probes_each_model_alone_in_each_block_of_the_soup():
    space = Space(((0, 2), (2, 4)), 4, step=0.5, labels=("a", "b"))
    found = priors.probes(space)
    assert len(found) == 2 * 3  # B blocks * (BASE and K experts)
    names = [s.name for s in found]
    assert names == [f"probe {blk} {m}" for blk in ("0:2", "2:4") for m in ("base", "a", "b")]
    assert found[0].profile == "0:2=0[1 1],2:4=1[1 1]"
    assert found[2].profile == "0:2=1[0 1],2:4=1[1 1]"
    assert {s.family for s in found} == {"blocks"}
    # One expert: BASE per block (TRAINED in a block is TRAINED itself, the context).
    one = Space(((0, 2), (2, 4)), 4, step=0.5)
    assert [s.profile for s in priors.probes(one)] == ["0:2=0,2:4=1", "0:2=1,2:4=0"]
    kept = priors.seeds(one, ["blocks"], "pair", baselines(one, [1, 2], [0.5]))
    assert [s.name for s in kept] == ["probe 0:2 base", "probe 2:4 base"]


def test_blocks_composes_per_block_the_probe_that_improved_most_on_the_soup():
    """Two perplexities (lower is better), spreads 18 (12 to 30) and 1.5 (4 to 5.5): a change
    is read in its objective's spread, so 0.5 on the second outweighs 2 on the first."""
    space = Space(((0, 2), (2, 4), (4, 6)), 6, step=0.5, labels=("a", "b"))
    soup = [20.0, 5.0]
    probed = {
        ("0:2", "base"): [22.0, 4.5],  # -2/18 + 0.5/1.5 = 0.22: improves most
        ("0:2", "a"): [18.0, 5.0],  # 2/18 = 0.11: improves less
        ("0:2", "b"): [21.0, 5.0],
        ("2:4", "base"): [25.0, 4.0],  # -5/18 + 1/1.5 = 0.39: best of its block
        ("2:4", "a"): [26.0, 5.0],
        ("2:4", "b"): [12.0, 5.5],  # 8/18 - 0.5/1.5 = 0.11
        ("4:6", "base"): [20.0, 5.0],  # no change: the soup stays
        ("4:6", "a"): [30.0, 5.2],
        ("4:6", "b"): [21.0, 5.0],
    }
    choice = priors.compose(soup, probed, [False, False])
    assert choice == {"0:2": "base", "2:4": "base"}
    assert priors.composed(space, choice).profile == "0:2=0[1 1],2:4=0[1 1],4:6=1[1 1]"
    # Higher is better: the signs turn, and b's probe in 2:4 leads its block.
    flipped = priors.compose(soup, probed, [True, True])
    assert flipped["2:4"] == "a" and flipped["4:6"] == "a" and "0:2" in flipped
    seed = priors.composed(space, {"2:4": "b"})
    assert seed.profile == "0:2=1[1 1],2:4=1[0 1],4:6=1[1 1]" and seed.family == "blocks"
    # Round 2 probes around the composition, but not the composition itself.
    around = priors.probes(space, seed.strengths, 2)
    assert len(around) == 3 * 3 - 1 and around[0].name == "probe 2 0:2 base"
    assert "0:2=1[1 1],2:4=1[1 0],4:6=1[1 1]" in [s.profile for s in around]
    later = priors.composed(space, {"0:2": "a"}, seed.strengths, 2)
    assert later.name == "composed 2" and later.profile == "0:2=1[1 0],2:4=1[0 1],4:6=1[1 1]"

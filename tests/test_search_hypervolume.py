"""The exact hypervolume (eval.search.hypervolume) against a brute-force count of grid cells."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from eval.search.hypervolume import Frame, hypervolume, nondominated


def _brute(points, reference, higher, cell: float) -> float:
    """Count the grid cells (side `cell`) between the reference and the points that some
    point dominates; exact when every coordinate lies on the grid."""
    gains = [
        [v - r if up else r - v for v, r, up in zip(p, reference, higher, strict=True)]
        for p in points
    ]
    top = [max([0.0, *(g[i] for g in gains)]) for i in range(len(reference))]
    counts = [round(t / cell) for t in top]
    covered = 0
    for corner in itertools.product(*(range(c) for c in counts)):
        far = [(k + 1) * cell for k in corner]  # the cell's corner farthest from the reference
        covered += any(all(g >= f for g, f in zip(gain, far, strict=True)) for gain in gains)
    return covered * cell ** len(reference)


def _random_points(rng: random.Random, count: int, dims: int, cell: float) -> list[list[float]]:
    # On the grid, some beyond the reference (negative gains), ties and duplicates likely.
    return [[rng.randint(-3, 12) * cell for _ in range(dims)] for _ in range(count)]


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("seed", range(6))
def test_random_fronts_match_the_brute_force_count(dims, seed):
    rng = random.Random(seed * 10 + dims)
    cell = 0.25
    higher = [rng.random() < 0.5 for _ in range(dims)]
    # Points as gains, then written in each objective's direction around a shifted reference.
    reference = [rng.randint(-5, 5) * cell for _ in range(dims)]
    gains = _random_points(rng, rng.randint(1, 14), dims, cell)
    points = [
        [r + g if up else r - g for g, r, up in zip(p, reference, higher, strict=True)]
        for p in gains
    ]
    expected = _brute(points, reference, higher, cell)
    assert hypervolume(points, reference, higher) == pytest.approx(expected, abs=1e-9)


def test_duplicates_and_dominated_points_add_nothing():
    front = [[1.0, 4.0, 2.0], [3.0, 1.0, 2.0], [2.0, 2.0, 3.0]]
    higher = [True] * 3
    alone = hypervolume(front, [0, 0, 0], higher)
    dominated = [[0.5, 3.0, 1.0], [1.0, 1.0, 1.0], [2.0, 2.0, 3.0]]
    assert hypervolume([*front, *front, *dominated], [0, 0, 0], higher) == pytest.approx(alone)
    assert alone == pytest.approx(_brute(front, [0, 0, 0], higher, 1.0))


def test_points_beyond_the_reference_count_nothing():
    # Lower is better on both: a point above the reference on one objective is outside.
    assert hypervolume([[5.0, 1.0], [1.0, 5.0]], [4.0, 4.0], [False, False]) == 0.0
    assert hypervolume([[4.0, 1.0]], [4.0, 4.0], [False, False]) == 0.0  # on the bound
    assert hypervolume([[3.0, 1.0], [9.0, 0.0]], [4.0, 4.0], [False, False]) == 3.0
    assert hypervolume([], [4.0, 4.0], [False, False]) == 0.0


def test_a_frame_takes_the_worst_input_and_perplexities_as_logarithms():
    # learning ppl (lower is better) and an accuracy (higher is better).
    frame = Frame.of([False, True], ["ppl", "acc"], [[1000.0, 0.3], [10.0, 0.2]])
    assert frame.reference == (1000.0, 0.2)
    assert frame.log == (True, False)
    assert frame.volume([[100.0, 0.5]]) == pytest.approx(math.log(10) * 0.3)
    assert frame.curve([[100.0, 0.25], None, [10.0, 0.5]]) == pytest.approx(
        [math.log(10) * 0.05, math.log(10) * 0.05, math.log(100) * 0.3]
    )


def test_the_nondominated_points_hold_the_whole_hypervolume():
    rng = random.Random(3)
    higher = [True, False, True]
    points = _random_points(rng, 30, 3, 1.0)
    front = nondominated(points, higher)
    reference = [-4.0, 13.0, -4.0]  # every point better than it
    assert hypervolume([points[i] for i in front], reference, higher) == pytest.approx(
        hypervolume(points, reference, higher)
    )
    for i in front:  # none of them alone is redundant
        rest = [points[j] for j in front if j != i]
        assert hypervolume(rest, reference, higher) < hypervolume(points, reference, higher)
    assert nondominated([[1.0, 2.0], [1.0, 2.0], [0.0, 3.0]], [False, False]) == [0, 2]

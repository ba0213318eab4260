"""DELLA's rescaling pass keeps the masks it draws for the map, and runs in the map's jobs.

Its masks are ours, not mergekit's (tests/test_merge.py compares what mergekit can check): here
the masks kept from the pass, the masks drawn again and any split of the pass between threads
must all give the same bytes.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from surgery import api
from surgery.engine import writer
from surgery.engine.ops.merge import della, task_arithmetic
from surgery.engine.ops.merge.della import Della, SharedPass
from surgery.engine.ops.merge.sparsify import Sparsifier
from tests.support.checks import assert_valid_output, load_state, same_bits


@pytest.fixture(scope="module")
def llama(families) -> dict:
    return families("llama")


def _della(row: int = 64, model: int = 0) -> Della:
    return Della(None, 0, True, 0.5, 0.2, row, (7, "t", model))


def _chunks(count: int, row: int = 64) -> list[tuple[int, np.ndarray]]:
    """Chunks of 4 rows with many ties, each at its own scale (2**-20 to 2**20): their norms'
    float64 sum depends on the order they are added in."""
    rng = np.random.default_rng(3)
    step = 4 * row
    values = np.round(rng.normal(size=(count, step)), 2) * 2.0 ** rng.integers(-20, 20, (count, 1))
    return [(i * step, v) for i, v in enumerate(values.astype(np.float32))]


def test_norms_summed_in_chunk_order_whatever_order_chunks_come_in():
    # The pass's chunks are measured by several threads in any order; the factor must be the
    # float64 sums of a pass in order, as mergekit-order bytes depend on it.
    chunks = _chunks(40)
    in_order = _della()
    for start, chunk in chunks:
        Sparsifier.measure(in_order, start, chunk)  # the plain pass: draws, sums in order
    in_order.conclude()
    shuffled = _della()
    for i in np.random.default_rng(0).permutation(len(chunks)):
        shuffled.measure(*chunks[i])
    shuffled.conclude()
    assert shuffled.factor == in_order.factor != 1.0
    assert (shuffled.before, shuffled.after) == (in_order.before, in_order.after)


def test_kept_masks_are_the_drawn_ones_read_once_and_bounded():
    chunks = _chunks(6)
    kept = _della()
    kept.remember_below = 2 * len(chunks[0][1])  # the first two chunks
    for start, chunk in chunks:
        kept.measure(start, chunk)
    assert sorted(kept.masks) == [0, len(chunks[0][1])]
    for start, chunk in chunks:
        expected = chunk * _della().mask(start, chunk)
        assert np.array_equal(kept.apply(start, chunk.copy()), expected)
    assert not kept.masks  # each read once, then freed


class _Recorder(Sparsifier):
    """Counts its measures and conclusions (no mask of its own)."""

    def __init__(self) -> None:
        super().__init__(None, 0, rescale=True)
        self.concluded = 0

    def mask(self, start: int, delta: np.ndarray) -> np.ndarray:
        return np.ones(delta.shape, bool)

    def conclude(self) -> None:
        self.concluded += 1


def _run_threads(shared: SharedPass, count: int) -> list[object]:
    results: list[object] = [None] * count

    def job(i: int) -> None:
        try:
            results[i] = shared.result(None)
        except Exception as error:  # recorded for the assertion
            results[i] = error

    threads = [threading.Thread(target=job, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    return results


def test_a_shared_pass_measures_each_chunk_once_over_threads_and_concludes_once():
    recorder = _Recorder()
    seen: list[tuple[int, str]] = []
    both = threading.Barrier(2, timeout=10)  # the first two chunks: taken by two threads

    def measure(inputs: object, start: int) -> None:
        seen.append((start, threading.current_thread().name))
        if start in (0, 10):
            both.wait()
        time.sleep(0.002)

    shared = SharedPass([recorder], [recorder], range(0, 400, 10), measure)
    results = _run_threads(shared, 4)
    assert sorted(s for s, _ in seen) == list(range(0, 400, 10))
    assert len({name for _, name in seen}) > 1
    assert recorder.concluded == 1
    assert all(r == [recorder] for r in results)
    assert shared.result(None) == [recorder]  # a late job finds it done
    assert recorder.concluded == 1


def test_a_shared_pass_that_fails_fails_every_job_waiting_on_it():
    recorder = _Recorder()

    def measure(inputs: object, start: int) -> None:
        time.sleep(0.002)
        if start == 150:
            raise OSError("bad read")

    shared = SharedPass([recorder], [recorder], range(0, 400, 10), measure)
    results = _run_threads(shared, 3)
    assert all(isinstance(r, OSError) for r in results)
    assert recorder.concluded == 0
    with pytest.raises(OSError, match="bad read"):
        shared.result(None)


def _merge(llama: dict, method: str, tmp_path: Path, name: str) -> dict:
    config = {
        "merge_method": method,
        "base_model": str(llama["base"]),
        "dtype": "float32",
        "models": [
            {"model": str(e), "parameters": {"weight": w, "density": 0.4, "epsilon": 0.2}}
            for e, w in zip(llama["experts"], (0.6, 0.5), strict=False)
        ],
    }
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(config))
    return assert_valid_output(api.merge(path, tmp_path / name, quiet=True))


@pytest.mark.parametrize("method", ["della", "della_linear"])
def test_kept_redrawn_and_partly_kept_masks_give_the_same_bytes(
    llama, tmp_path, monkeypatch, method
):
    # Small chunks and segments: every tensor's pass is split over chunks and its map over
    # jobs, so both workers share passes and read kept masks in any order.
    monkeypatch.setattr(task_arithmetic, "CHUNK_ELEMENTS", 256)
    monkeypatch.setattr(writer, "SEGMENT_ELEMENTS", 1024)
    outputs = {}
    for name, kept_bytes in [("kept", 2**20), ("redrawn", 0), ("partly", 96)]:
        monkeypatch.setattr(della, "KEPT_BYTES", kept_bytes)
        outputs[name] = _merge(llama, method, tmp_path, name)
    monkeypatch.setattr(writer, "SEGMENT_ELEMENTS", 2**22)  # one job a tensor
    outputs["whole"] = _merge(llama, method, tmp_path, "whole")
    base = load_state(llama["base"])
    first = outputs["kept"]
    assert any(not same_bits(first[k], base[k].float()) for k in first)  # a merge happened
    for other in ("redrawn", "partly", "whole"):
        assert all(same_bits(first[k], outputs[other][k]) for k in first), other

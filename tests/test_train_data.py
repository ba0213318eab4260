"""Data sources, packing, shares and the English-mix curriculum."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.support import tiny_models
from tests.support.train_helpers import write_corpus
from train.data import MixtureSchedule, PackedMixture, iter_blocks, iter_documents, shuffled
from train.sources import DataSource, normalize_shares
from train.strategies.curriculum import apply_mix_until


def test_readers(tmp_path):
    (tmp_path / "a.txt").write_text("first doc\nstill first\n\n\nsecond doc\n")
    shard = tmp_path / "madlad" / "sk" / "sk_clean_0000.jsonl.gz"
    shard.parent.mkdir(parents=True)
    rows = [{"text": "ahoj svet"}, {"text": ""}, {"text": "druhy"}]
    with gzip.open(shard, "wt", encoding="utf-8") as handle:
        handle.write("\n".join(json.dumps(row) for row in rows) + "\n\n")
    assert list(iter_documents(DataSource("a", str(tmp_path / "a.txt")))) == [
        "first doc\nstill first",
        "second doc",
    ]
    folder = DataSource("sk", str(tmp_path / "madlad"))  # MADLAD layout: a folder of shards
    assert list(iter_documents(folder)) == ["ahoj svet", "druhy"]


def test_blocks_are_packed_in_order(monkeypatch):
    tokenizer = tiny_models.make_tokenizer()
    docs = ["hello world", "the cat sat on the mat"]
    monkeypatch.setattr("train.data.iter_documents", lambda _: iter(docs))
    flat = [t for d in docs for t in [*tokenizer(d)["input_ids"], tokenizer.eos_token_id]]
    blocks = iter_blocks(DataSource("s", "unused"), tokenizer, 5)
    got = [next(blocks) for _ in range(len(flat) // 5)]
    assert got == [flat[i : i + 5] for i in range(0, len(got) * 5, 5)]
    # The source is re-read when it runs out: the next block continues from the start.
    assert next(blocks) == (flat[len(got) * 5 :] + flat)[:5]


def _schedule(per_step: int, steps: int = 50, seed: int = 0, until: float | None = 0.1):
    sources = normalize_shares([DataSource("sk", "x", 0.8), DataSource("en", "y", 0.2)])
    if until is not None:
        sources = apply_mix_until(sources, [f"en={until}"])
    return MixtureSchedule(
        [s.share for s in sources], [s.until for s in sources], steps, per_step, seed
    )


def test_curriculum_share_per_step():
    steps = list(_schedule(per_step=10))
    english = [slots.count(1) for slots in steps]
    assert all(len(slots) == 10 for slots in steps)
    # 20% English in each of the first 10% of steps (5 of 50), none afterwards.
    assert english == [2] * 5 + [0] * 45


def test_shares_hold_cumulatively_when_a_step_cannot_hold_them():
    steps = list(_schedule(per_step=3, steps=100, until=None))
    english = 0
    for number, slots in enumerate(steps, start=1):
        english += slots.count(1)
        assert abs(english - 0.2 * 3 * number) < 1  # never more than one block off
    assert english == 60


def test_schedule_is_deterministic_from_the_seed():
    assert list(_schedule(10, seed=3)) == list(_schedule(10, seed=3))
    assert list(_schedule(10, seed=3)) != list(_schedule(10, seed=4))
    # The seed orders slots within a step; it never changes the counts.
    counts = [[s.count(1) for s in _schedule(10, seed=seed)] for seed in (3, 4)]
    assert counts[0] == counts[1]


@pytest.mark.parametrize("until", [0.25, None])
def test_target_stream_is_never_replayed_by_the_switch(tmp_path, until):
    tokenizer = tiny_models.make_tokenizer()
    sk = write_corpus(tmp_path / "sk.jsonl.gz", docs=200, seed=1, prefix="sk ")
    en = write_corpus(tmp_path / "en.txt", docs=200, seed=2, prefix="en ")
    sources = normalize_shares([DataSource("sk", str(sk), 0.8), DataSource("en", str(en), 0.2)])
    if until is not None:
        sources = apply_mix_until(sources, [f"en={until}"])
    schedule = MixtureSchedule([s.share for s in sources], [s.until for s in sources], 12, 5, 0)
    tagged = list(PackedMixture(sources, tokenizer, 16, schedule).iter_tagged())
    assert len(tagged) == 12 * 5
    target = [block for index, block in tagged if index == 0]
    expected = iter_blocks(sources[0], tokenizer, 16)
    assert target == [next(expected) for _ in target]  # one continuous stream, no repeats
    english_steps = {i // 5 for i, (index, _) in enumerate(tagged) if index == 1}
    assert english_steps == ({0, 1, 2} if until else set(range(12)))
    items = list(PackedMixture(sources, tokenizer, 16, schedule))
    assert items[0]["input_ids"].tolist() == tagged[0][1]
    assert items[0]["labels"].tolist() == tagged[0][1]


def test_shuffled_is_a_seeded_permutation_within_the_buffer():
    import random

    docs = [f"doc {i}" for i in range(50)]
    whole = list(shuffled(iter(docs), 100, random.Random("0/s/0")))
    assert sorted(whole) == sorted(docs) and whole != docs
    assert whole == list(shuffled(iter(docs), 100, random.Random("0/s/0")))
    assert whole != list(shuffled(iter(docs), 100, random.Random("1/s/0")))
    assert list(shuffled(iter(docs), 0, random.Random(0))) == docs
    # A small buffer still yields every document once, and never one from far ahead.
    small = list(shuffled(iter(docs), 4, random.Random(3)))
    assert sorted(small) == sorted(docs)
    assert all(docs.index(d) <= position + 4 for position, d in enumerate(small))


def test_seed_orders_documents_within_a_source_and_each_pass(tmp_path):
    tokenizer = tiny_models.make_tokenizer()
    corpus = write_corpus(tmp_path / "sk.txt", docs=30)
    source = DataSource("sk", str(corpus))

    def blocks(seed, count=40):
        stream = iter_blocks(source, tokenizer, 16, seed, 1000)
        return [next(stream) for _ in range(count)]

    in_order = iter_blocks(source, tokenizer, 16)
    assert blocks(0) == blocks(0)
    assert blocks(0) != blocks(1)
    assert blocks(0) != [next(in_order) for _ in range(40)]

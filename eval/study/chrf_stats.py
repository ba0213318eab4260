"""sacrebleu's chrF sentence statistics for a whole unit at once, with numpy.

`CHRF._extract_corpus_statistics` counts character n-grams with Python Counters, about a
millisecond a sentence: at the study's size (9 models x 64 FLORES units x 1012 sentences) that
alone would take minutes. This computes the same integers (tests check equality with sacrebleu
on varied text) for every model's hypotheses against one reference set in a few sorts per
n-gram order. Only plain chrF (sacrebleu's defaults: word order 0, case kept, whitespace
dropped, one reference) takes this path; any other CHRF setting uses sacrebleu itself.
"""

from __future__ import annotations

import numpy as np


def supports(metric) -> bool:
    """Whether `metric` (a sacrebleu CHRF) is the plain chrF this module reproduces."""
    return metric.word_order == 0 and not metric.lowercase and not metric.whitespace


def _codes(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Every text without whitespace (as sacrebleu strips it), as code points, and lengths."""
    stripped = ["".join(text.split()) for text in texts]
    lengths = np.array([len(s) for s in stripped], dtype=np.int64)
    codes = np.frombuffer("".join(stripped).encode("utf-32-le"), dtype=np.uint32)
    return codes.astype(np.int64), lengths


def chrf_statistics(hypotheses: list[list[str]], references: list[str], order: int) -> np.ndarray:
    """[hyp, ref, match] counts per character n-gram order, per run and sentence.

    Args:
        hypotheses: per run (model, seed), one hypothesis per sentence.
        references: one reference per sentence.
        order: the metric's character order (6 for chrF).

    Returns:
        int64 array (runs, sentences, 3 * order), as `CHRF._extract_corpus_statistics` gives
        each run's sentences.
    """
    runs, items = len(hypotheses), len(references)
    codes, lengths = _codes(references + [h for run in hypotheses for h in run])
    segment = np.repeat(np.arange(len(lengths)), lengths)  # which text each character is in
    starts = np.cumsum(lengths) - lengths
    remaining = lengths[segment] - (np.arange(len(codes)) - starts[segment])
    side, sentence = segment // items, segment % items  # side 0: references; r + 1: run r
    ref_len, hyp_len = lengths[:items], lengths[items:].reshape(runs, items)
    out = np.zeros((runs, items, order, 3), dtype=np.int64)
    # Characters renumbered 1..A: an n-gram is then the base-(A + 1) number of its characters,
    # exact in int64 while (A + 1)^n < 2^62; beyond that (large scripts) it is renumbered.
    alphabet, codes = np.unique(codes, return_inverse=True)
    codes = codes.astype(np.int64) + 1
    base = len(alphabet) + 1
    ids = codes
    for n in range(1, order + 1):
        if n > 1:  # the n-gram at i is (the (n-1)-gram at i, the character at i + n - 1)
            following = np.concatenate([codes[n - 1 :], np.zeros(n - 1, dtype=np.int64)])
            if int(ids.max(initial=0)) >= (2**62) // base:
                ids = np.unique(ids, return_inverse=True)[1].astype(np.int64)
            ids = ids * base + following
        valid = remaining >= n  # n-grams that do not cross into the next text
        width = int(ids.max(initial=0)) + 1
        if width > (2**62) // ((runs + 1) * items):  # keys below would overflow: renumber
            ids = np.unique(ids, return_inverse=True)[1].astype(np.int64)
            width = int(ids.max(initial=0)) + 1
        key = sentence * width + ids
        ref_keys, ref_counts = np.unique(key[valid & (side == 0)], return_counts=True)
        hyp = valid & (side > 0)
        hyp_keys, hyp_counts = np.unique(
            (side[hyp] - 1) * (items * width) + key[hyp], return_counts=True
        )
        lookup = hyp_keys % (items * width)
        where = np.minimum(np.searchsorted(ref_keys, lookup), max(len(ref_keys) - 1, 0))
        found = ref_keys[where] == lookup if len(ref_keys) else np.zeros(len(lookup), bool)
        matched = np.where(
            found, np.minimum(hyp_counts, ref_counts[where] if len(ref_keys) else 0), 0
        )
        match = np.bincount(hyp_keys // width, weights=matched, minlength=runs * items)
        ref_ngrams = np.maximum(ref_len - n + 1, 0)
        out[:, :, n - 1, 0] = np.where(ref_ngrams > 0, np.maximum(hyp_len - n + 1, 0), 0)
        out[:, :, n - 1, 1] = ref_ngrams
        out[:, :, n - 1, 2] = match.reshape(runs, items).astype(np.int64)
    return out.reshape(runs, items, 3 * order)

"""The reader's verdict on fuzzed headers is safetensors' own (`safe_open`), example by example.

Headers are written as JSON text fragment by fragment, so the fuzzer can produce what Python's
json would never write: duplicate keys, NaN, `-0`, 1e999, integers of 30 digits, lone surrogate
escapes, deep nesting, wrong types in every field, and offsets that overlap, leave gaps or pass
the end of the file. The reader must never crash (only CheckpointError), must refuse everything
safetensors refuses, and must accept everything safetensors accepts.
"""

import json
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

from surgery.core.dtypes import DTYPES, bits
from surgery.core.errors import CheckpointError
from surgery.engine.reader import INDEX_NAME, open_checkpoint, read_shard


class Raw(str):
    """JSON text inserted verbatim."""


def dump(value) -> str:
    """JSON text of nested lists, (key, value) pair lists for objects, and Raw fragments."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, tuple):  # an object as a tuple of pairs (duplicates allowed)
        return "{" + ",".join(f"{dump(k)}:{dump(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump(v) for v in value) + "]"
    return json.dumps(value)


weird_numbers = st.sampled_from(
    [
        "-0",
        "1.0",
        "1e2",
        "-1",
        "18446744073709551615",
        "18446744073709551616",
        "9" * 30,
        "9" * 5000,
        "NaN",
        "Infinity",
        "1e999",
        "-1e999",
        "1e-999",
        "true",
        "null",
        '"3"',
    ]
).map(Raw)
odd_names = st.sampled_from(
    [Raw('"\\ud800"'), Raw('"\\udc00x"'), Raw('"\\ud83d\\ude00"'), "__metadata__", ""]
)
odd_dtypes = st.one_of(
    st.sampled_from(["u8", "F33", "", "BF16 "]),
    st.integers(0, 3),
    st.just([]),
)
odd_dims = st.one_of(st.integers(0, 2**64 + 5), weird_numbers)
nested = st.integers(100, 140).map(lambda depth: Raw("[" * depth + "]" * depth))
odd_extras = st.lists(
    st.tuples(
        st.sampled_from(["z", "dtype", "shape", "data_offsets", "y"]),
        st.one_of(weird_numbers, nested, odd_names, st.integers(-5, 5)),
    ),
    min_size=1,
    max_size=2,
)


def pick(draw, usual, odd, percent: int = 8):
    """Draw from `odd` about `percent`% of the time, else from `usual`."""
    # Hypothesis favours the ends of a range; the odd band sits in the middle.
    return draw(odd) if 40 <= draw(st.integers(0, 99)) < 40 + percent else draw(usual)


@st.composite
def entry(draw, position: int):
    """One tensor entry (as pairs) at `position`, and the position after it."""
    dtype = pick(draw, st.sampled_from(sorted(DTYPES)), odd_dtypes)
    shape = draw(st.lists(st.integers(0, 5) if draw(st.integers(0, 9)) else odd_dims, max_size=3))
    count = 1
    for dim in shape:
        count = count * dim if type(dim) is int else count
    size_bits = bits(dtype) if isinstance(dtype, str) and dtype in DTYPES else 8
    nbytes = min((count * size_bits + 7) // 8, 256) + pick(
        draw, st.just(0), st.sampled_from([1, -1])
    )
    start = position + pick(draw, st.just(0), st.sampled_from([1, -1, -2]))
    offsets = pick(draw, st.just([start, start + nbytes]), st.lists(odd_dims, max_size=3))
    pairs = [("dtype", dtype), ("shape", shape), ("data_offsets", offsets)]
    pairs = draw(st.permutations(pairs))[: 3 - pick(draw, st.just(0), st.just(1), 4)]
    pairs += pick(draw, st.just([]), odd_extras, 15)
    return tuple(pairs), max(position, start + nbytes)


@st.composite
def headers(draw):
    """(header bytes, data length): mostly valid, with a few mutations of every kind."""
    pairs, position = [], 0
    for _ in range(draw(st.integers(0, 4))):
        value, position = draw(entry(position))
        value = pick(draw, st.just(value), weird_numbers, 3)
        pairs.append((pick(draw, st.text(max_size=6), odd_names), value))
    if draw(st.booleans()):
        strings = st.tuples(st.text(max_size=3), st.text(max_size=3))
        odd_pairs = st.tuples(st.text(max_size=3), st.one_of(odd_dims, st.integers(0, 9)))
        metadata = pick(
            draw,
            st.lists(strings, max_size=3).map(tuple),
            st.one_of(
                st.just(Raw("null")),
                weird_numbers,
                st.lists(odd_pairs, min_size=1, max_size=2).map(tuple),
            ),
            20,
        )
        pairs.insert(draw(st.integers(0, len(pairs))), ("__metadata__", metadata))
    if pairs and draw(st.integers(0, 9)) == 0:
        pairs.append(draw(st.sampled_from(pairs)))  # a duplicate key
    text = pick(draw, st.just(dump(tuple(pairs))), st.just(dump([])), 3)
    text += pick(draw, st.sampled_from(["", "  "]), st.sampled_from(["\x00", "}", "\n\t"]), 5)
    length = max(0, position + pick(draw, st.just(0), st.sampled_from([1, -1])))
    return text.encode("utf-8", "surrogatepass"), length


def safetensors_verdict(path):
    try:
        with safe_open(path, "pt") as handle:
            return True, set(handle.keys()), handle.metadata() or {}
    except Exception as error:
        return False, str(error), None


def _agrees_with_safetensors(tmp_path, case) -> None:
    header, data_length = case
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(data_length))
    theirs, detail, metadata = safetensors_verdict(path)
    try:
        shard = read_shard(path)
    except CheckpointError as error:
        assert not theirs, (header, str(error))  # every safetensors dtype is handled
        return
    assert theirs, (header, detail)
    assert {t.name for t in shard.tensors} == detail
    assert shard.metadata == metadata


def _fuzz(examples: int):
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@_fuzz(1000)
@given(headers())
def test_reader_agrees_with_safetensors(tmp_path, case):
    _agrees_with_safetensors(tmp_path, case)


@pytest.mark.slow
@_fuzz(10_000)
@given(headers())
def test_reader_agrees_with_safetensors_on_more_headers(tmp_path, case):
    _agrees_with_safetensors(tmp_path, case)


# Numbers at the edges of serde_json's range: the digits that fit a u64, integers of about 309
# digits, fractions past a u64, exponents near 308 and past an i32. Each sits in a key no tensor
# field reads (safetensors still parses it).
EDGE_NUMBERS = [
    "9" * 308,
    "9" * 309,
    "1" + "0" * 308,
    "1" + "0" * 309,
    "17976931348623157" + "0" * 292,  # the largest double's digits, yet out of serde's range
    "-" + "9" * 400,
    "1.7976931348623157e308",
    "1.7976931348623158e308",  # Python rounds it to the largest double; serde overflows
    "99999999999999999999.9",
    "0.0e400",
    "1e2147483648",
    "1e-2147483648",
    "1" + "0" * 400 + "e-200",
]


def _digits(lengths) -> st.SearchStrategy[str]:
    return lengths.flatmap(lambda n: st.text("0123456789", min_size=n, max_size=n))


# Lengths about u64's 20 digits and the 309 of the largest double, or any up to 330.
_LENGTHS = st.one_of(st.sampled_from([18, 19, 20, 288, 289, 290, 307, 308]), st.integers(0, 330))


@st.composite
def json_numbers(draw):
    """JSON number text: a sign, 1 to 331 integer digits, maybe a fraction and an exponent."""
    whole = draw(st.sampled_from("123456789")) + draw(_digits(_LENGTHS))
    text = draw(st.sampled_from(["", "-"])) + draw(st.sampled_from([whole, "0"]))
    if draw(st.booleans()):
        text += "." + draw(_digits(st.one_of(st.just(25), st.integers(1, 330))))
    if draw(st.booleans()):
        exponent = draw(st.one_of(st.integers(0, 400), st.sampled_from([2**31 - 1, 2**31])))
        text += draw(st.sampled_from(["e", "E-", "e+"])) + str(exponent)
    return text


def _with_number(number: str) -> tuple[bytes, int]:
    header = '{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"z":' + number + "}}"
    return header.encode(), 2


@pytest.mark.parametrize("number", EDGE_NUMBERS, ids=lambda n: f"{n[:24]}({len(n)})")
def test_numbers_at_the_edge_of_serde_range(tmp_path, number):
    _agrees_with_safetensors(tmp_path, _with_number(number))


@_fuzz(200)
@given(json_numbers())
def test_numbers_out_of_range_as_safetensors_says(tmp_path, number):
    _agrees_with_safetensors(tmp_path, _with_number(number))


# Indexes: the reader opens a folder through its model.safetensors.index.json, whose names are
# paths. Whatever the index holds, opening the folder gives the checkpoint or a CheckpointError
# whose message can be printed (UTF-8), never another exception.
_FILES = ("s1.safetensors", "s2.safetensors")
_NAMES = ("a", "b")
odd_files = st.sampled_from(
    [
        Raw('"s1\\u0000.safetensors"'),
        Raw('"\\ud800.safetensors"'),
        Raw('"s2\\udc80.safetensors"'),
        "../s1.safetensors",
        "/etc/hostname",
        "",
        ".",
        "./s1.safetensors",
        "s1.safetensors/",
        "x" * 300,
        "é.safetensors",
        Raw("null"),
        Raw("3"),
        Raw("[]"),
    ]
)
odd_keys = st.sampled_from([Raw('"\\ud800"'), Raw('"a\\udc00"'), Raw('"a\\u0000"'), "", "c"])


@st.composite
def indexes(draw):
    """Index file bytes: mostly a valid weight_map of the two shards, with mutations."""
    pairs = [
        (
            pick(draw, st.just(name), st.one_of(odd_keys, st.text(max_size=3)), 10),
            pick(draw, st.just(file), st.one_of(odd_files, st.text(max_size=3)), 10),
        )
        for name, file in zip(_NAMES, _FILES, strict=True)
    ]
    if draw(st.integers(0, 9)) == 0:
        pairs.append(draw(st.sampled_from(pairs)))  # a duplicate key
    weight_map = pick(draw, st.just(tuple(pairs)), st.sampled_from([Raw("null"), [], ()]), 5)
    root = [("metadata", (("total_size", 32),)), ("weight_map", weight_map)]
    text = pick(draw, st.just(dump(tuple(root))), st.sampled_from(["[]", "{", '"x"']), 3)
    raw = text.encode("utf-8", "surrogatepass")
    return pick(draw, st.just(raw), st.sampled_from([b"\xff" + raw, b"\xef\xbb\xbf" + raw]), 3)


@pytest.fixture(scope="module")
def two_shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("indexed")
    for name, file in zip(_NAMES, _FILES, strict=True):
        save_file({name: torch.ones(4)}, folder / file)
    return folder


@settings(
    max_examples=1000,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(indexes())
def test_any_index_opens_or_is_one_checkpoint_error(two_shards, index):
    (two_shards / INDEX_NAME).write_bytes(index)
    try:
        checkpoint = open_checkpoint(two_shards)
    except CheckpointError as error:
        str(error).encode("utf-8")  # printable: no lone surrogate reaches the message
        return
    assert {t.name for t in checkpoint} == set(_NAMES)

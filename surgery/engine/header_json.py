"""Parse a safetensors header with the same verdicts as the safetensors library.

safetensors parses headers with serde_json in Rust, which is stricter than Python's `json`: no
NaN or Infinity, no number out of a float's range, no lone surrogate in a string, at most 127
nested arrays or objects, integers as plain literals (no `1.0`, no `true`, no `-0`) that fit a
64-bit unsigned integer, no duplicate field inside a tensor entry or a second `__metadata__`,
and every duplicate tensor entry well-typed even though the last one wins. Python's `json`
accepts all of those (or raises RecursionError and ValueError on some), so this module parses
with hooks that keep what Python would hide, then checks the types as serde does.

Every number is also read as serde_json reads it (whatever key holds it: safetensors buffers the
whole header before it looks at the keys), with serde's own rules for what is out of range; see
`_check_number`.
"""

from __future__ import annotations

import json
import re

from surgery.core.dtypes import is_known

# serde_json fails at 128 nested arrays/objects (the root object counts as one).
MAX_DEPTH = 127
USIZE_LIMIT = 2**64  # usize on the 64-bit platforms safetensors runs on
U64_MAX = 2**64 - 1
I32_MAX = 2**31 - 1
# serde_json's table of powers of ten, 1e0 to 1e308, each the nearest double.
POW10 = tuple(float(f"1e{power}") for power in range(309))
_NUMBER = re.compile(r"-?(\d+)(?:\.(\d+))?(?:[eE]([-+]?)(\d+))?")
TENSOR_FIELDS = ("dtype", "shape", "data_offsets")


class HeaderError(ValueError):
    """A header safetensors would refuse; the message says why (the caller adds the path)."""


class _Object(dict):
    """A JSON object that remembers every (key, value) pair, duplicates included."""

    pairs: list[tuple[str, object]]


class _NotUsize:
    """An integer literal no usize can hold: negative, `-0` (a float to serde), or >= 2**64."""

    def __init__(self, text: str) -> None:
        self.text = text if len(text) <= 24 else f"{text[:20]}... ({len(text)} digits)"

    def __repr__(self) -> str:
        return self.text


def _object(pairs: list[tuple[str, object]]) -> _Object:
    obj = _Object(pairs)
    obj.pairs = pairs
    return obj


def _digits_into(significand: int, digits: str) -> tuple[int, int]:
    """serde_json's accumulation of `digits` into a u64: (significand, how many digits fitted)."""
    for count, digit in enumerate(digits):
        if significand * 10 + int(digit) > U64_MAX:
            return significand, count
        significand = significand * 10 + int(digit)
    return significand, len(digits)


def _check_number(text: str) -> None:
    """Refuse a JSON number as serde_json does (without its float_roundtrip feature).

    serde keeps the digits in a u64 as long as they fit. Integer digits past that count as
    powers of ten; fraction digits past it are dropped. The value is then the significand
    times one double of its table of powers of ten (repeatedly divided by 1e308 for small
    ones): a product that overflows, a power above 1e308 with a non-zero significand, or an
    exponent beyond an i32 with a non-zero significand is out of range. So `1e309` is refused,
    but so is `1.7976931348623158e308`, which Python rounds down to the largest double, and so
    are integers of 309 digits and more.
    """
    whole, fraction, sign, power = _NUMBER.fullmatch(text).groups()
    significand, fitted = _digits_into(0, whole)
    exponent = len(whole) - fitted
    if fraction is not None:
        significand, fitted = _digits_into(significand, fraction)
        exponent -= fitted
    if power is not None:
        # serde reads the exponent's digits into an i32, ending at the first that overflows.
        if len(power.lstrip("0")) > 10 or int(power) > I32_MAX:
            if significand and sign != "-":
                raise HeaderError(f"number {text[:30]} out of range")
            return
        exponent += -int(power) if sign == "-" else int(power)
    if exponent >= len(POW10) and significand:
        raise HeaderError(f"number {text[:30]} out of range")
    if 0 <= exponent < len(POW10) and float(significand) * POW10[exponent] == float("inf"):
        raise HeaderError(f"number {text[:30]} out of range")


def _parse_int(text: str) -> int | _NotUsize:
    _check_number(text)
    # Never call int() on thousands of digits: Python refuses them with a ValueError.
    if text.startswith("-") or len(text) > 20 or int(text) >= USIZE_LIMIT:
        return _NotUsize(text)
    return int(text)


def _parse_float(text: str) -> float:
    _check_number(text)
    return float(text)


def _parse_constant(text: str) -> None:
    raise HeaderError(f"{text} is not a JSON number")


def is_utf8(text: str) -> bool:
    """Whether `text` is valid Unicode text, encodable as UTF-8: JSON's `\\ud800` escapes give
    Python strings with lone surrogates, which no UTF-8 file name or header can hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_strings_and_depth(root: object) -> None:
    """Refuse lone surrogates in any string and nesting deeper than serde_json allows."""
    stack = [(root, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if not is_utf8(value):
                raise HeaderError(f"string {value[:40]!r} holds a lone surrogate")
        elif isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise HeaderError(f"nested deeper than {MAX_DEPTH} levels")
            items = value.pairs if isinstance(value, _Object) else ((None, v) for v in value)
            for key, item in items:
                if key is not None:
                    stack.append((key, depth))
                stack.append((item, depth + 1))


def _is_usize(value: object) -> bool:
    return type(value) is int  # not bool, not float, not _NotUsize


def _check_entry(name: str, entry: object) -> None:
    if not isinstance(entry, _Object):
        raise HeaderError(f"tensor {name!r}: entry is {type(entry).__name__}, not an object")
    for field in TENSOR_FIELDS:
        count = sum(1 for key, _ in entry.pairs if key == field)
        if count != 1:
            what = "missing" if count == 0 else "duplicate"
            raise HeaderError(f"tensor {name!r}: {what} field {field!r}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or not is_known(dtype):
        raise HeaderError(f"tensor {name!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_usize(d) for d in shape):
        raise HeaderError(f"tensor {name!r}: bad shape {shape!r}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_usize, offsets)):
        raise HeaderError(f"tensor {name!r}: bad data_offsets {offsets!r}")


def parse_header(raw: bytes) -> tuple[dict[str, str], dict[str, dict]]:
    """Parse and type-check a safetensors header as safetensors does.

    Args:
        raw: the header bytes (without the 8-byte length).

    Returns:
        (metadata, entries): `__metadata__` (empty if absent or null) and each tensor's entry
        (`dtype` a str, `shape` a list of ints, `data_offsets` two ints), the last of
        duplicate names winning as in safetensors.

    Raises:
        HeaderError: the header is not what safetensors accepts.
    """
    try:
        text = raw.decode("utf-8")
        root = json.loads(
            text,
            object_pairs_hook=_object,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
        )
    except UnicodeDecodeError:
        raise HeaderError("header is not UTF-8") from None
    except RecursionError:
        raise HeaderError(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as error:  # JSONDecodeError and the hooks' HeaderError
        raise HeaderError(f"not JSON ({error})") from None
    if not isinstance(root, _Object):
        raise HeaderError("not a JSON object")
    _check_strings_and_depth(root)
    if sum(1 for key, _ in root.pairs if key == "__metadata__") > 1:
        raise HeaderError("duplicate __metadata__")
    for key, value in root.pairs:
        if key != "__metadata__":
            _check_entry(key, value)
        elif value is not None and (
            not isinstance(value, _Object) or not all(isinstance(v, str) for _, v in value.pairs)
        ):
            raise HeaderError("__metadata__ must map strings to strings")
    metadata = root.pop("__metadata__", None) or {}
    return dict(metadata), dict(root)

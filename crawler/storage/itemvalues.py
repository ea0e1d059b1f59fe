"""Item values as SQLite stores them: the one place that encodes an item field's value.

- text, bytes and None are stored as they are; an integer must fit in 64 bits;
- a float is a REAL, NaN is NULL (as SQLite stores a bare NaN), infinity stays one;
- lists, tuples and dicts are JSON text (:func:`json_text`): NaN is null in it, and
  +-infinity is written 1e999 / -1e999, valid JSON that every JSON reader (Python,
  JavaScript, SQLite's json functions, pandas) reads back as infinity;
- anything else is an :class:`ItemValueError`.

A column's type is declared by a field's ``sqlite_type`` (one of :data:`TYPES`) or
else by its first value (:func:`value_type`). ``crawler/itemrows.py`` turns items
into rows with :func:`encode_values`; the item exports write JSON lines with
:func:`json_text`.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterable
from json.encoder import c_make_encoder, encode_basestring

TYPES = ("INTEGER", "REAL", "TEXT", "BLOB", "")
INFINITY_JSON = "1e999"


class ItemValueError(ValueError):
    """An item field holds a value no column can store; ``field`` names it, if known."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


# One encoder for every value: ``json.dumps`` with options builds a new JSONEncoder per
# call, a third of the time of a short list's text.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
_ENCODE = _ENCODER.encode
# And the C encoder that ``encode`` builds for each call, built once: that took two
# thirds of the time of a short list's text (an item has several). Without the
# check for a value that holds itself, whose marks would be shared by every call:
# such a value recurses to a RecursionError, and is then given to ``_ENCODE``.
_C_ENCODE = (
    c_make_encoder(
        None,
        _ENCODER.default,
        encode_basestring,
        None,
        _ENCODER.key_separator,
        _ENCODER.item_separator,
        False,
        False,
        False,
    )
    if c_make_encoder is not None
    else None
)
_NESTED = (list, tuple, dict)


def _encode(value: object) -> str:
    if _C_ENCODE is None:
        return _ENCODE(value)
    try:
        return "".join(_C_ENCODE(value, 0))
    except RecursionError:
        return _ENCODE(value)


def _finite(value: object, marker: str) -> object:
    """``value`` with NaN as None and infinities as ``marker`` strings (lists, dicts)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("+" if value > 0 else "-") + marker
    if isinstance(value, dict):
        return {k: _finite(v, marker) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v, marker) for v in value]
    return value


def json_text(value: object) -> str:
    """``value`` as JSON text (the text of a list or dict column, a jsonl line);
    NaN as null, infinities as +-1e999. Raises TypeError, ValueError."""
    try:
        return _encode(value)
    except ValueError:
        pass  # a NaN or an infinity: the slower path, rare
    marker = uuid.uuid4().hex
    text = _ENCODE(_finite(value, marker))
    text = text.replace(f'"+{marker}"', INFINITY_JSON)
    return text.replace(f'"-{marker}"', "-" + INFINITY_JSON)


def has_nan(value: object) -> bool:
    """Whether ``value`` (or a list or dict in it) holds a NaN, stored as NULL."""
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, dict):
        return any(has_nan(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(has_nan(v) for v in value)
    return False


def column_value(value: object) -> object:
    """``value`` as SQLite stores it; raises ItemValueError when it cannot be.

    A NaN is NULL (SQLite stores a NaN so), bare or in a list or dict (JSON null)."""
    if value is None or isinstance(value, (str, bytes)):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, int):  # bool too
        if -(1 << 63) <= value < (1 << 63):
            return int(value)
        raise ItemValueError(f"integer {value} does not fit in 64 bits")
    if isinstance(value, _NESTED):
        try:
            return json_text(value)
        except (TypeError, ValueError) as exc:
            raise ItemValueError(f"{type(value).__name__} is not JSON: {exc}") from None
    raise ItemValueError(
        f"{type(value).__name__} value {value!r:.60} cannot be stored "
        "(use str, int, float, bool, bytes, None, or lists and dicts of them)"
    )


def encode_values(pairs: Iterable[tuple[str, object]]) -> tuple[dict[str, object], list[str]]:
    """The ``(field, value)`` pairs of an item as column values, and the fields whose
    NaN is stored as NULL (bare, or null in a list's JSON). Raises ItemValueError
    naming the field."""
    values: dict[str, object] = {}
    nan_fields: list[str] = []
    for name, value in pairs:
        kind = type(value)
        if kind is str or value is None:  # most values: as they are, nothing to check
            values[name] = value
            continue
        try:
            stored = values[name] = column_value(value)
        except ItemValueError as exc:
            raise ItemValueError(str(exc), name) from None
        # A NaN is NULL: bare, or null in a list's JSON (walked only then).
        if stored is None or kind in _NESTED and "null" in stored and has_nan(value):
            nan_fields.append(name)
    return values, nan_fields


def value_type(value: object) -> str:
    """The column type a field's first value gives it."""
    if isinstance(value, int):
        return "INTEGER"
    if isinstance(value, float):
        return "REAL"
    if isinstance(value, str):
        return "TEXT"
    if isinstance(value, bytes):
        return "BLOB"
    return ""

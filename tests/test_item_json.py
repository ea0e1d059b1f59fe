"""The JSON text of list and dict item values (item table columns, jsonl lines)."""

from __future__ import annotations

import json

import pytest

from crawler.storage.itemvalues import json_text

VALUES = [
    [],
    {},
    ["a", "caf\xe9 \u20ac \U0001f600", 'q"\\\n\t\x01'],
    {"k": [1, 2.5, True, False, None], "\xfc": {"x": [], "y": {}}},
    [1e300, -0.0, 10**18, -(10**30), 0.1],
    (1, "two", (3,)),
    [[[[["deep"]]]]],
]


def test_json_text_is_the_text_json_writes():
    # Twice over, and after values that fail: a call keeps nothing of the one before.
    for _ in range(2):
        for value in VALUES:
            assert json_text(value) == json.dumps(value, ensure_ascii=False)
        with pytest.raises(TypeError):
            json_text(["a", {"b": object()}])
        held: list = ["x"]
        held.append(held)
        with pytest.raises((ValueError, RecursionError)):
            json_text(held)
    assert json_text([float("nan"), float("inf"), {"m": float("-inf")}]) == (
        '[null, 1e999, {"m": -1e999}]'
    )

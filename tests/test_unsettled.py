"""The keys a crawl is fetching or storing (crawler/storage/unsettled.py): bounded, the
newest kept."""

from __future__ import annotations

from crawler.storage.unsettled import UnsettledKeys


def test_the_oldest_stored_keys_are_forgotten_first_and_the_rest_kept():
    keys = UnsettledKeys()
    assert keys.limit <= 20_000  # about 160 bytes each
    keys = UnsettledKeys(limit=100)
    for n in range(150):
        keys.fetching(f"k{n}")
        if n != 140:
            keys.stored(f"k{n}")
    assert [f"k{n}" in keys for n in (0, 49, 50, 140, 149)] == [False, False, True, True, True]
    keys.failed("k140")  # stored nothing: a later request fetches it
    keys.failed("k149")  # stored: failing later changes nothing
    assert "k140" not in keys and "k149" in keys

"""FinalKeys: an exact set of keys in bounded memory (crawler/storage/finalkeys.py)."""

from __future__ import annotations

from crawler.storage import finalkeys
from crawler.storage.finalkeys import FinalKeys


def test_a_full_filter_still_answers_exactly_from_disk(monkeypatch):
    # A filter of 16 bytes and no room to grow says "maybe" for nearly every key: each
    # answer then comes from the digests on disk.
    monkeypatch.setattr(finalkeys, "MAX_BLOOM_BYTES", 16)
    keys = FinalKeys(first_stage_bytes=16)
    first = [f"k{n}" for n in range(3000)]
    assert all(keys.first_sights(first))
    assert not any(keys.first_sights(first))
    assert all(keys.first_sight(f"j{n}") for n in range(1000))
    assert all(f"j{n}" in keys for n in range(1000))
    assert not any(f"x{n}" in keys for n in range(1000))
    assert keys.first_sights(["a", "k1", "a", "b"]) == [True, False, False, True]
    assert len(keys) == 4002
    keys.close()


def test_the_filter_grows_in_stages_up_to_its_bound():
    keys = FinalKeys(first_stage_bytes=64)
    keys.first_sights([f"k{n}" for n in range(100_000)])
    filter_bytes = keys.filter_bytes
    # 20 bits a key: 250 kB for 100,000 keys, at most twice that with the stages.
    assert 250_000 <= filter_bytes <= 2 * 250_000 + 64
    assert filter_bytes <= finalkeys.MAX_BLOOM_BYTES
    assert all(f"k{n}" in keys for n in range(0, 100_000, 97))
    keys.close()

"""FinalKeys: an exact set of keys in bounded memory (crawler/storage/finalkeys.py)."""

from __future__ import annotations

import hashlib

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


def test_hex_keys_and_other_keys_are_told_apart_exactly(monkeypatch):
    # A crawl's keys are hexdigests, read back as the bytes they spell; a string that
    # only looks like one (upper case, white space, a letter past f) is hashed. With
    # every answer from disk, each is its own key, whether met alone or in a batch.
    monkeypatch.setattr(finalkeys, "MAX_BLOOM_BYTES", 16)
    hexes = [hashlib.sha256(b"%d" % n).hexdigest() for n in range(40_000)]
    keys = FinalKeys(first_stage_bytes=16)
    assert all(keys.first_sights(hexes))  # over a chunk (128) a bucket
    assert not any(keys.first_sights(hexes[::-1]))
    assert not any(keys.first_sight(key) for key in hexes[::7])
    lookalikes = [
        hexes[0].upper(),
        hexes[1][:32] + " " + hexes[1][33:],
        "g" + hexes[2][1:],
        hexes[3][:63],
        hexes[4] + "0",
    ]
    assert keys.first_sights(lookalikes) == [True] * 5
    assert keys.first_sights([hexes[10].upper(), hexes[11]]) == [True, False]
    assert keys.first_sight(hexes[12].upper())
    assert not any(key in keys for key in [hexes[5].upper(), "g" + hexes[6][1:]])
    assert all(key in keys for key in lookalikes)
    mixed = [hashlib.sha256(b"x%d" % n).hexdigest() for n in range(3)] + ["not hex"]
    assert keys.first_sights(mixed) == [True] * 4
    assert keys.first_sights(mixed + [hexes[9]]) == [False] * 5
    assert len(keys) == 40_011
    keys.close()

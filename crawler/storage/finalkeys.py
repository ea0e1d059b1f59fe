"""The keys that have their final line in this run's action log: :class:`FinalKeys`.

A run logs one final line per URL, so it must tell a key it logged already from a new
one, for every key of a list of millions, exactly and in memory that does not grow with
the list. A Python set of the keys (or of their ``hash()``) costs 60 to 100 bytes a key,
~1 GB for 10 million, and two keys of one 64-bit hash would pass for one.

Here each key is known by 32 bytes, its digest: a crawl's keys are SHA-256 digests
in lowercase hex already (``crawler/storage/keys.py``), read back as the bytes they
spell; any other string is hashed with SHA-256. The digests are written to a temporary file (in
``TMPDIR``: node-local under Slurm) in 256 buckets by the digest's first byte. A Bloom
filter in memory says "new" for most new keys at once; its "maybe seen" is confirmed
exactly against the digests of that bucket on disk, so two keys pass for one only if
their SHA-256 digests are equal (no such pair is known), and the few keys the filter
is unsure of only cost a read. The filter grows in stages, each twice
the last (20 bits a key, 6 probes: about 3 false "maybes" in 10,000 new keys), up to
:data:`MAX_BLOOM_BYTES`; past that the last stage takes every key, and its false
"maybes" (each one bucket read) grow with the list instead of the memory.

A batch of keys (:meth:`FinalKeys.first_sights`, the skipped keys of a resumed list) is
filtered with numpy, a few operations per batch instead of a dozen Python operations
per key; a single key (a fetched URL's final line) in Python, so that a crawl that
skips nothing never imports numpy.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from array import array
from collections.abc import Iterable

# Bloom filter stages: the first holds FIRST_STAGE_BYTES, each next one twice the last,
# while the stages together stay within MAX_BLOOM_BYTES (16 MiB: ~6.7 million keys at
# the filter's designed rate of false "maybes").
FIRST_STAGE_BYTES = 1 << 16
MAX_BLOOM_BYTES = 1 << 24
BITS_PER_KEY = 20
PROBES = 6  # bit positions a key sets, each from 4 bytes of its digest
DIGEST_SIZE = 32
# Digests of a bucket gathered in memory before they are written (4 KiB a bucket).
CHUNK_DIGESTS = 128
_CHUNK_BYTES = CHUNK_DIGESTS * DIGEST_SIZE
_SHIFTS = tuple(32 * i for i in range(PROBES))


_HEX_DIGEST = re.compile(r"[0-9a-f]{64}\Z")


def digest(key: str) -> bytes:
    """The 32 bytes ``key`` spells in hex, or its SHA-256 digest when it spells none
    (a hexdigest only equals another string's digest if SHA-256 collides)."""
    if len(key) == 64 and _HEX_DIGEST.match(key):
        return bytes.fromhex(key)
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def digests(keys: list[str]) -> list[bytes]:
    """:func:`digest` of each of ``keys``; a batch of hexdigests (the usual one) is read
    in one call."""
    joined = "".join(keys)
    if keys and len(joined) == 64 * len(keys) and min(map(len, keys)) == 64:
        try:
            raw = bytes.fromhex(joined)  # refuses what is not hex but white space
        except ValueError:
            raw = b""
        if len(raw) == DIGEST_SIZE * len(keys) and joined == joined.lower():
            return [raw[at : at + DIGEST_SIZE] for at in range(0, len(raw), DIGEST_SIZE)]
    return [digest(key) for key in keys]


class _Stage:
    """One Bloom filter: ``size`` bytes (a power of two), up to ``capacity`` keys at
    its designed rate."""

    __slots__ = ("bits", "mask", "capacity", "keys", "_view")

    def __init__(self, size: int):
        self.bits = bytearray(size)
        self.mask = size * 8 - 1
        self.capacity = size * 8 // BITS_PER_KEY
        self.keys = 0
        self._view = None

    # A single key: ``word`` is its digest as one little-endian integer, whose 32-bit
    # words are the probes (as in :meth:`maybe_many`).

    def maybe(self, word: int) -> bool:
        bits, mask = self.bits, self.mask
        for shift in _SHIFTS:
            p = (word >> shift) & mask
            if not bits[p >> 3] >> (p & 7) & 1:
                return False
        return True

    def add(self, word: int) -> None:
        bits, mask = self.bits, self.mask
        for shift in _SHIFTS:
            p = (word >> shift) & mask
            bits[p >> 3] |= 1 << (p & 7)
        self.keys += 1

    # -- batches (numpy) ---------------------------------------------------------

    def view(self):
        import numpy as np

        if self._view is None:
            self._view = np.frombuffer(self.bits, dtype=np.uint8)
        return self._view

    def maybe_many(self, words):
        """Per row of ``words`` (n x PROBES uint32), whether the filter may hold it."""
        import numpy as np

        p = words & np.uint32(self.mask)
        return ((self.view()[p >> 3] >> (p & 7).astype(np.uint8)) & 1).all(axis=1)

    def add_many(self, words) -> None:
        import numpy as np

        p = (words & np.uint32(self.mask)).ravel()
        np.bitwise_or.at(self.view(), p >> 3, np.left_shift(1, p & 7).astype(np.uint8))
        self.keys += len(words)


class _Spill:
    """The digests, on disk in 256 buckets by first byte: each bucket's digests are
    gathered in memory and written in chunks to one temporary file (one descriptor,
    deleted when closed), the chunks' offsets kept per bucket."""

    def __init__(self, tmp_dir: str | None = None):
        self._file = tempfile.TemporaryFile(prefix="finalkeys-", dir=tmp_dir)
        self._fd = self._file.fileno()
        self._end = 0
        self._gathered = [bytearray() for _ in range(256)]
        self._chunks = [array("Q") for _ in range(256)]

    def add(self, d: bytes) -> None:
        bucket = self._gathered[d[0]]
        bucket += d
        if len(bucket) >= _CHUNK_BYTES:
            self._flush(d[0])

    def add_many(self, digests: list[bytes]) -> None:
        gathered = self._gathered
        for d in digests:
            gathered[d[0]] += d
        for first, bucket in enumerate(gathered):
            if len(bucket) >= _CHUNK_BYTES:
                self._flush(first)

    def _flush(self, first: int) -> None:
        """Write the bucket's full chunks (each read back whole by :meth:`holds`)."""
        bucket = self._gathered[first]
        while len(bucket) >= _CHUNK_BYTES:
            os.pwrite(self._fd, bucket[:_CHUNK_BYTES], self._end)
            self._chunks[first].append(self._end)
            self._end += _CHUNK_BYTES
            del bucket[:_CHUNK_BYTES]

    def holds(self, d: bytes) -> bool:
        """Whether ``d`` was added (read from disk: called on a filter's "maybe")."""
        first = d[0]
        if _aligned_in(self._gathered[first], d):
            return True
        return any(
            _aligned_in(os.pread(self._fd, _CHUNK_BYTES, at), d) for at in self._chunks[first]
        )

    def close(self) -> None:
        self._file.close()


def _aligned_in(data: bytes | bytearray, d: bytes) -> bool:
    """Whether ``d`` is one of the digests ``data`` holds end to end."""
    at = data.find(d)
    while at >= 0:
        if at % DIGEST_SIZE == 0:
            return True
        at = data.find(d, at + 1)
    return False


class FinalKeys:
    """A set of keys, exact, whose memory stays within a bound whatever its size."""

    def __init__(self, tmp_dir: str | None = None, first_stage_bytes: int = FIRST_STAGE_BYTES):
        self._tmp_dir = tmp_dir
        self._first = first_stage_bytes
        self._stages: list[_Stage] = []
        self._spill: _Spill | None = None
        self.count = 0

    def __len__(self) -> int:
        return self.count

    @property
    def filter_bytes(self) -> int:
        """The memory the Bloom filter holds (within :data:`MAX_BLOOM_BYTES`)."""
        return sum(len(stage.bits) for stage in self._stages)

    def __contains__(self, key: str) -> bool:
        d = digest(key)
        return self._holds(d, int.from_bytes(d, "little"))

    def add(self, key: str) -> None:
        self.first_sight(key)

    def first_sight(self, key: str) -> bool:
        """Whether ``key`` is new; it is held now."""
        d = digest(key)
        word = int.from_bytes(d, "little")
        if self._holds(d, word):
            return False
        self._stage_for(1).add(word)
        self._spill_add(d)
        return True

    def first_sights(self, keys: Iterable[str]) -> list[bool]:
        """:meth:`first_sight` of each of ``keys`` in order (one met twice in ``keys``
        is new the first time only)."""
        digested = digests(list(keys))
        first_at: dict[bytes, int] = {}
        for i, d in enumerate(digested):
            first_at.setdefault(d, i)
        new = [False] * len(digested)
        unique = list(first_at)
        if not unique:
            return new
        maybe = self._maybe_many(unique)
        fresh = [d for d, m in zip(unique, maybe, strict=True) if not (m and self._confirm(d))]
        if fresh:
            self._add_many(fresh)
            for d in fresh:
                new[first_at[d]] = True
        return new

    def close(self) -> None:
        """Let go of the memory and the temporary file (the set is empty again)."""
        if self._spill is not None:
            self._spill.close()
        self._spill = None
        self._stages = []
        self.count = 0

    # -- inside --------------------------------------------------------------------

    def _holds(self, d: bytes, word: int) -> bool:
        for stage in self._stages:
            if stage.maybe(word):
                return self._confirm(d)
        return False

    def _confirm(self, d: bytes) -> bool:
        return self._spill is not None and self._spill.holds(d)

    def _spill_add(self, d: bytes) -> None:
        if self._spill is None:
            self._spill = _Spill(self._tmp_dir)
        self._spill.add(d)
        self.count += 1

    def _stage_for(self, adding: int) -> _Stage:
        """The stage that takes ``adding`` keys: the last one, or a new one (twice its
        size, or more for a large batch) when it is full and the bound leaves room."""
        stages = self._stages
        if not stages:
            stages.append(_Stage(self._first))
        last = stages[-1]
        if last.keys + adding <= last.capacity:
            return last
        room = max(MAX_BLOOM_BYTES, self._first) - sum(len(s.bits) for s in stages)
        size = len(last.bits) * 2
        if size > room:
            return last  # at the bound: the last stage takes every key from now on
        while size * 8 // BITS_PER_KEY < adding and size * 2 <= room:
            size *= 2
        last = _Stage(size)
        stages.append(last)
        return last

    def _words(self, digests: list[bytes]):
        import numpy as np

        joined = b"".join(digests)
        return np.frombuffer(joined, dtype="<u4").reshape(-1, DIGEST_SIZE // 4)[:, :PROBES]

    def _maybe_many(self, digests: list[bytes]) -> list[bool]:
        if not self._stages:
            return [False] * len(digests)
        words = self._words(digests)
        maybe = self._stages[0].maybe_many(words)
        for stage in self._stages[1:]:
            maybe |= stage.maybe_many(words)
        return maybe.tolist()

    def _add_many(self, digests: list[bytes]) -> None:
        self._stage_for(len(digests)).add_many(self._words(digests))
        if self._spill is None:
            self._spill = _Spill(self._tmp_dir)
        self._spill.add_many(digests)
        self.count += len(digests)

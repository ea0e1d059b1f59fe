"""How messages cross from the crawl to the archive writer process, and back.

A message is a header (length of the pickled message, length of the body, where the
body is), the message pickled with the fetch's body left out, and the body. Bodies
go through :class:`BodyRing`, memory shared with the writer: one copy costs the crawl
much less than writing the body into a pipe does (page allocation and accounting in
the kernel; the history of docs/benchmarks.md). A body that does not fit in the
ring's free space follows its message in the pipe instead, so a slow writer fills the pipe and the crawl waits: the backpressure
that keeps memory bounded.

Ordering: a body is copied into the ring before its message is written to the pipe,
and the writer reads the body only after reading the message, so each side's system
call orders the memory accesses. The writer gives space back (``consumed``) only
after its next system call on the pipe, for the same reason.
"""

from __future__ import annotations

import dataclasses
import io
import mmap
import operator
import os
import pickle
import select
import struct

from crawler.storage.records import Fetch

# Header of a message: pickled message length, body length, body offset in the ring
# (a running total of the bytes placed in it; -1: the body follows in the pipe).
_FRAME = struct.Struct("!IQq")
INLINE = -1
# A fetch crosses as the tuple of its fields but the body: pickling a dataclass costs
# twice as much, and a copy of it without the body as much again.
FETCH_FIELDS = tuple(f.name for f in dataclasses.fields(Fetch) if f.name != "body")
_fetch_values = operator.attrgetter(*FETCH_FIELDS)


def readable(fd: int, timeout: float | None = 0.0) -> bool:
    """Whether ``fd`` has data (or its end) within ``timeout`` seconds."""
    return bool(select.select([fd], [], [], timeout)[0])


class BodyRing:
    """A ring of bodies in shared memory (a memfd both processes map).

    The crawl places bodies at a running offset (``head``) and never overwrites
    bytes the writer has not given back: the first 8 bytes of the mapping hold
    ``consumed``, the running offset up to which the writer is done, and only the
    writer writes them. A body is stored contiguously: one that would cross the end
    of the ring starts again at its beginning, and the skipped tail counts as used.
    """

    INLINE = INLINE
    _CONSUMED = struct.Struct("=Q")
    _DATA = 64  # the data starts on its own cache line

    def __init__(self, size: int, fd: int | None = None):
        self.size = size
        if fd is None:
            fd = os.memfd_create("archive-queue")  # close-on-exec: only the writer gets it
            os.ftruncate(fd, self._DATA + size)
        self.fd = fd
        self._map = mmap.mmap(fd, self._DATA + size)
        self._view = memoryview(self._map)
        self.head = 0  # crawl side: where the next body goes
        self._consumed = 0  # crawl side: the last value read from the writer
        self._done = 0  # writer side: consumed, not yet published

    @classmethod
    def create(cls, size: int) -> BodyRing | None:
        """A ring of ``size`` bytes, or None where memfd is unavailable."""
        if size < 1 or not hasattr(os, "memfd_create"):
            return None
        try:
            return cls(size)
        except OSError:
            return None

    # -- the crawl's side ------------------------------------------------------------

    def place(self, body: bytes) -> int:
        """Copy ``body`` in and return its offset, or -1 when there is no room."""
        n = len(body)
        if not n or n > self.size // 2:
            return INLINE
        pos = self.head % self.size
        start = self.head if pos + n <= self.size else self.head + self.size - pos
        if start + n - self._consumed > self.size:
            (self._consumed,) = self._CONSUMED.unpack_from(self._map, 0)
            if start + n - self._consumed > self.size:
                return INLINE
        at = self._DATA + start % self.size
        self._view[at : at + n] = body
        self.head = start + n
        return start

    # -- the writer's side -----------------------------------------------------------

    def take(self, offset: int, length: int) -> bytes:
        """A copy of the body at ``offset``; its space is given back at the next publish."""
        at = self._DATA + offset % self.size
        body = self._view[at : at + length].tobytes()
        self._done = offset + length
        return body

    def publish(self) -> None:
        """Give back the space of the bodies taken (call after a system call)."""
        self._CONSUMED.pack_into(self._map, 0, self._done)

    def close(self) -> None:
        self._view.release()
        self._map.close()
        os.close(self.fd)


def send_frame(fd: int, msg: tuple, ring: BodyRing | None = None) -> None:
    """Write one message; a ``put`` or ``touch`` carries its fetch's body."""
    body = b""
    offset = INLINE
    if msg[0] in ("put", "touch"):
        body = msg[1].body
        msg = (msg[0], _fetch_values(msg[1]), *msg[2:])
        if ring is not None:
            offset = ring.place(body)
    meta = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    parts = [_FRAME.pack(len(meta), len(body), offset), meta]
    if offset == INLINE:
        parts.append(body)
    total = sum(map(len, parts))
    sent = os.writev(fd, parts)
    if sent < total:
        # A signal cut a large write short: send the rest.
        rest = memoryview(b"".join(parts))[sent:]
        while rest:
            rest = rest[os.write(fd, rest) :]


class FrameReader:
    """Reads the messages :func:`send_frame` writes; a message cut short is an EOFError.

    With ``read_ahead``, each read asks for at least that many bytes, so that one
    system call brings several small messages (the writer's side: a stored page is
    two of them); without it, nothing past the message is read, so that ``readable``
    on the descriptor stays true while a message waits (the crawl's side, replies).
    A read ahead small enough for its messages' bodies to fit in the ring keeps the
    ring flowing: space taken is given back after each read.
    """

    def __init__(self, fd: int, ring: BodyRing | None = None, read_ahead: int = 0):
        self.fd = fd
        self.ring = ring
        self.read_ahead = read_ahead
        self._file = io.FileIO(fd, "rb", closefd=False)
        self._buf = bytearray()
        self._pos = 0

    @property
    def buffered(self) -> bool:
        """Whether bytes read ahead wait here (``readable`` cannot see them)."""
        return self._pos < len(self._buf)

    def _fill(self, need: int) -> None:
        """Read until ``need`` bytes wait past the read position."""
        while len(self._buf) - self._pos < need:
            if self._pos:
                del self._buf[: self._pos]
                self._pos = 0
            chunk = self._file.read(max(self.read_ahead, need - len(self._buf)))
            if not chunk:
                raise EOFError
            self._buf += chunk
            if self.ring is not None:
                self.ring.publish()  # a system call has passed since the last take

    def _take(self, n: int) -> memoryview:
        """The next ``n`` bytes, valid until the next read."""
        self._fill(n)
        start = self._pos
        self._pos += n
        return memoryview(self._buf)[start : self._pos]

    def _body(self, n: int) -> bytearray:
        """An inline body: what was read ahead of it, the rest read straight into it."""
        body = bytearray(n)
        have = min(len(self._buf) - self._pos, n)
        body[:have] = self._buf[self._pos : self._pos + have]
        self._pos += have
        view = memoryview(body)[have:]
        while view:
            got = self._file.readinto(view)
            if not got:
                raise EOFError
            view = view[got:]
        return body

    def recv(self) -> tuple:
        with self._take(_FRAME.size) as head:
            meta_len, body_len, offset = _FRAME.unpack(head)
        with self._take(meta_len) as meta:
            msg = pickle.loads(meta)
        body = b""
        if offset != INLINE:
            body = self.ring.take(offset, body_len)
        elif body_len:
            body = self._body(body_len)
        if msg[0] in ("put", "touch"):
            fetch = Fetch(**dict(zip(FETCH_FIELDS, msg[1], strict=True)), body=body)
            msg = (msg[0], fetch, *msg[2:])
        return msg

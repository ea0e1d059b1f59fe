"""What every archive format shares: the rolling file and its ``.writing`` marker, gzip
members, the record of a repair, and :class:`ArchiveFormat`, the interface the registry
holds."""

from __future__ import annotations

import io
import os
import shutil
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from isal import isal_zlib

from crawler.storage.errors import ArchiveError, TruncatedRecordError
from crawler.storage.records import Fetch, Indexed, Row, StoredRecord

# A file keeps one name from its first byte to its last, so that a catalog row names an
# existing file at every instant; an empty ``<name>.writing`` beside it says it is still
# being written (or was, by a killed run). Before the marker existed, such a file was
# named ``<name>.open``: recovery still repairs and renames those.
WRITING_SUFFIX = ".writing"
OPEN_SUFFIX = ".open"
_READ_CHUNK = 1 << 20

COMPRESSORS = {"isal": isal_zlib, "zlib": zlib}


def gzip_member(data: bytes | list, level: int, compressor: str = "isal") -> bytes:
    """One complete gzip member holding ``data`` (bytes, or a list of parts).

    ISA-L at level 1 compresses as small as zlib at level 1 at several times the speed
    (docs/reference/data-directory.md), which is what lets one writer keep up with a
    crawl. Readers need nothing special: the output is plain gzip.
    """
    # One call on the joined parts: a compressor object per member costs more than
    # the copy (a third of a small record's compression time).
    if isinstance(data, list):
        data = b"".join(data)
    return COMPRESSORS[compressor].compress(data, level, 31)


def iter_members(f, start: int = 0) -> Iterator[tuple[int, int, bytes]]:
    """Yield ``(offset, length, uncompressed bytes)`` of each gzip member of ``f``.

    Raises :class:`TruncatedRecordError` at a member the file ends inside, and
    :class:`ArchiveError` at one that does not decompress; both carry the offset.
    """
    f.seek(start)
    pos = start
    buf = f.read(_READ_CHUNK)
    while buf:
        member_start = pos
        inflater = zlib.decompressobj(31)
        out = []
        while True:
            try:
                out.append(inflater.decompress(buf))
            except zlib.error as exc:
                raise ArchiveError(f"offset {member_start}: corrupt gzip member ({exc})") from exc
            if inflater.eof:
                rest = inflater.unused_data
                pos += len(buf) - len(rest)
                buf = rest or f.read(_READ_CHUNK)
                break
            pos += len(buf)
            buf = f.read(_READ_CHUNK)
            if not buf:
                raise TruncatedRecordError(f"offset {member_start}: file ends inside a record")
        yield member_start, pos - member_start, b"".join(out)


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_range(path: str | os.PathLike, offset: int, length: int, what: str = "record") -> bytes:
    """The ``length`` bytes at ``offset``; a file that ends before is a truncated record."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    if len(data) < length:
        raise TruncatedRecordError(f"{path}: offset {offset}: file ends inside the {what}")
    return data


def writing_marker(path: str | os.PathLike) -> Path:
    """The marker that says ``path`` is still being written."""
    path = Path(path)
    return path.with_name(path.name + WRITING_SUFFIX)


class RollingFile:
    """A file written as ``<dir>/<prefix>-<time>-<pid>-<seq><suffix>``.

    Its marker (:func:`writing_marker`) is made before its first byte and removed by
    :meth:`close` (after a flush and fsync), and a writer starts a new one once
    :meth:`needs_rollover` says so. Subclasses write the
    records; ``_started`` and ``_finishing`` are their hooks at either end of a file.
    """

    suffix = ""

    def __init__(
        self,
        directory: str | os.PathLike,
        data_dir: str | os.PathLike,
        prefix: str = "crawl",
        rollover_bytes: int = 1_000_000_000,
        rollover_seconds: float = 0.0,
    ):
        self.directory = Path(directory)
        self.data_dir = Path(data_dir)
        self.prefix = prefix
        self.rollover_bytes = rollover_bytes
        # A file also rolls over this long after it was opened (0: by size only), so
        # that closed files can be shipped while a slow crawl runs.
        self.rollover_seconds = rollover_seconds
        self.directory.mkdir(parents=True, exist_ok=True)
        self._file: io.BufferedWriter | None = None
        self._seq = 0
        self.name = ""
        self._relpath = (None, "")
        self.size = 0
        self.closed_files: list[Path] = []
        self.records_written = 0

    @property
    def path(self) -> Path:
        """The file's one name, while written and once closed."""
        return self.directory / self.name

    @property
    def relpath(self) -> str:
        # Asked for every record: computed once per file name.
        if self._relpath[0] != self.name:
            self._relpath = (self.name, os.path.relpath(self.path, self.data_dir))
        return self._relpath[1]

    def _open(self) -> None:
        stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime())
        while True:
            # Another writer of this process may have used the name within the second.
            self._seq += 1
            self.name = f"{self.prefix}-{stamp}-{os.getpid()}-{self._seq:05d}{self.suffix}"
            if not self.path.exists() and not writing_marker(self.path).exists():
                break
        writing_marker(self.path).touch(exist_ok=False)
        fsync_dir(self.directory)  # the marker is on disk before any row names the file
        self._file = open(self.path, "xb")
        self.size = 0
        self._opened_at = time.monotonic()
        self._started()

    def _write(self, data: bytes) -> int:
        """Append ``data`` to the open file (opening one if needed); returns its offset."""
        if self._file is None:
            self._open()
        offset = self.size
        self._file.write(data)
        self.size += len(data)
        return offset

    def _started(self) -> None:
        """Called when a new file is open."""

    def _finishing(self) -> None:
        """Called before a file is flushed, closed and renamed."""

    def flush(self, fsync: bool = True) -> None:
        if self._file is not None:
            self._file.flush()
            if fsync:
                os.fsync(self._file.fileno())

    def needs_rollover(self) -> bool:
        if self._file is None:
            return False
        return self.size >= self.rollover_bytes or (
            self.rollover_seconds > 0
            and time.monotonic() - self._opened_at >= self.rollover_seconds
        )

    def close(self) -> Path | None:
        """Finish, flush and fsync the file, then remove its ``.writing`` marker."""
        if self._file is None:
            return None
        self._finishing()
        self.flush(fsync=True)
        self._file.close()
        self._file = None
        writing_marker(self.path).unlink()
        fsync_dir(self.directory)
        self.closed_files.append(self.path)
        return self.path

    def abandon(self) -> None:
        """Drop the open file as a kill leaves it, for crash tests: the bytes written so
        far reach the file, which keeps its ``.writing`` marker and stays unfinished."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _open_either(path: str | os.PathLike):
    """``path``, or the same file under its other name: a file being written is
    renamed from its legacy ``.open`` name when it closes, maybe since it was looked up."""
    path = os.fspath(path)
    try:
        return open(path, "rb")
    except FileNotFoundError:
        other = path.removesuffix(OPEN_SUFFIX) if path.endswith(OPEN_SUFFIX) else path + OPEN_SUFFIX
        return open(other, "rb")


@dataclass
class Repair:
    """What closing a file left open by a killed run did."""

    path: Path
    records: int
    cut_bytes: int
    cut_file: Path | None
    indexed: Indexed


def closed_name(path: Path) -> Path:
    """The name a file being written keeps (a legacy ``.open`` name loses its suffix)."""
    return path.with_name(path.name.removesuffix(OPEN_SUFFIX))


def save_tail(f, start: int, closed: Path) -> Path:
    """Copy what follows ``start`` in ``f`` beside the file as ``<name>.cut-<time>``."""
    cut_file = closed.with_name(f"{closed.name}.cut-{time.strftime('%Y%m%d%H%M%S')}")
    f.seek(start)
    with open(cut_file, "wb") as dst:
        shutil.copyfileobj(f, dst, _READ_CHUNK)
        dst.flush()
        os.fsync(dst.fileno())
    return cut_file


def finish_repair(path: Path, closed: Path) -> None:
    """Mark a repaired file closed, durably (a legacy ``.open`` one is renamed)."""
    if path != closed:
        os.rename(path, closed)
    writing_marker(closed).unlink(missing_ok=True)
    fsync_dir(closed.parent)


@dataclass
class Scan:
    """What archives hold, and the places they could not be read: ``cut``, the files
    that end inside a record (a repair cuts the partial tail off); ``unresolved``, the
    revisits whose original record is in a file missing or cut short (their rows are
    left out of ``indexed``: no reader could resolve them)."""

    indexed: Indexed = field(default_factory=Indexed)
    problems: list[str] = field(default_factory=list)
    records: int = 0
    cut: list[Path] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)


class ArchiveFormat:
    """One archive format: writer, reader, indexer, repair, and which files are its.

    An instance of a subclass is registered in :mod:`crawler.storage.formats`;
    nothing else in the project asks which format it holds.
    """

    name = ""
    suffix = ""  # of a closed file, e.g. ".warc.gz"
    what = "record"  # what a stored answer is called in messages
    # Whether it can keep a browser's rendered DOM beside the server's answer.
    keeps_rendered = False

    @property
    def glob(self) -> str:
        """The closed files of this format, as a glob of ``archive/``."""
        return f"*{self.suffix}"

    @property
    def open_glob(self) -> str:
        """Files of this format left with a legacy ``.open`` name."""
        return f"*{self.suffix}{OPEN_SUFFIX}"

    @property
    def writing_glob(self) -> str:
        """The markers of this format's files being written."""
        return f"*{self.suffix}{WRITING_SUFFIX}"

    def holds(self, path: str | os.PathLike, end: int, last_offset: int) -> bool:
        """Whether the file ``path`` can hold the records rows point at, the furthest
        ending at byte ``end`` (``offset + length``), the last starting at
        ``last_offset``; False when it is missing or cut short."""
        try:
            return os.path.getsize(path) >= end
        except OSError:
            return False

    def owns(self, path: str | os.PathLike) -> bool:
        """Whether ``path`` (or its legacy ``.open`` name) is a file of this format."""
        return os.fspath(path).removesuffix(OPEN_SUFFIX).endswith(self.suffix)

    def writer(
        self,
        directory: Path,
        data_dir: Path,
        *,
        prefix: str,
        rollover_bytes: int,
        rollover_seconds: float,
        gzip_level: int,
        compressor: str,
    ) -> ArchiveWriter:
        raise NotImplementedError

    def options(self, settings) -> dict:
        """The writer's own settings, read from Scrapy ``settings`` (a bad value raises
        :class:`SettingError` naming it); passed to :meth:`writer` as keywords."""
        return {}

    def decode(self, data: bytes, path: str | os.PathLike, offset: int) -> StoredRecord:
        """The stored answer in ``data``, the bytes of one record read at ``offset``."""
        raise NotImplementedError

    def read(self, path: str | os.PathLike, offset: int, length: int) -> StoredRecord:
        """The stored answer at ``offset`` of ``path`` (what a catalog row points at)."""
        return self.decode(read_range(path, offset, length, self.what), path, offset)

    def read_span(
        self, path: str | os.PathLike, spans: list[tuple[int, int]]
    ) -> list[StoredRecord | ArchiveError]:
        """The stored answers at ``(offset, length)`` spans of one file, sorted by offset,
        read with one read; a record that does not decode is its error in the list, a
        file that cannot be read raises OSError."""
        return list(self.iter_span(path, spans))

    def iter_span(
        self, path: str | os.PathLike, spans: list[tuple[int, int]]
    ) -> Iterator[StoredRecord | ArchiveError]:
        """As :meth:`read_span`, each record decoded only when asked for: the file is
        read (OSError raised) now, each body inflated just before its page is parsed,
        while it is in the CPU's caches. Holding a task's 200 inflated bodies at once
        took fresh memory for every task (the history of docs/benchmarks.md)."""
        start, end = spans[0][0], spans[-1][0] + spans[-1][1]
        with _open_either(path) as f:
            f.seek(start)
            data = f.read(end - start)
        return self._decode_span(data, start, path, spans)

    def _decode_span(
        self, data: bytes, start: int, path: str | os.PathLike, spans: list[tuple[int, int]]
    ) -> Iterator[StoredRecord | ArchiveError]:
        for offset, length in spans:
            chunk = data[offset - start : offset - start + length]
            try:
                if len(chunk) < length:
                    raise TruncatedRecordError(
                        f"{path}: offset {offset}: file ends inside the {self.what}"
                    )
                record: StoredRecord | ArchiveError = self.decode(chunk, path, offset)
            except ArchiveError as exc:
                record = exc
            yield record

    def index(self, path: Path, data_dir: Path, relpath: str | None = None) -> Indexed:
        """Every complete record of a file as catalog rows (an error at a bad one)."""
        raise NotImplementedError

    def scan(self, path: Path, relpath: str, scan: Scan) -> None:
        """Index what can be read into ``scan``; a bad place is a problem, not an error."""
        raise NotImplementedError

    def repair(self, path: Path, data_dir: Path) -> Repair:
        """Close a file a killed run was writing: cut a partial tail, keep the rest."""
        raise NotImplementedError


class ArchiveWriter(RollingFile):
    """What a format's writer provides (the store calls nothing else)."""

    def write_fetch(self, fetch: Fetch, digest: str | None = None) -> Row:
        """Store a fetch; returns its catalog row. ``digest``: ``fetch.body``'s payload
        digest, when the store computed it already."""
        raise NotImplementedError

    def write_revisit(self, fetch: Fetch, refers_to_date: str | None = None) -> None:
        """Store a 304: the stored body is still current."""
        raise NotImplementedError

    def write_unchanged(self, fetch: Fetch, original: Row) -> Row:
        """Store a fetch whose payload ``original``'s record holds already (its digest
        is ``original.payload_digest``) as a revisit that refers to it; returns the
        fetch's row, pointing at ``original``'s record."""
        raise NotImplementedError

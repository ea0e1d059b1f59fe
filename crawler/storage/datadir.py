"""The layout of a data directory (``DATA_DIR``), and its lock.

::

    metadata.db          catalog
    .lock                held by the one crawl writing here, and by its writer process
    archive/             archive files, of every format; a file being written has an empty
                         <name>.writing beside it (its name never changes)
    fetch_log.jsonl      action log
    derived/             outputs made from the stored records
    catalogs/            catalogs shipped here by Slurm tasks (each with its action log)

Nothing else in the project spells these names out: ask a :class:`DataDir`.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
from pathlib import Path

from crawler.storage import formats
from crawler.storage.errors import StoreError
from crawler.storage.formats.base import ArchiveFormat, writing_marker
from crawler.storage.records import Row, StoredRecord, as_row_answer

DEFAULT = "data"
CATALOG_NAME = "metadata.db"
ACTION_LOG_NAME = "fetch_log.jsonl"
RUNS_NAME = "runs.jsonl"
SHIPPED_DIR = "catalogs"

logger = logging.getLogger(__name__)


class DataDir:
    """Every path and archive glob of one data directory, and its lock."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    @classmethod
    def from_settings(cls, settings) -> DataDir:
        """The data directory the ``DATA_DIR`` setting names (Scrapy settings, or a dict)."""
        return cls(settings.get("DATA_DIR") or DEFAULT)

    @classmethod
    def of_catalog(cls, catalog: str | os.PathLike) -> DataDir:
        """The data directory a catalog's ``archive`` paths are relative to: the folder
        holding it, or for a catalog shipped under ``catalogs/``, the one above."""
        parent = Path(catalog).resolve().parent
        return cls(parent.parent if parent.name == SHIPPED_DIR else parent)

    def __repr__(self) -> str:
        return f"DataDir({str(self.root)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, DataDir) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    # -- paths ----------------------------------------------------------------------

    @property
    def catalog_path(self) -> Path:
        return self.root / CATALOG_NAME

    @property
    def lock_path(self) -> Path:
        return self.root / ".lock"

    @property
    def archive_dir(self) -> Path:
        return self.root / "archive"

    @property
    def action_log_path(self) -> Path:
        return self.root / ACTION_LOG_NAME

    @property
    def runs_path(self) -> Path:
        """One line per crawl that stored here: what it ran with."""
        return self.root / RUNS_NAME

    @property
    def derived_dir(self) -> Path:
        return self.root / "derived"

    @property
    def shipped_dir(self) -> Path:
        """Where Slurm tasks ship their catalogs and action logs."""
        return self.root / SHIPPED_DIR

    def shipped_catalog(self, name: str) -> Path:
        return self.shipped_dir / f"{name}.db"

    def shipped_action_log(self, name: str) -> Path:
        return self.shipped_dir / f"{name}.{ACTION_LOG_NAME}"

    def shipped_catalogs(self) -> list[Path]:
        return sorted(self.shipped_dir.glob("*.db"))

    def shipped_names(self) -> list[str]:
        """The tasks that shipped a catalog or an action log here, sorted."""
        names = {p.stem for p in self.shipped_catalogs()}
        suffix = "." + ACTION_LOG_NAME
        names |= {p.name[: -len(suffix)] for p in self.shipped_dir.glob("*" + suffix)}
        return sorted(names)

    def seen_patterns(self) -> list[str]:
        """``CATALOG_SEEN`` globs of every catalog stored here (the merged one, shipped ones)."""
        return [str(self.catalog_path), str(self.shipped_dir / "*.db")]

    # -- archive files --------------------------------------------------------------

    def archives(self, fmt: ArchiveFormat | None = None) -> list[Path]:
        """The closed archive files (of ``fmt``, or of every format), oldest name first."""
        chosen = [fmt] if fmt is not None else formats.FORMATS.values()
        return sorted(
            p
            for f in chosen
            for p in self.archive_dir.glob(f.glob)
            if not writing_marker(p).exists()
        )

    def open_archives(self) -> list[Path]:
        """Archive files being written, or left unfinished by a killed run: those with
        a ``.writing`` marker, and those with a legacy ``.open`` name."""
        found = []
        for f in formats.FORMATS.values():
            found += [m.with_suffix("") for m in self.archive_dir.glob(f.writing_glob)]
            found += self.archive_dir.glob(f.open_glob)
        return sorted(p for p in found if p.exists())

    def stale_markers(self) -> list[Path]:
        """``.writing`` markers of files that were never created (killed in between)."""
        return sorted(
            m
            for f in formats.FORMATS.values()
            for m in self.archive_dir.glob(f.writing_glob)
            if not m.with_suffix("").exists()
        )

    def archive_bytes(self) -> tuple[int, int]:
        """Bytes of every archive file (open and cut-off tails included), and the
        number of closed files."""
        files = {p for f in formats.FORMATS.values() for p in self.archive_dir.glob(f.glob + "*")}
        return sum(p.stat().st_size for p in files), len(self.archives())

    def relpath(self, path: str | os.PathLike) -> str:
        """``path`` as catalog rows name it (relative to the data directory)."""
        return os.path.relpath(path, self.root)

    def resolve(self, relpath: str) -> Path:
        """The file a catalog row names (being written or closed: one name). A row of
        another data directory's catalog (``CATALOG_SEEN``) names it absolutely."""
        return self.root / relpath

    def read(self, row: Row) -> StoredRecord:
        """The stored answer a catalog row points at; raises ArchiveError, OSError, or
        ValueError (a file of no known format)."""
        path = self.resolve(row.archive)
        return as_row_answer(formats.for_path(path).read(path, row.offset, row.length), row)

    # -- the lock -------------------------------------------------------------------

    def unusable(
        self, write: bool = False, need_catalog: bool = True, check_catalog: bool = True
    ) -> str | None:
        """Why a command cannot read this data directory (or write it: ``write``), in
        one line naming it and what to do; None when it can. Checked before any work,
        so that a command fails at once, and never creates a misspelled directory.
        ``need_catalog`` False: a directory without a catalog yet will do; ``check_catalog``
        False: the command reads the archives only."""
        root = self.root
        fix = "give the data directory with -s DATA_DIR=..."
        if not root.exists():
            return f"DATA_DIR {root} does not exist: check its spelling, or {fix}"
        if not root.is_dir():
            return f"DATA_DIR {root} is a file, not a directory: {fix}"
        if write and not os.access(root, os.W_OK | os.X_OK):
            return (
                f"DATA_DIR {root} is read-only: this command writes there; copy it to a "
                f"writable place, or {fix}"
            )
        if not check_catalog:
            return None
        catalog = self.catalog_path
        if not catalog.exists() and not need_catalog:
            return None
        if not catalog.is_file():
            return f"{catalog}: no catalog in this data directory (run a crawl first, or {fix})"
        try:
            with open(catalog, "rb") as f:
                header = f.read(16)
        except OSError as exc:
            return f"{catalog}: cannot read it ({exc.strerror}): {fix}"
        if header != b"SQLite format 3\x00":
            return (
                f"{catalog} is not a SQLite database: restore it, or rebuild it from the "
                "archives with `scrapy catalog rebuild`"
            )
        return None

    def missing_archives(self, names: list[str]) -> list[str]:
        """Those of ``names`` (archive paths a catalog's rows hold) not in this directory."""
        return [name for name in names if not (self.root / name).exists()]

    def unreadable_archives(self, extents: list[tuple[str, int, int, int]]) -> list[str]:
        """Of the archive files a catalog's rows name (``Catalog.archive_extents``), each
        that is missing or cut short of its rows' records, as ``"NAME (N rows: why)"``."""
        found = []
        for name, rows, end, last_offset in extents:
            path = self.resolve(name)
            if not path.exists():
                found.append(f"{name} ({rows:,} rows: missing)")
                continue
            try:
                fmt = formats.for_path(path)
            except ValueError:
                continue  # a file of no known format: its rows' readers say so
            if not fmt.holds(path, end, last_offset):
                found.append(f"{name} ({rows:,} rows: cut short of their records)")
        return found

    def lock(self) -> DataDirLock:
        return DataDirLock(self.lock_path)

    def is_free(self) -> bool:
        """Whether no crawl, and no writer of one, holds the data directory right now."""
        lock = self.lock()
        try:
            lock.acquire(wait_for_writer=False)
        except StoreError:
            return False
        lock.release()
        return True


class DataDirLock:
    """An exclusive lock on a data directory: one crawl writes it at a time.

    Held through an open file (``flock``), so that it goes with the process that
    holds it, however that process ends. The crawl's writer process holds a second
    lock on the same file (a POSIX record lock, independent of ``flock``) for as long
    as it lives: a crawl killed alone leaves its writer finishing its queue, and the
    next run waits for that writer to exit before it repairs anything.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self, wait_for_writer: bool = True) -> None:
        """Take the lock; raises StoreError when another crawl holds it, or (without
        ``wait_for_writer``) when the writer of a previous run is still alive."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            os.close(fd)
            raise StoreError(
                f"{self.path.parent} is in use by another crawl (pid {holder or '?'}); "
                "wait for it or use another DATA_DIR"
            ) from None
        try:
            self._wait_for_writer(fd, wait_for_writer)
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def _wait_for_writer(self, fd: int, wait: bool) -> None:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pid = writer_holding(fd)
            if not wait:
                raise StoreError(
                    f"{self.path.parent} is still being written by the archive writer of "
                    f"a previous crawl (pid {pid}); wait for it to exit"
                ) from None
            logger.warning(
                "Waiting for the archive writer of a previous crawl (pid %s) to finish "
                "writing %s before touching it (it exits once its queue is stored)",
                pid,
                self.path.parent,
            )
            fcntl.lockf(fd, fcntl.LOCK_EX)
            logger.warning("The archive writer of the previous crawl is gone: resuming")
        fcntl.lockf(fd, fcntl.LOCK_UN)

    def hold_for_writer(self) -> None:
        """Hold the writer's lock until this process exits (the writer process calls
        it when it opens the store); raises StoreError when another writer holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pid = writer_holding(fd)
            os.close(fd)
            raise StoreError(
                f"another archive writer (pid {pid}) is writing {self.path.parent}"
            ) from None
        self._fd = fd  # never closed: closing any descriptor of the file drops the lock

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DataDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


_FLOCK = "hhqqi4x"  # struct flock on Linux: type, whence, start, len, pid


def writer_holding(fd: int) -> int | str:
    """The pid holding a POSIX lock on ``fd``'s file ('?' when it cannot be told)."""
    try:
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(_FLOCK, fcntl.F_WRLCK, 0, 0, 0, 0))
        kind, _, _, _, pid = struct.unpack(_FLOCK, answer)
    except (OSError, struct.error):
        return "?"
    return pid if kind != fcntl.F_UNLCK else "?"

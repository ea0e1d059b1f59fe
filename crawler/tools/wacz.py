"""``scrapy catalog index`` (a sorted CDXJ of the WARCs, for pywb) and ``wacz``
(WARCs, index and pages packaged for replayweb.page; archives of another format are
converted to WARC records in the package)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from crawler.storage import formats
from crawler.storage.datadir import DataDir
from crawler.storage.errors import ArchiveError
from crawler.storage.formats.warc import WarcWriter
from crawler.storage.records import Fetch, Row, as_row_answer, header
from crawler.tools.scan import ToolError, open_catalog
from crawler.tools.tmpfiles import temp_path

WACZ_VERSION = "1.1.1"


def warc_paths(data_dir: Path) -> list[Path]:
    """The closed WARC files of a data directory (CDXJ and WACZ hold WARCs only)."""
    return DataDir(data_dir).archives(formats.get("warc"))


def other_archives(data_dir: Path) -> list[Path]:
    """The closed archive files of formats other than WARC (zip, sqlite)."""
    warc = formats.get("warc")
    return [p for p in DataDir(data_dir).archives() if formats.for_path(p) is not warc]


def _fetch(row: Row, stored) -> Fetch:
    fetched_at = datetime.fromisoformat(row.fetched_at.replace("Z", "+00:00")).timestamp()
    return Fetch(
        key=row.key,
        url=row.url,
        final_url=row.final_url,
        method=row.method,
        request_headers=[],
        request_body=b"",
        status=stored.status,
        response_headers=stored.headers,
        body=stored.body,
        fetched_at=fetched_at,
    )


def convert_to_warc(path: Path, data_dir: Path, directory: Path) -> Path | None:
    """The responses of an archive file of another format as ``<name>.warc.gz`` in
    ``directory``, each a WARC ``response`` record (and its ``request``), as the crawl
    would have written them with ``ARCHIVE_FORMAT=warc``; a revisit of a stored payload
    as a ``revisit`` record referring to the (converted) record that holds it."""
    fmt = formats.for_path(path)
    relpath = os.path.relpath(path, data_dir)
    indexed = fmt.index(path, data_dir, relpath).rows
    rows = [row for row in indexed if row.archive == relpath]
    writer = WarcWriter(directory, directory, prefix="convert", rollover_bytes=1 << 62)
    spans = [(row.offset, row.length) for row in rows]
    for row, stored in zip(rows, fmt.read_span(path, spans) if spans else [], strict=True):
        if isinstance(stored, ArchiveError):
            raise ToolError(f"cannot convert {path} to WARC: {stored}")
        writer.write_fetch(_fetch(row, stored))
    datadir = DataDir(data_dir)
    for row in indexed:
        if row.archive != relpath:
            writer.write_unchanged(*_revisit(datadir, row, path))
    written = writer.close()
    if written is None:  # a file of 304 revisits alone: nothing to replay
        return None
    target = directory / f"{path.name}.warc.gz"
    os.replace(written, target)
    return target


def _revisit(datadir: DataDir, row: Row, path: Path) -> tuple[Fetch, Row]:
    """A revisit in ``path`` as the fetch it stands for and the row of the record
    holding its payload (its URL and date as that record states them)."""
    try:
        where = datadir.resolve(row.archive)
        original = formats.for_path(where).read(where, row.offset, row.length)
    except (ArchiveError, OSError, ValueError) as exc:
        raise ToolError(f"cannot convert {path} to WARC: a revisit's payload: {exc}") from exc
    date = header(original.warc_headers, "WARC-Date") or row.fetched_at
    fetch = _fetch(row, as_row_answer(original, row))
    return fetch, replace(row, final_url=original.url, fetched_at=date)


def write_cdxj(paths: list[Path], out, compress=None, idx_name: str | None = None) -> None:
    """Sorted CDXJ of WARC files, as ``cdxj-indexer --sort`` writes it.

    With ``compress`` (a binary file), the lines go there as gzip blocks and ``out``
    receives the ZipNum ``.idx`` (as in a WACZ).
    """
    from cdxj_indexer.main import CDXJIndexer

    if not paths:
        raise ToolError("no closed WARC files to index under archive/")
    opts = {"sort": True}
    if compress is not None:
        opts.update(compress=compress, data_out_name=idx_name, lines=300)
    CDXJIndexer(out, [str(p) for p in paths], **opts).process_all()


def write_index(data_dir: Path, output: Path) -> int:
    """``index``: a sorted CDXJ of every closed WARC, for pywb and other replay tools."""
    paths = warc_paths(data_dir)
    if not paths:
        raise ToolError(f"no closed WARC files to index under {DataDir(data_dir).archive_dir}")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(output)
    with open(tmp, "w", encoding="utf-8") as f:
        write_cdxj(paths, f)
    os.replace(tmp, output)
    with open(output, "rb") as f:
        return sum(1 for _ in f)


class _HashingWriter(io.RawIOBase):
    def __init__(self, dest):
        self.dest = dest
        self.hash = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.dest.write(data)
        self.hash.update(data)
        self.size += len(data)
        return len(data)


class WaczBuilder:
    """Packages the WARCs, a CDXJ index and a pages list as a WACZ, by streaming.

    Every file is copied into the zip (stored, not deflated, as WACZ asks) in 1 MiB
    pieces while its SHA-256 is computed; the index is built in a temporary directory.
    """

    def __init__(self, data_dir: Path, output: Path, title: str | None = None):
        self.data_dir = Path(data_dir)
        self.output = Path(output)
        self.title = title
        self.resources: list[dict] = []

    def _add_stream(self, zf: zipfile.ZipFile, name: str, src) -> None:
        info = zipfile.ZipInfo(name, datetime.now(UTC).timetuple()[:6])
        info.compress_type = zipfile.ZIP_STORED
        with zf.open(info, "w", force_zip64=True) as dest:
            writer = _HashingWriter(dest)
            while chunk := src.read(1 << 20):
                writer.write(chunk)
        self.resources.append(
            {
                "name": os.path.basename(name).lower(),
                "path": name,
                "hash": "sha256:" + writer.hash.hexdigest(),
                "bytes": writer.size,
            }
        )

    def _add_file(self, zf: zipfile.ZipFile, name: str, path: Path) -> None:
        with open(path, "rb") as src:
            self._add_stream(zf, name, src)

    def pages(self, out, warc_names: set[str]) -> int:
        out.write(json.dumps({"format": "json-pages-1.0", "id": "pages", "title": "All Pages"}))
        out.write("\n")
        n = 0
        # A page reached by several listed URLs (a redirect and the page itself) is
        # one page: listed once, at its first fetch.
        listed: set[bytes] = set()
        with open_catalog(self.data_dir) as catalog:
            for row in catalog.rows(
                "status = 200 AND content_type LIKE 'text/html%' ORDER BY fetched_at"
            ):
                if os.path.basename(row.archive) not in warc_names:
                    continue
                seen = hashlib.blake2b(row.final_url.encode(), digest_size=16).digest()
                if seen in listed:
                    continue
                listed.add(seen)
                ts = row.fetched_at[:19] + "Z"
                out.write(json.dumps({"id": row.key[:32], "url": row.final_url, "ts": ts}))
                out.write("\n")
                n += 1
        return n

    def run(self) -> Path:
        others = other_archives(self.data_dir)
        paths = warc_paths(self.data_dir)
        if not paths and not others:
            raise ToolError(f"no closed archive files under {DataDir(self.data_dir).archive_dir}")
        self._check_archives()
        self.output.parent.mkdir(parents=True, exist_ok=True)
        tmp_out = temp_path(self.output)
        self.resources = []
        try:
            with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(tmp_out, "w") as zf:
                tmpdir = Path(tmp)
                converted = tmpdir / "converted"
                converted.mkdir()
                names = {p.name for p in paths} | {p.name for p in others}
                for other in others:
                    if (warc := convert_to_warc(other, self.data_dir, converted)) is not None:
                        paths.append(warc)
                for path in paths:
                    self._add_file(zf, f"archive/{path.name}", path)
                with (
                    open(tmpdir / "index.idx", "w", encoding="utf-8") as idx,
                    open(tmpdir / "index.cdx.gz", "wb") as data,
                ):
                    write_cdxj(paths, idx, compress=data, idx_name="index.cdx.gz")
                self._add_file(zf, "indexes/index.cdx.gz", tmpdir / "index.cdx.gz")
                self._add_file(zf, "indexes/index.idx", tmpdir / "index.idx")
                with open(tmpdir / "pages.jsonl", "w", encoding="utf-8") as pages:
                    self.pages(pages, names)
                self._add_file(zf, "pages/pages.jsonl", tmpdir / "pages.jsonl")
                package = self._datapackage()
                zf.writestr("datapackage.json", package)
                digest = {
                    "path": "datapackage.json",
                    "hash": "sha256:" + hashlib.sha256(package).hexdigest(),
                }
                zf.writestr("datapackage-digest.json", json.dumps(digest, indent=2))
        except BaseException:
            tmp_out.unlink(missing_ok=True)
            raise
        os.replace(tmp_out, self.output)
        return self.output

    def _check_archives(self) -> None:
        """A ToolError naming the archive files the catalog's rows point into that are
        missing or cut short: a package without their records would lack those pages
        (and the revisits referring to them) without a word."""
        datadir = DataDir(self.data_dir)
        with open_catalog(self.data_dir) as catalog:
            lost = datadir.unreadable_archives(catalog.archive_extents())
        if lost:
            raise ToolError(
                f"the catalog's rows point into archive files that are missing or cut "
                f"short: {', '.join(lost)}; restore them, or drop their rows with "
                "`scrapy catalog verify --fix` (their URLs are fetched again by the next "
                "crawl)"
            )

    def _datapackage(self) -> bytes:
        package = {
            "profile": "data-package",
            "resources": self.resources,
            "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "wacz_version": WACZ_VERSION,
            "software": "research-crawler",
        }
        if self.title:
            package["title"] = self.title
        return json.dumps(package, indent=2).encode("utf-8")

"""``scrapy catalog index`` (a sorted CDXJ of the WARCs, for pywb) and ``wacz``
(WARCs, index and pages packaged for replayweb.page)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
from datetime import UTC, datetime
from pathlib import Path

from crawler.storage import formats
from crawler.storage.datadir import DataDir
from crawler.tools.scan import ToolError, open_catalog
from crawler.tools.tmpfiles import temp_path

WACZ_VERSION = "1.1.1"


def warc_paths(data_dir: Path) -> list[Path]:
    """The closed WARC files of a data directory (CDXJ and WACZ hold WARCs only)."""
    return DataDir(data_dir).archives(formats.get("warc"))


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
        paths = warc_paths(self.data_dir)
        if not paths:
            raise ToolError(f"no closed WARC files under {DataDir(self.data_dir).archive_dir}")
        self.output.parent.mkdir(parents=True, exist_ok=True)
        tmp_out = temp_path(self.output)
        self.resources = []
        try:
            with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(tmp_out, "w") as zf:
                tmpdir = Path(tmp)
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
                    self.pages(pages, {p.name for p in paths})
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

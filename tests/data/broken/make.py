"""Regenerate the broken samples here: python tests/data/broken/make.py (from the project root)."""

import shutil
from pathlib import Path

from crawler.archive import ArchiveWriter, Fetch
from crawler.ziparchive import ZipArchiveWriter

out = Path(__file__).parent
tmp = Path("/tmp/samples")
shutil.rmtree(tmp, ignore_errors=True)


def fetch(n):
    body = (
        f"<html><head><title>Sample {n}</title></head><body>"
        + "sample text " * 40
        + "</body></html>"
    ).encode()
    url = f"http://sample.test/page/{n}.html"
    return Fetch(
        key=f"{n:064x}",
        url=url,
        final_url=url,
        method="GET",
        request_headers=[],
        request_body=b"",
        status=200,
        response_headers=[("Content-Type", "text/html; charset=utf-8")],
        body=body,
        fetched_at=1_700_000_000 + n,
    )


w = ArchiveWriter(tmp / "a", tmp, prefix="sample", gzip_level=1)
rows = [w.write_fetch(fetch(n)) for n in range(3)]
p = w.close()
data = p.read_bytes()
(out / "truncated.warc.gz").write_bytes(data[: rows[2].offset + rows[2].length // 2])
bad = bytearray(data)
mid = rows[1].offset + rows[1].length // 2
bad[mid : mid + 16] = b"\xff" * 16
(out / "corrupt.warc.gz").write_bytes(bytes(bad))
z = ZipArchiveWriter(tmp / "z", tmp, prefix="sample")
zrows = [z.write_fetch(fetch(n)) for n in range(3)]
z.flush()
z._file.close()
zp = z.path.with_name(z.name + ".open")
zdata = zp.read_bytes()
(out / "killed.zip.open").write_bytes(zdata[: zrows[2].offset + zrows[2].length - 10])
print([(r.offset, r.length) for r in rows], mid, [(r.offset, r.length) for r in zrows])

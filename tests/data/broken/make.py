"""Regenerate the broken samples here: python -m tests.data.broken.make (from the project root)."""

import shutil
from pathlib import Path

from crawler.storage.formats.warc import WarcWriter
from crawler.storage.formats.zip import ZipWriter
from tests.factories import fetch as make_fetch

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
    return make_fetch(
        f"{n:064x}",
        body,
        ts=1_700_000_000 + n,
        url=url,
        final_url=url,
        request_headers=[],
        response_headers=[("Content-Type", "text/html; charset=utf-8")],
    )


w = WarcWriter(tmp / "a", tmp, prefix="sample", gzip_level=1)
rows = [w.write_fetch(fetch(n)) for n in range(3)]
p = w.close()
data = p.read_bytes()
(out / "truncated.warc.gz").write_bytes(data[: rows[2].offset + rows[2].length // 2])
bad = bytearray(data)
mid = rows[1].offset + rows[1].length // 2
bad[mid : mid + 16] = b"\xff" * 16
(out / "corrupt.warc.gz").write_bytes(bytes(bad))
z = ZipWriter(tmp / "z", tmp, prefix="sample")
zrows = [z.write_fetch(fetch(n)) for n in range(3)]
z.abandon()
zp = z.path
zdata = zp.read_bytes()
(out / "killed.zip.open").write_bytes(zdata[: zrows[2].offset + zrows[2].length - 10])
print([(r.offset, r.length) for r in rows], mid, [(r.offset, r.length) for r in zrows])

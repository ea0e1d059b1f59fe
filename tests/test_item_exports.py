"""Item tables exported (csv, jsonl, parquet) keep every stored value: a column of mixed
types, NaN, infinities and BLOBs, from a real crawl."""

from __future__ import annotations

import csv
import json
import math
import sys

import pyarrow.parquet as pq

from tests import launcher
from tests.conftest import ROOT, crawl_env, run_crawl, write_urls
from tests.item_spiders import MIXED
from tests.test_item_names import MODULES, item_errors, query


def export(data_dir, fmt, output):
    result = launcher.run(
        [sys.executable, "-m", "scrapy", "catalog", "export", "--table", "shapes"]
        + ["--format", fmt, "-o", str(output), "-s", f"DATA_DIR={data_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=crawl_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result


def strict_json(line: str):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(line, parse_constant=refuse)


def as_text(value):
    return value.hex() if isinstance(value, bytes) else None if value is None else str(value)


def test_exports_keep_a_column_of_mixed_types(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(10)]
    # The first page's int makes the column INTEGER; the others' values are kept as given.
    for name, some in (("first.txt", urls[:1]), ("urls.txt", urls)):
        url_file = write_urls(tmp_path / name, some)
        result = run_crawl(url_file, data_dir, *MODULES, "-a", "shape=mixed", spider="shapes")
        assert result.returncode == 0, result.stderr[-3000:]
    expected = {u: MIXED[n % len(MIXED)] for n, u in enumerate(urls)}
    assert dict(query(data_dir, "SELECT url, value FROM shapes")) == expected

    parquet = export(data_dir, "parquet", tmp_path / "s.parquet")
    assert "column value" in parquet.stderr and "as text" in parquet.stderr, parquet.stderr
    got = pq.read_table(tmp_path / "s.parquet").to_pydict()
    assert dict(zip(got["url"], got["value"], strict=True)) == {
        u: as_text(v) for u, v in expected.items()
    }

    export(data_dir, "jsonl", tmp_path / "s.jsonl")
    lines = (tmp_path / "s.jsonl").read_text().splitlines()
    rows = {r["url"]: r["value"] for r in map(strict_json, lines)}
    assert rows == {u: v.hex() if isinstance(v, bytes) else v for u, v in expected.items()}

    export(data_dir, "csv", tmp_path / "s.csv")
    with open(tmp_path / "s.csv", newline="") as f:
        rows = {r["url"]: r["value"] for r in csv.DictReader(f)}
    assert rows == {u: as_text(v) or "" for u, v in expected.items()}


def test_nan_infinity_and_bytes_are_stored_and_exported_alike(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(3)]
    url_file = write_urls(tmp_path / "urls.txt", urls)
    result = run_crawl(url_file, data_dir, *MODULES, "-a", "shape=floats", spider="shapes")
    assert result.returncode == 0, result.stderr[-3000:]
    # NaN is NULL, bare or in a list; said once per field, never an item error.
    assert item_errors(data_dir) == []
    assert result.stderr.count("NaN stored as NULL") == 1, result.stderr[-3000:]
    stored = query(data_dir, "SELECT _seq, nan, inf, blob, url FROM shapes ORDER BY _key, _seq")
    assert len(stored) == 6
    for seq, nan, inf, blob, url in stored:
        if seq == 1:
            assert (nan, inf, blob) == (None, math.inf, url.encode())
        else:
            assert (json.loads(nan), json.loads(inf), blob) == ([None], [-math.inf], None)

    export(data_dir, "jsonl", tmp_path / "f.jsonl")
    rows = [strict_json(line) for line in (tmp_path / "f.jsonl").read_text().splitlines()]
    assert [r["inf"] for r in rows if r["_seq"] == 1] == [math.inf] * 3
    assert {r["blob"] for r in rows if r["_seq"] == 1} == {u.encode().hex() for u in urls}

    export(data_dir, "csv", tmp_path / "f.csv")
    with open(tmp_path / "f.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["_seq"] == "1"]
    assert {r["blob"] for r in rows} == {u.encode().hex() for u in urls}
    assert {r["inf"] for r in rows} == {"inf"}

    export(data_dir, "parquet", tmp_path / "f.parquet")
    got = pq.read_table(tmp_path / "f.parquet").to_pydict()
    assert sorted(b for b in got["blob"] if b) == sorted(u.encode() for u in urls)

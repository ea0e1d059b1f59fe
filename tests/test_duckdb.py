"""DuckDB reads the catalog as the documentation says, with no network."""

from __future__ import annotations

import re

import duckdb
from duckdb_extensions import import_extension
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.checks import catalog_rows
from tests.conftest import ROOT
from tests.crawls import crawl_site


def readme_queries() -> list[str]:
    """The statements of the first DuckDB block of the page on reading the data with
    other tools, on ``data/metadata.db``."""
    page = (ROOT / "docs" / "how-to" / "reading-data.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```sql\n(.*?)```", page, re.S) if "data/" in b)
    return [s.strip() for s in block.split(";") if s.strip()]


@deferred_f_from_coro_f
async def test_duckdb_runs_the_readme_queries_on_a_catalog(site, tmp_path, data_dir):
    urls = [f"{site.base_url}/page/{n}.html" for n in range(5)] + [f"{site.base_url}/missing/1"]
    await crawl_site(urls, data_dir)
    rows = catalog_rows(data_dir)
    # An extension directory of the test's own, filled from the Python package as
    # `make install` does: DuckDB's INSTALL finds it there and downloads nothing.
    config = {"extension_directory": str(tmp_path / "duckdb-extensions")}
    import_extension("sqlite", con=duckdb.connect(config=config))
    con = duckdb.connect(config=config)
    results = []
    for statement in readme_queries():
        sql = statement.replace("data/metadata.db", str(data_dir / "metadata.db"))
        relation = con.sql(sql)  # runs the statement; a relation for a query
        results.append(relation.fetchall() if relation is not None else None)
    by_status = {status: count for status, count, _ in results[2]}
    assert by_status == {200: 5, 404: 1}
    # count(*) alone is what DuckDB's sqlite extension reads by rowid.
    assert results[4] == [(len(rows),)]

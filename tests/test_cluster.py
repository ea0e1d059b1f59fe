"""A small cluster rehearsal (benchmarks/bench_cluster.py): six crawl processes in two
queue-mode tasks share a PostgreSQL hub of their own, three real tinyproxies and a work
queue of 600 URLs served by nginx."""

from __future__ import annotations

import shutil

from benchmarks.bench_cluster import Rehearsal, RehearsalConfig
from tests.servers import need


def test_six_processes_share_one_hub_without_double_leases_or_lost_urls(tmp_path):
    for binary in ("nginx", "tinyproxy"):
        if shutil.which(binary) is None and not (shutil.which(f"/usr/sbin/{binary}")):
            need(f"{binary} is not installed (apt-get install nginx-light tinyproxy)")
    config = RehearsalConfig(tasks=2, procs=3, proxies=3, urls=600, batch=50, timeout=600)
    result = Rehearsal(tmp_path, config).run()
    assert result.problems == [], "\n".join(result.lines(config))
    assert result.pages == 600 and result.leases >= 600 // config.rotate_every

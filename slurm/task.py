"""One Slurm array task: crawl processes on node-local disk, shipped to shared storage.

    python -m slurm.task --urls URLS --data DATA --stage STAGE \\
        --task I --tasks N [--procs P] [--spider site] [--name NAME]
        [--ship-every MINUTES] [--partition domain|host|url]
        [--no-fork-server] [-- scrapy args]

Crawl process k of task I crawls shard ``I*P+k`` of ``N*P`` (``-a shard=``, split by
``--partition``: ``-a partition=``, default the ``CRAWL_PARTITION`` setting) into
``STAGE/p<k>``, skipping what ``DATA/metadata.db`` and the shipped catalogs
``DATA/catalogs/*.db`` hold (``CATALOG_SEEN``), with archives rolling over every
``--ship-every`` minutes. Every ``--ship-every`` minutes each process's closed
archives, then its catalog and action log, are shipped (:class:`slurm.ship.Shipper`)
as ``DATA/catalogs/NAME_p<k>.db``; its output goes to ``DATA/logs/NAME_p<k>.log``.

The crawl processes are forked from a fork server that imported Scrapy, Twisted and
the project once (:mod:`slurm.forkserver`); ``--no-fork-server`` (or
``CRAWL_FORK_SERVER=0``) starts each as a plain ``python -m scrapy crawl`` process.
Each crawl's work is shipped again as soon as it ends.

SIGUSR1 (the batch script forwards what Slurm sends it before the time limit): each
crawl gets one SIGTERM, its graceful stop. SIGTERM: not forwarded, since Slurm sends
it to every process of the job (``scancel``, time limit) and a crawl takes a second
one as an order to stop at once. Once the crawls have stopped, everything is shipped.

Exit status: 0 every crawl finished its share; 75 one stopped early (run again to
resume); 1 one failed or the last shipment failed.

Queue mode (``--queue NAME``, ``HUB_URL`` set; ``--urls`` is then not read): each crawl
process k loops: lease a batch of ``--batch`` URLs from the hub's work queue NAME
(:mod:`crawler.hub.workqueue`, :mod:`slurm.queue`), write it to ``STAGE/p<k>/batch.txt``, crawl it (no shard),
ship, and mark the batch done only once shipped; the lease is renewed while the crawl
runs (``WORK_LEASE_TTL`` seconds, default 300). A process that finds nothing to lease
waits while other holders' leases are live (a dead holder's batch is taken over when
its lease expires) and stops when every item is done. A batch whose crawl stopped
early or failed is given back to the queue. Exit status: 0 the queue is done; 75
stopped by a signal; 1 a crawl, a shipment or the hub failed.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from crawler.helptext import ToolHelpFormatter
from crawler.partition import MODES
from slurm.queue import run_queue
from slurm.runner import TaskConfig, TaskRunner


def parse_args(argv: list[str]) -> TaskConfig:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, prog="python -m slurm.task", description=__doc__
    )
    parser.add_argument("--urls", required=True, type=Path, help="the URL list")
    parser.add_argument("--data", required=True, type=Path, help="the shared data directory")
    parser.add_argument("--stage", required=True, type=Path, help="node-local staging directory")
    parser.add_argument("--task", required=True, type=int, help="this task's number, from 0")
    parser.add_argument("--tasks", required=True, type=int, help="tasks in the array")
    parser.add_argument("--procs", type=int, default=1, help="crawl processes (default 1)")
    parser.add_argument("--spider", default="site", help="the spider (default site)")
    parser.add_argument("--name", default="task", help="names the shipped files (NAME_p<k>)")
    parser.add_argument("--ship-every", type=float, default=10.0, help="minutes")
    parser.add_argument("--queue", default="", help="queue mode: the hub's work queue")
    parser.add_argument("--batch", type=int, default=1000, help="queue mode: URLs per lease")
    parser.add_argument(
        "--partition",
        "--partition-by",
        dest="partition",
        choices=MODES,
        help="shard mode: what a shard takes whole (default: the CRAWL_PARTITION setting, "
        "domain); queue mode: set when the queue is loaded",
    )
    parser.add_argument(
        "--fork-server",
        action=argparse.BooleanOptionalAction,
        default=os.environ.get("CRAWL_FORK_SERVER", "1").lower() not in ("0", "no", "false"),
        help="fork the crawls from a server that imported Scrapy once (default; "
        "CRAWL_FORK_SERVER=0 turns it off); --no-fork-server: plain processes",
    )
    parser.add_argument(
        "scrapy_args", nargs=argparse.REMAINDER, help="after --: given to every scrapy crawl"
    )
    args = parser.parse_args(argv)
    extra = args.scrapy_args[1:] if args.scrapy_args[:1] == ["--"] else args.scrapy_args
    if not 0 <= args.task < args.tasks or args.procs < 1 or args.batch < 1:
        parser.error("need 0 <= --task < --tasks, --procs >= 1 and --batch >= 1")
    return TaskConfig(
        urls=args.urls.resolve(),
        data=args.data.resolve(),
        stage=args.stage.resolve(),
        task=args.task,
        tasks=args.tasks,
        procs=args.procs,
        spider=args.spider,
        name=args.name,
        ship_every=args.ship_every * 60,
        scrapy_args=tuple(extra),
        queue=args.queue,
        batch=args.batch,
        partition=args.partition or "",
        fork_server=args.fork_server,
        lease_ttl=float(os.environ.get("WORK_LEASE_TTL") or 300),
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s [task] %(message)s", stream=sys.stdout
    )
    config = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("SQLITE_TMPDIR", str(config.stage))
    if config.queue:
        return run_queue(config)
    return TaskRunner(config).run()


if __name__ == "__main__":
    sys.exit(main())

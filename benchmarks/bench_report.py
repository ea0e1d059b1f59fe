"""Crawl report: time and memory to make a report from an action log of N lines.

    python -m benchmarks.bench_report [--lines 1000000] [--hours 12]

Writes a synthetic ``fetch_log.jsonl`` of N lines spread over some hours (mostly
``ok``, some retries, errors and cache hits, 50 hosts, 5 proxies) into a temporary
data directory, then makes the report in a separate process and prints the time spent
reading the log, the whole report's time, lines/s and the process's peak RSS (with
the peak after imports, so the log's share shows).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from crawler.helptext import ToolHelpFormatter

ROOT = Path(__file__).resolve().parent.parent

MEASURE = """
import json, resource, sys, time
from pathlib import Path
from crawler.report import ReportBuilder
from crawler.report.logread import read_action_log

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

import crawler.report.html, crawler.report.plots  # noqa: E401 - imports before the baseline
data_dir, output = Path(sys.argv[1]), Path(sys.argv[2])
after_imports = peak_mb()
started = time.perf_counter()
stats = read_action_log(data_dir / "fetch_log.jsonl")
read = time.perf_counter() - started
started = time.perf_counter()
ReportBuilder(data_dir).write(output)
total = time.perf_counter() - started
print(json.dumps({"lines": stats.lines, "read_s": read, "report_s": total,
                  "peak_mb": peak_mb(), "imports_mb": after_imports,
                  "bins": len(stats.bins), "html_bytes": output.stat().st_size}))
"""

OUTCOMES = ["ok"] * 90 + ["retry"] * 4 + ["error"] * 2 + ["cache_hit"] * 3 + ["not_modified"]


def write_log(path: Path, lines: int, hours: float, seed: int = 0) -> None:
    rng = random.Random(seed)
    start = 1_780_000_000.0
    step = hours * 3600 / max(lines, 1)
    proxies = [f"http://user:***@10.0.0.{i}:3128" for i in range(5)]
    with path.open("w") as out:
        for i in range(lines):
            ts = start + i * step
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts))
            outcome = rng.choice(OUTCOMES)
            failed = outcome in ("retry", "error")
            entry = {
                "ts": f"{stamp}.{int(ts * 1000) % 1000:03d}Z",
                "url": f"https://host{i % 50}.example/page/{i}.html",
                "key": f"{i:064x}",
                "attempt": 1,
                "outcome": outcome,
                "status": 503 if failed else 200,
                "error": "TimeoutError: took too long" if failed and i % 2 else None,
                "elapsed_ms": 12.5,
                "bytes": None if failed else 40_000 + i % 20_000,
                "proxy": proxies[i % 5],
            }
            out.write(json.dumps(entry) + "\n")


def run(lines: int = 1_000_000, hours: float = 12.0) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="bench_report.") as tmp:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        log = data_dir / "fetch_log.jsonl"
        write_log(log, lines, hours)
        size = log.stat().st_size
        done = subprocess.run(
            [sys.executable, "-c", MEASURE, str(data_dir), str(Path(tmp) / "report.html")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        result = json.loads(done.stdout.strip().splitlines()[-1])
    n = result["lines"]
    return [
        f"action log: {n:,} lines, {size / 1e6:,.0f} MB, {hours:g} hours",
        f"read and aggregated: {result['read_s']:.1f} s ({n / result['read_s']:,.0f} lines/s), "
        f"{result['bins']} bins",
        f"whole report (log read again, figures, page): {result['report_s']:.1f} s "
        f"({n / result['report_s']:,.0f} lines/s), page {result['html_bytes'] / 1024:,.0f} KiB",
        f"peak RSS {result['peak_mb']:,.0f} MB (after imports {result['imports_mb']:,.0f} MB)",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--hours", type=float, default=12.0)
    args = parser.parse_args()
    for line in run(args.lines, args.hours):
        print(line)


if __name__ == "__main__":
    main()

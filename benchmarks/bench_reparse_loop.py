"""Re-parse against the parser's own speed: whole processes, alternating, in one run.

    python -m benchmarks.bench_reparse_loop [--pages 3000] [--rounds 3] [--case NAME ...]
    python -m benchmarks.bench_reparse_loop --at-once 6 [--case NAME ...]
    python -m benchmarks.bench_reparse_loop --callgrind 300

Over a corpus of ``--pages`` stored product pages of ~50 KB (built once by
``benchmarks.bench_reparse``), each round runs, one after the other:

- ``loop``: the plain loop (``benchmarks.parse_loop``): FastWARC reads every record in
  file order, an ``HtmlResponse`` is built, ``parse_product`` called, items kept;
- ``scrapy reparse products`` with one worker and with every core, into the item
  tables and into ``-o items.parquet``;
- ``scrapy reparse products --follow --until-idle 0`` catching up a backlog of every
  page (its position reset before each run), with one worker and with every core;
- the plain loop on every core (``--processes``: each process parses a consecutive
  share of the records).

Each is a whole process (start-up included) timed from outside; its CPU time is that
of the whole process tree. The loop runs before and after the other cases of each
round, and counts as the mean of both: the machine's speed drifts within a round. A
case's ratio is its pages/s over the loop's of the same round times its number of
cores (workers; processes for the loop on every core: its scaling); the target is
``>= 0.90``. ``cpu`` is the loop's CPU seconds over the
case's; several workers are also given over the loop on as many processes.
``scaling`` is every core against cores x one worker. Last, the loop and one-worker
re-parses run in this process, timing the parser's CPU inside each: its share of each
run's CPU gives the machinery's cost even on a machine whose other jobs make whole
runs differ by 20%.
On a shared machine the load average printed with each round says how far the wall
figures can be trusted.

``--at-once PAIRS`` runs the loop and each one-worker case at the same time instead,
each process pinned to a core of its own and the cores swapped every other pair, so
that both see whatever the machine's speed does meanwhile (on a shared machine it
drifted by a third within one round): the loop's wall time over the case's, per pair.
The two share the caches and memory beyond their cores, as processes on a loaded
machine do.

``--callgrind PAGES`` runs the loop and the one-worker cases under valgrind's callgrind
instead, over PAGES pages and over none: instruction counts, which no other job
changes, of whole processes, of their start-up and per page, and the ratio they give
a run of 3,000 pages (the wall-clock cases' size), which takes callgrind too long
to count whole.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import parse_loop
from benchmarks.bench_reparse import build_corpus
from crawler.helptext import ToolHelpFormatter
from crawler.reparse.plan import ReparseConfig
from crawler.reparse.runner import Reparse, Reparser
from crawler.storage.datadir import DataDir

ROOT = Path(__file__).resolve().parent.parent
PAGES = 3000


@dataclass
class Case:
    name: str
    workers: int  # 0: the plain loop
    processes: int = 1  # of the plain loop
    args: list[str] = field(default_factory=list)
    follow: bool = False
    output: bool = False
    rates: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    cpu_ratios: list[float] = field(default_factory=list)
    # Several workers: pages/s over the plain loop's on as many processes.
    same_core_ratios: list[float] = field(default_factory=list)

    @property
    def cores(self) -> int:
        return self.workers or self.processes


def cases(cores: int) -> list[Case]:
    found = [
        Case("loop", 0),
        Case("reparse 1 worker, item tables", 1),
        Case("reparse 1 worker, -o parquet", 1, output=True),
        Case("reparse --follow 1 worker", 1, follow=True),
    ]
    if cores > 1:
        found += [
            Case(f"loop {cores} processes", 0, processes=cores),
            Case(f"reparse {cores} workers, item tables", cores),
            Case(f"reparse {cores} workers, -o parquet", cores, output=True),
            Case(f"reparse --follow {cores} workers", cores, follow=True),
        ]
    return found


def command(case: Case, data: Path, out: Path) -> list[str]:
    if not case.workers:
        return [
            *[sys.executable, "-m", "benchmarks.parse_loop", str(data)],
            *(["--processes", str(case.processes)] if case.processes > 1 else []),
        ]
    cmd = [sys.executable, "-m", "scrapy", "reparse", "products", "--workers", str(case.workers)]
    cmd += ["-s", f"DATA_DIR={data}"]
    if case.output:
        cmd += ["-o", str(out / "items.parquet")]
    if case.follow:
        cmd += ["--follow", "--until-idle", "0"]
    return cmd


def reset_follow(data: Path) -> None:
    # No such table before the first follower ran.
    with sqlite3.connect(DataDir(data).catalog_path) as conn, suppress(sqlite3.OperationalError):
        conn.execute("DELETE FROM _follow_progress")


def run_case(case: Case, data: Path, out: Path) -> tuple[float, float]:
    """(seconds, CPU seconds) of one whole run."""
    if case.follow:
        reset_follow(data)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(command(case, data, out), cwd=ROOT, env=env, capture_output=True)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise RuntimeError(f"{case.name}: exit {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu


def run_pinned(cmd: list[str], core: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    # Pinned as it starts its interpreter, long before it reads a record.
    os.sched_setaffinity(proc.pid, {core})
    return proc


def ended_at(procs: dict[str, subprocess.Popen]) -> dict[str, float]:
    """When each process ended (``time.perf_counter``); an error if one failed."""
    ended: dict[str, float] = {}
    errors: dict[str, bytes] = {}

    def wait(name: str, proc: subprocess.Popen) -> None:
        errors[name] = proc.communicate()[1]
        ended[name] = time.perf_counter()

    threads = [threading.Thread(target=wait, args=item) for item in procs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name, proc in procs.items():
        if proc.returncode:
            raise RuntimeError(f"{name}: exit {proc.returncode}: {errors[name].decode()[-2000:]}")
    return ended


def at_once(case: Case, data: Path, out: Path, cores: tuple[int, int]) -> float:
    """The loop's wall seconds over ``case``'s, both run at the same time, the loop
    pinned to ``cores[0]`` and the case to ``cores[1]``."""
    loop = cases(1)[0]
    if case.follow:
        reset_follow(data)
    started = time.perf_counter()
    procs = {
        "loop": run_pinned(command(loop, data, out), cores[0]),
        case.name: run_pinned(command(case, data, out), cores[1]),
    }
    ended = ended_at(procs)
    return (ended["loop"] - started) / (ended[case.name] - started)


def pairs_at_once(
    pairs: int, pages: int, only: list[str] | None, say, data: Path | None = None
) -> None:
    """``pairs`` runs of each one-worker case beside the loop (:func:`at_once`)."""
    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(usable) < 2:
        raise SystemExit("--at-once needs two cores this process may run on")
    todo = [c for c in cases(1)[1:] if not only or c.name in only]
    say(
        f"{pages:,} stored product pages; the loop and each case at the same time on cores "
        f"{usable[0]} and {usable[1]}, swapped every other pair; the loop's seconds over "
        "the case's:"
    )
    with corpus(pages, data) as (data, out):
        for case in todo:
            ratios = []
            for n in range(pairs):
                pinned = (usable[0], usable[1]) if n % 2 == 0 else (usable[1], usable[0])
                ratios.append(at_once(case, data, out, pinned))
                (out / "items.parquet").unlink(missing_ok=True)
            say(f"  {case.name}: {figures(ratios)}")


def instructions(cmd: list[str]) -> int:
    """Instructions one whole process (and any it forks) executes, counted by callgrind:
    a figure that other jobs on the machine do not change."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.%p"
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd],
            cwd=ROOT,
            env=env,
            capture_output=True,
        )
        if proc.returncode:
            raise RuntimeError(f"{cmd}: exit {proc.returncode}: {proc.stderr.decode()[-2000:]}")
        total = 0
        for path in Path(tmp).glob("callgrind.*"):
            for line in path.read_text().splitlines():
                if line.startswith("totals:"):
                    total += int(line.split()[1])
        return total


def instruction_counts(pages: int, say, data: Path | None = None) -> None:
    """The one-worker cases and the loop under callgrind over ``pages`` pages, and the
    same processes over none (their start-up): ratios of instruction counts."""
    with corpus(pages, data) as (data, out):
        empty = out / "empty"
        (empty / "archive").mkdir(parents=True)
        say(f"callgrind, {pages:,} pages, instructions of the whole process (start-up: of none):")
        loop = cases(1)[0]
        whole = instructions(command(loop, data, out))
        start = instructions(command(loop, empty, out))
        say(f"  loop: {whole / 1e9:.2f} G, start-up {start / 1e9:.2f} G")
        for case in cases(1)[1:]:
            if case.follow:
                reset_follow(data)
            got = instructions(command(case, data, out))
            (out / "items.parquet").unlink(missing_ok=True)
            line = f"  {case.name}: {got / 1e9:.2f} G, ratio {whole / got:.2f}"
            if not case.follow:
                began = instructions([*command(case, data, out), "--limit", "0"])
                loop_page, page = (whole - start) / pages, (got - began) / pages
                line += (
                    f"; start-up {began / 1e9:.2f} G; per page {page / 1e6:.2f} M "
                    f"against the loop's {loop_page / 1e6:.2f} M, ratio {loop_page / page:.2f}; "
                    f"at {PAGES:,} pages (start-up + pages x per page) "
                    f"{(start + PAGES * loop_page) / (began + PAGES * page):.3f}"
                )
            say(line)


def items_stored(data: Path) -> int:
    with sqlite3.connect(DataDir(data).catalog_path) as conn:
        try:
            return conn.execute("SELECT count(*) FROM _item_pages").fetchone()[0]
        except sqlite3.OperationalError:
            return 0


@contextmanager
def corpus(pages: int, data: Path | None = None):
    """(the corpus's data directory, a scratch directory) for the time of a benchmark;
    the corpus's pages have stored items, as after a first re-parse."""
    data = data or ROOT / "bench-data" / f"reparse-{pages}"
    build_corpus(data, pages)
    out = Path(tempfile.mkdtemp(prefix="bench-reparse-"))
    try:
        if items_stored(data) != pages:
            # Every timed run into the item tables then replaces stored items, as a
            # re-parse after a parser fix does.
            run_case(cases(1)[1], data, out)
        yield data, out
    finally:
        shutil.rmtree(out, ignore_errors=True)


@contextmanager
def timed(owner, name: str, spent: list[float]):
    """``owner.name`` replaced by itself adding its CPU seconds to ``spent[0]``."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        started = time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            spent[0] += time.process_time() - started

    setattr(owner, name, wrapper)
    try:
        yield
    finally:
        setattr(owner, name, original)


def parser_shares(data: Path, out: Path) -> list[tuple[str, float, float]]:
    """(case, CPU seconds, of which the parser's) of the loop and of one-worker
    re-parses run in this process, start-up excluded: both figures are taken at the
    same moment, so their quotient holds whatever else the machine runs."""
    found = []
    for name, output in (
        ("loop", None),
        ("item tables", None),
        ("-o parquet", out / "share.parquet"),
    ):
        spent = [0.0]
        started = time.process_time()
        if name == "loop":
            with timed(parse_loop, "parse_product", spent):
                parse_loop.parse_all(data)
        else:
            config = ReparseConfig(spider="products", data_dir=data, workers=1, output=output)
            with timed(Reparser, "_run_callback", spent):
                Reparse(config).run()
        found.append((name, time.process_time() - started, spent[0]))
    return found


def figures(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({' '.join(f'{v:.2f}' for v in values)})"


def round_ratios(todo: list[Case]) -> None:
    """Add the last round's ratios to each case (the loop, ``todo[0]``, has none)."""
    loop = todo[0]
    many_loop = next((c for c in todo if c.processes > 1), None)
    for case in todo[1:]:
        case.ratios.append(case.rates[-1] / (loop.rates[-1] * case.cores))
        if case.workers:
            case.cpu_ratios.append(loop.cpus[-1] / case.cpus[-1])
        if case.workers > 1 and many_loop is not None:
            case.same_core_ratios.append(case.rates[-1] / many_loop.rates[-1])


def case_line(case: Case, rate: float, cpu: float, at: slice) -> str:
    line = f"  {case.name}: {rate:,.0f} pages/s, {cpu:.1f} s CPU"
    if not case.ratios:
        return line
    line += f", ratio {figures(case.ratios[at])}"
    if case.cpu_ratios:
        line += f", cpu {figures(case.cpu_ratios[at])}"
    if case.same_core_ratios:
        line += f", over the loop on as many processes {figures(case.same_core_ratios[at])}"
    return line


def summarize(todo: list[Case], cores: int, say) -> None:
    say(
        "medians (ratio: pages/s over cores x the one-process loop's of the same round; "
        "cpu: the loop's CPU seconds over the case's):"
    )
    for case in todo:
        rate, cpu = statistics.median(case.rates), statistics.median(case.cpus)
        say(case_line(case, rate, cpu, slice(None)))
    by_name = {c.name: c for c in todo}
    for kind in ("item tables", "-o parquet"):
        one = by_name.get(f"reparse 1 worker, {kind}")
        many = by_name.get(f"reparse {cores} workers, {kind}")
        if one and many and many is not one:
            scaling = [m / (cores * o) for m, o in zip(many.rates, one.rates, strict=True)]
            say(
                f"  scaling, {kind}: {cores} workers over {cores} x 1 worker: "
                f"{statistics.median(scaling):.2f} ({' '.join(f'{s:.2f}' for s in scaling)})"
            )


def run(
    pages: int = PAGES,
    rounds: int = 3,
    data: Path | None = None,
    only: list[str] | None = None,
    echo: bool = False,
) -> list[str]:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    todo = [c for c in cases(cores or 1) if not only or c.workers == 0 or c.name in only]
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        if echo:
            print(line, flush=True)

    say(f"{pages:,} stored product pages of ~50 KB; {cores} cores; {rounds} rounds")
    with corpus(pages, data) as (data, out):
        for n in range(rounds):
            load = " ".join(f"{x:.2f}" for x in os.getloadavg())
            say(f"round {n + 1} (load average at its start: {load}):")
            # The loop before and after the cases (in reverse order every other round),
            # its figures the mean of both: this machine's speed drifts by a fifth
            # within minutes (the same loop on two processes took 13.5 to 19.7 s of
            # CPU in three rounds in a row), which a case would otherwise be charged
            # with. How far the two loop runs differ is printed with each round.
            loop = todo[0]
            cases_order = todo[1:] if n % 2 == 0 else list(reversed(todo[1:]))
            bracket = []
            for case in [loop, *cases_order, loop]:
                seconds, cpu = run_case(case, data, out)
                if case is loop:
                    bracket.append((pages / seconds, cpu))
                    continue
                case.rates.append(pages / seconds)
                case.cpus.append(cpu)
            loop.rates.append(statistics.fmean(r for r, _ in bracket))
            loop.cpus.append(statistics.fmean(c for _, c in bracket))
            round_ratios(todo)
            first, last = bracket[0][0], bracket[1][0]
            say(
                case_line(loop, loop.rates[-1], loop.cpus[-1], slice(-1, None))
                + f" (before the cases {first:,.0f}, after them {last:,.0f})"
            )
            for case in todo[1:]:
                say(case_line(case, case.rates[-1], case.cpus[-1], slice(-1, None)))
        shares = parser_shares(data, out)
    if rounds:
        summarize(todo, cores, say)
    say(
        "in this process, start-up excluded (CPU per unit of parser CPU, the loop's over "
        "the case's: the machinery's cost whatever the load):"
    )
    _, loop_cpu, loop_parser = shares[0]
    for name, cpu, parser in shares:
        line = (
            f"  {name}: {cpu:.1f} s CPU, {parser:.1f} s of it in the parser ({parser / cpu:.0%}), "
            f"the rest {(cpu - parser) / pages * 1e6:.0f} us a page"
        )
        if name != "loop":
            line += f", ratio {(loop_cpu / loop_parser) / (cpu / parser):.2f}"
        say(line)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        formatter_class=ToolHelpFormatter, description=__doc__.splitlines()[0]
    )
    parser.add_argument("--pages", type=int, default=PAGES)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data", type=Path)
    parser.add_argument(
        "--case", action="append", help="run only this case (and the loop); may be repeated"
    )
    parser.add_argument(
        "--at-once",
        type=int,
        metavar="PAIRS",
        help="instead: run the loop and each one-worker case at the same time, each on a "
        "core of its own, PAIRS times",
    )
    parser.add_argument(
        "--callgrind",
        type=int,
        metavar="PAGES",
        help="instead: count the instructions of the loop and of one-worker re-parses of "
        "PAGES pages under valgrind (minutes for a few hundred pages)",
    )
    args = parser.parse_args()

    def echo(line: str) -> None:
        print(line, flush=True)

    if args.callgrind:
        instruction_counts(args.callgrind, echo, args.data)
        return
    if args.at_once:
        pairs_at_once(args.at_once, args.pages, args.case, echo, args.data)
        return
    run(args.pages, args.rounds, args.data, args.case, echo=True)


if __name__ == "__main__":
    main()

"""What a crawl did so far, as its counters and end line say it: :class:`RunCounts`.

The counts of each response are kept in a plain dict and handed to Scrapy's stats once
a second (and at the end): the stats collector hooks every attribute access, which
cost more per response than counting here (the history of docs/benchmarks.md). The keys that have a
final line in this run's action log are kept too, exactly and in bounded memory (a
resumed list of millions adds one each: :class:`~crawler.storage.finalkeys.FinalKeys`),
so that a URL met again is counted as a duplicate (``catalog/duplicates``) instead of
logged a second time.
"""

from __future__ import annotations

from collections.abc import Callable

from crawler.storage.actionlog import NOT_FINAL, OUTCOMES, Outcome
from crawler.storage.finalkeys import FinalKeys


class RunCounts:
    """This run's counts by outcome, waiting to reach the stats, and the keys that have
    their final line."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        # Rows handed to the writer (fetches stored, 304s refreshed, records made): those
        # it has not reported committed are the run's storage lag.
        self.rows_sent = 0
        self._finished = FinalKeys()
        # What the writer had found unchanged at the last count (see :meth:`unchanged`).
        self._unchanged = (0, 0)

    def inc(self, name: str, count: int = 1) -> None:
        counts = self._counts
        counts[name] = counts.get(name, 0) + count

    def outcome(self, outcome: str, listed: bool) -> None:
        """One line of ``outcome``; a final one of a listed URL is that URL done."""
        self.inc(f"actions/{outcome}")
        if listed and outcome not in NOT_FINAL:
            self.inc("progress/list_done")

    def drain(self) -> dict[str, int]:
        """The counts since the last call (for the stats), forgotten here."""
        counts, self._counts = self._counts, {}
        return counts

    def unchanged(self, count: int, size: int) -> None:
        """The writer's running total of answers it kept as revisits of their key's
        stored payload (``count``, of ``size`` bytes): those found since the last call
        move from the ``ok`` counters, where the crawl counted them, to the
        ``unchanged`` ones."""
        new, new_bytes = count - self._unchanged[0], size - self._unchanged[1]
        if not new:
            return
        self._unchanged = (count, size)
        for name, by in (
            ("archive/revisits", new),
            ("actions/unchanged", new),
            ("actions/ok", -new),
            ("archive/stored", -new),
            ("archive/stored_bytes", -new_bytes),
        ):
            self.inc(name, by)

    # -- final lines ---------------------------------------------------------------------

    def finished(self, key: str) -> None:
        """``key`` has its final line in this run's log now."""
        self._finished.add(key)

    def first_sights(self, keys: list[str]) -> list[bool]:
        """Of each of ``keys`` in order, whether it has no final line in this run's log
        yet; they all have one now."""
        return self._finished.first_sights(keys)

    def seen(self, key: str) -> bool:
        """Whether ``key`` has its final line in this run's log."""
        return key in self._finished

    def close(self) -> None:
        """Forget the final lines (their temporary file is deleted)."""
        self._finished.close()


def error_causes(stats: dict) -> str:
    """The run's errors by cause, most first: ``1 HTTP 500, 1 forbidden by robots.txt``."""
    prefix = "actions/error/"
    causes = [
        (count, name.removeprefix(prefix))
        for name, count in stats.items()
        if name.startswith(prefix) and count
    ]
    return ", ".join(f"{n:,} {cause}" for n, cause in sorted(causes, key=lambda c: (-c[0], c[1])))


def outcomes_line(
    get: Callable[..., int | None], committed: int | None = None, causes: str = ""
) -> str:
    """The run's outcomes as its end summary says them, from its stats (``get`` is
    ``stats.get_value``). ``committed``: the rows the writer committed before storing
    failed; the rest of what it was handed is indexed or fetched again next run.
    ``causes``: the errors by cause (:func:`error_causes`)."""
    counts = ", ".join(f"{get(f'actions/{outcome}', 0):,} {outcome}" for outcome in OUTCOMES)
    if causes:
        # Each error by its cause: a URL that robots.txt forbids is one of them.
        counts = counts.replace(" error,", f" error ({causes}),", 1)
    if committed is not None:
        # What was committed, not what was fetched: the rest is fetched again. Every
        # answer handed to the writer makes a row, whatever its line says: a revisit
        # (unchanged) and a 304 (not_modified) too, and a thumbnail a pipeline made.
        handed = sum(get(f"actions/{o}", 0) for o in (Outcome.OK, Outcome.UNCHANGED))
        handed += get("actions/not_modified", 0) + get("archive/made", 0)
        counts = (
            f"storage failed, {committed:,} rows committed (of {handed:,} fetched ok, "
            "unchanged, refreshed or made: the next run indexes the others from the "
            "archive, or fetches them again), " + counts.split(", ", 1)[1]
        )
    total = get("progress/list_total")
    done = f"{get('progress/list_done', 0):,}" + (f" of {total:,}" if total else "")
    duplicates = f"{get('catalog/duplicates', 0):,} duplicates (URLs met again)"
    return f"Outcomes of this run: {counts}; {duplicates}; listed URLs done: {done}."

"""The report as one self-contained HTML page: inline SVG figures, no scripts.

It lays out what ``model`` computes and says nothing of its own. Every number a reader
(or a test) may check is in an element with ``data-stat`` (a stable name such as
``outcome:ok`` or ``status:404``) and ``data-value`` (the exact number); every figure
is a ``<figure class="plot" id="plot-...">``.
"""

from __future__ import annotations

from html import escape

from crawler.report import plots
from crawler.report.build import Report, RunReport
from crawler.report.logread import IDLE_GAP_SECONDS, LogStats
from crawler.report.model import (
    TOP_HOSTS,
    Pace,
    bytes_rate_text,
    duration,
    failing_hosts,
    host_limits,
    lease_spans,
    problems,
    rate_text,
    run_title,
    size,
    when,
)
from crawler.report.sources import HubSummary
from crawler.storage.actionlog import OUTCOMES

# Hosts drawn in the politeness figure (all of the top ones are in its table).
PLOTTED_HOSTS = 6
TOP_TYPES = 15
# Runs drawn with their figures, newest first; older runs are rows of the runs table.
RUN_SECTIONS = 5

# At 1280 px every table fits. Narrow windows (800 px, a phone): the page never scrolls
# sideways; a wide table scrolls inside its own box, long values (URLs, settings) wrap,
# and a figure keeps the size it was drawn at (672 px: 10 pt ticks read as 13 px),
# scrolling inside its box rather than shrinking its text.
STYLE = """
*{box-sizing:border-box}
body{font-family:system-ui,sans-serif;margin:1em auto;padding:0 .8em;max-width:72em;color:#222}
h1{font-size:1.4em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd}
h3{font-size:1.05em;margin:1.2em 0 .3em}
.wide{max-width:100%;overflow-x:auto}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.2em .6em;text-align:left;
vertical-align:top}th{vertical-align:bottom}td.text{max-width:48em;color:#444}
td[data-setting],td.url{overflow-wrap:anywhere}td.url{min-width:12em}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr:nth-child(even){background:#f6f6f6}tr.more,tr.more+tr{background:none}
tr.more td{padding-bottom:.6em;border-bottom:1px solid #eee}
figure.plot{margin:1em 0;max-width:100%;overflow-x:auto}
figure.plot figcaption{font-weight:600;margin-bottom:.3em}
figure.plot svg{display:block;width:100%;min-width:42em;max-width:52em;height:auto}
.note{color:#555}.empty{font-size:1.2em;padding:1em;background:#fff3cd}
.tiles{display:flex;flex-wrap:wrap;gap:.6em}.tile{border:1px solid #ddd;padding:.4em .8em}
.tile .n{font-size:1.3em;display:block}
"""


def stat(name: str, value: float, text: str | None = None) -> str:
    shown = text if text is not None else f"{value:,}"
    return f'<span class="n" data-stat="{escape(name)}" data-value="{value}">{escape(shown)}</span>'


def cell(name: str, value: float, text: str | None = None) -> str:
    return f'<td class="n">{stat(name, value, text)}</td>'


def figure(name: str, svg: str, caption: str) -> str:
    """A figure with its title above it (a caption below reads as the next one's)."""
    return (
        f'<figure class="plot" id="plot-{name}">'
        f"<figcaption>{escape(caption)}</figcaption>{svg}</figure>"
    )


def table(headers: list[str], rows: list[str]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return f'<div class="wide"><table><tr>{head}</tr>{"".join(rows)}</table></div>'


def render_page(report: Report) -> str:
    body = [
        "<h1>Crawl report</h1>",
        f'<p class="note">{escape(str(report.layout.root))}: generated {when(report.generated)}'
        f" in {report.seconds:.1f} s</p>",
    ]
    if report.layout.empty:
        body.append(
            f'<p id="empty" class="empty">Nothing crawled yet: {escape(str(report.layout.root))} '
            "holds no catalog and no action log.</p>"
        )
    else:
        body += [
            summary_section(report),
            runs_section(report),
            catalog_section(report),
            hosts_section(report.total),
            politeness_section(report),
            proxy_section(report.total, report.hub),
            queues_section(report),
            items_section(report),
        ]
    body.append(settings_section(report.settings, report.run))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Crawl report: {escape(report.layout.root.name)}</title>"
        f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n"
    )


def summary_section(report: Report) -> str:
    total, catalog = report.total, report.catalog
    tiles = []
    if catalog is not None:
        tiles.append(("stored pages (catalog rows)", stat("catalog:rows", catalog.rows)))
        tiles.append(("stored bytes", stat("catalog:bytes", catalog.bytes, size(catalog.bytes))))
    tiles.append(("action-log lines", stat("log:lines", total.lines)))
    for outcome in OUTCOMES:
        tiles.append((outcome, stat(f"outcome:{outcome}", total.outcomes[outcome])))
    if total.bad_lines:
        tiles.append(("unreadable log lines", stat("log:bad_lines", total.bad_lines)))
    pace = Pace.of(total)
    active, rate = pace.active, pace.pages_per_second
    tiles.append(("active time", stat("log:active_s", active, duration(active))))
    tiles.append(("pages/s while active", stat("log:pages_per_s", rate, rate_text(active, rate))))
    html = "".join(
        f'<div class="tile">{value}<span>{escape(label)}</span></div>' for label, value in tiles
    )
    extra = (
        f'<p class="note">Over every run in the action logs. Rates count active time: '
        f"a stretch of {IDLE_GAP_SECONDS} s or more in which no attempt was logged or on "
        "its way (a stall, the time between runs) is left out.</p>"
    )
    if total.first_problem:
        extra += f'<p class="note">First unreadable line: {escape(total.first_problem)}</p>'
    return (
        f'<h2>Summary</h2><div class="tiles">{html}</div>{extra}'
        + runs_table(report)
        + tasks_table(report.tasks)
    )


def tasks_table(tasks: dict[str, LogStats], prefix: str = "task") -> str:
    """One row per action log (a Slurm task's, or the data directory's own)."""
    rows = []
    for name, stats in tasks.items():
        pace = Pace.of(stats)
        active, rate, failed = pace.active, pace.pages_per_second, pace.failed
        key = f"{prefix}:{name}"
        rows.append(
            f"<tr><td>{escape(name)}</td>{cell(f'{key}:lines', stats.lines)}"
            f"{cell(f'{key}:pages', stats.pages)}{cell(f'{key}:failed', failed)}"
            f"<td>{when(stats.first_ts)}</td>{cell(f'{key}:active_s', active, duration(active))}"
            f"{cell(f'{key}:pages_per_s', rate, rate_text(active, rate))}</tr>"
        )
    headers = ["task", "lines", "pages (ok)", "retries + errors", "first", "active", "pages/s"]
    return "<h3>Action logs</h3>" + table(headers, rows)


def runs_table(report: Report) -> str:
    """Every run (runs.jsonl) with its own counts and rates."""
    if not report.runs:
        return ""
    rows = []
    for run in reversed(report.runs):
        stats, n = run.total, run.number
        pace = Pace.of(stats)
        active, rate, failed = pace.active, pace.pages_per_second, pace.failed
        name = escape(run_title(run).split(":", 1)[0])
        link = f'<a href="#run-{n}">{name}</a>' if n in shown_runs(report) else name
        spider = escape(str((run.entry or {}).get("spider", "")))
        rows.append(
            f"<tr><td>{link}</td><td>{spider}</td><td>{when(stats.first_ts)}</td>"
            f"{cell(f'run:{n}:pages', stats.pages)}{cell(f'run:{n}:failed', failed)}"
            f"{cell(f'run:{n}:active_s', active, duration(active))}"
            f"{cell(f'run:{n}:pages_per_s', rate, rate_text(active, rate))}</tr>"
        )
    headers = ["run", "spider", "first attempt", "pages (ok)", "retries + errors", "active"]
    return "<h3>Runs (runs.jsonl), newest first</h3>" + table([*headers, "pages/s"], rows)


def shown_runs(report: Report) -> set[int]:
    return {run.number for run in report.runs[-RUN_SECTIONS:]}


def runs_section(report: Report) -> str:
    """One section per run, newest first: its rates over time and its problems."""
    if not report.total.lines:
        return '<h2>Rate</h2><p class="note">No action log: no rates to show.</p>'
    parts = []
    for run in reversed(report.runs[-RUN_SECTIONS:]):
        parts.append(run_section(run, report.stored))
    return "".join(parts)


def run_section(run: RunReport, stored: set[str]) -> str:
    stats, n = run.total, run.number
    head = f'<h2 id="run-{n}">{escape(run_title(run))}</h2>'
    if not stats.lines:
        return head + '<p class="note">No attempts logged in this run.</p>'
    pace = Pace.of(stats)
    active, rate, byte_rate = pace.active, pace.pages_per_second, pace.bytes_per_second
    tiles = [
        ("pages (ok)", stat(f"run:{n}:ok", stats.pages)),
        ("cache hits", stat(f"run:{n}:cache_hit", stats.outcomes["cache_hit"])),
        ("retries", stat(f"run:{n}:retry", stats.outcomes["retry"])),
        ("errors", stat(f"run:{n}:error", stats.outcomes["error"])),
        ("active time", stat(f"run:{n}:active", active, duration(active))),
        ("pages/s", stat(f"run:{n}:rate", rate, rate_text(active, rate))),
        ("stored per second", stat(f"run:{n}:bytes_per_s", byte_rate, bytes_rate_text(byte_rate))),
    ]
    html = "".join(
        f'<div class="tile">{value}<span>{escape(label)}</span></div>' for label, value in tiles
    )
    parts = [head, f'<div class="tiles">{html}</div>']
    width, bins = stats.series()
    if len(run.tasks) > 1:
        series = {name: s.series(min_width=width) for name, s in run.tasks.items() if s.lines}
        caption = "Pages and bytes stored per second, one line per task"
    else:
        series = {"all": (width, bins)}
        caption = "Pages and bytes stored per second"
    bin_width = max(w for w, _ in series.values())
    parts.append(
        figure(
            f"rate-r{n}",
            plots.rate_figure(f"rate-r{n}", series),
            f"{caption} ({bin_width} s bins)",
        )
    )
    parts.append(
        figure(
            f"outcomes-r{n}",
            plots.outcome_figure(f"outcomes-r{n}", width, bins),
            f"Attempts per second by outcome ({width} s bins)",
        )
    )
    parts.append(problems_table(stats, f"run:{n}", stored))
    return "".join(parts)


def problems_table(stats: LogStats, prefix: str, stored: set[str]) -> str:
    """Each cause of failed attempts: how often, on how many hosts, how many URLs were
    given up with it; below it, what it means, what became of those URLs, what to do
    (a row of its own, so that it reads in a narrow window)."""
    found = problems(stats, stored)
    if not found:
        return '<p class="note">No retries or errors.</p>'
    rows = []
    for p in found:
        key = f"{prefix}:cause:{p.cause}"
        text = " ".join(part for part in (p.advice, p.fate) if part)
        rows.append(
            f"<tr><td>{escape(p.cause)}</td>{cell(key, p.attempts)}"
            f"<td class='n'>{p.hosts:,}</td>{cell(f'{prefix}:givenup:{p.cause}', p.given_up)}"
            f"</tr><tr class='more'><td colspan='4' class='text' data-fate='{escape(p.cause)}'>"
            f"{escape(text)}</td></tr>"
        )
    headers = ["cause", "failed attempts", "hosts", "URLs given up"]
    return "<h3>Problems</h3>" + table(headers, rows)


def catalog_section(report: Report) -> str:
    catalog = report.catalog
    if catalog is None or not catalog.rows:
        return '<h2>Catalog</h2><p class="note">No catalog rows yet.</p>'
    statuses = sorted(catalog.statuses.items())
    types = catalog.content_types.most_common(TOP_TYPES)
    parts = [
        "<h2>Stored pages by status and content type</h2>",
        figure(
            "status",
            plots.bar_figure(
                "status", [str(s) for s, _ in statuses], [n for _, n in statuses], "rows"
            ),
            "Catalog rows by HTTP status",
        ),
        table(
            ["status", "rows"],
            [f"<tr><td>{s}</td>{cell(f'status:{s}', n)}</tr>" for s, n in statuses],
        ),
        figure(
            "types",
            plots.bar_figure("types", [t for t, _ in types], [n for _, n in types], "rows"),
            f"Catalog rows by content type (top {TOP_TYPES})",
        ),
        table(
            ["content type", "rows"],
            [f"<tr><td>{escape(t)}</td>{cell(f'type:{t}', n)}</tr>" for t, n in types],
        ),
        f'<p class="note">Fetched from {escape(catalog.oldest or "-")} '
        f"to {escape(catalog.newest or '-')}.</p>",
    ]
    return "".join(parts)


def hosts_section(total: LogStats) -> str:
    top = failing_hosts(total)
    if not top:
        return '<h2>Hosts with errors</h2><p class="note">No host had retries or errors.</p>'
    kinds = sorted({kind for _, counts in top for kind in counts})
    parts = {kind: [counts[kind] for _, counts in top] for kind in kinds}
    hosts = [host for host, _ in top]
    note = ""
    if total.hosts_dropped:
        note = (
            f'<p class="note">{total.hosts_dropped:,} hosts with few failures were not '
            "tracked to keep memory bounded: counts are lower bounds.</p>"
        )
    rows = []
    for host, counts in top:
        detail = ", ".join(
            f"{escape(k)} {stat(f'hostkind:{host}:{k}', n)}" for k, n in counts.most_common()
        )
        rows.append(
            f"<tr><td>{escape(host)}</td>{cell(f'host:{host}', sum(counts.values()))}"
            f"<td>{detail}</td></tr>"
        )
    return (
        f"<h2>The {len(top)} hosts with most failed attempts</h2>"
        + figure(
            "hosts",
            plots.stacked_bar_figure("hosts", hosts, parts, "failed attempts (retry + error)"),
            "Failed attempts (retries and errors) per host, by cause (all runs)",
        )
        + table(["host", "failed attempts", "causes"], rows)
        + note
    )


def politeness_section(report: Report) -> str:
    rates = report.total.rates
    limits = host_limits(report)
    head = "<h2>Requests per host against its limit</h2>"
    if not limits:
        return head + '<p class="note">No requests logged.</p>' + backoff_table(report)
    plotted = limits[:PLOTTED_HOSTS]
    svg = plots.host_rate_figure(
        "host-rates",
        rates.width,
        [(h.host, rates.series(h.host), h.limit) for h in plotted],
    )
    rows = []
    for h in limits:
        host, limit, ratio = h.host, h.limit, h.ratio
        rows.append(
            f"<tr><td>{escape(host)}</td>{cell(f'hostreq:{host}', h.requests)}"
            f"{cell(f'hostpeak:{host}', h.peak, f'{h.peak:.2f}')}"
            f"{cell(f'hostlimit:{host}', limit or 0, f'{limit:.2f}' if limit else '-')}"
            f"{cell(f'hostratio:{host}', ratio or 0, f'{ratio:.2f}' if ratio else '-')}"
            f"<td data-limit-from='{escape(host)}'>{escape(h.why)}</td></tr>"
        )
    note = (
        f'<p class="note">Requests (every attempt the action logs say was sent, all runs '
        f"and tasks together) per second, in {rates.width} s bins; the dashed line of a "
        "host is the most its settings allow. A peak above 1.0 times the limit means the "
        "host was asked faster than the crawl promised: processes shared it without "
        "sharing its budget (CRAWL_PARTITION=url without HOST_BUDGET_ENABLED).</p>"
    )
    if rates.dropped:
        note += (
            f'<p class="note">{rates.dropped:,} hosts with few requests are not binned '
            "(memory stays bounded).</p>"
        )
    return (
        head
        + figure(
            "host-rates",
            svg,
            f"Requests per second of the {len(plotted)} busiest hosts, against their limits",
        )
        + table(
            [
                "host",
                "requests",
                f"peak req/s ({rates.width} s)",
                "limit req/s",
                "peak / limit",
                "limit from",
            ],
            rows,
        )  # fmt: skip
        + note
        + backoff_table(report)
    )


def backoff_table(report: Report) -> str:
    """Hosts in back-off now (the hub's host table) and hosts that backed off during
    the crawl (the action log's wait lines after a 429 or 503 with Retry-After)."""
    now = [b for b in report.host_budgets if b.backoff_left > 0]
    waits = report.total.rates.waits
    past = sorted(
        ((h, w) for h, w in waits.items() if w.backoffs),
        key=lambda hw: (-hw[1].backoffs, hw[0]),
    )
    parts = ["<h3>Hosts in back-off</h3>"]
    if now:
        parts.append(
            table(
                ["host", "back-off left", "why"],
                [
                    f"<tr><td>{escape(b.key)}</td>"
                    f"{cell(f'backoff:{b.key}', b.backoff_left, duration(b.backoff_left))}"
                    f"<td>{escape(b.backoff_reason or '-')}</td></tr>"
                    for b in now
                ],
            )
        )
    elif report.host_budgets:
        parts.append('<p class="note">None now, as the hub says.</p>')
    if past:
        parts.append(
            table(
                ["host", "back-offs waited", "seconds waited (all waits)", "last reason"],
                [
                    f"<tr><td>{escape(host)}</td>{cell(f'backoffs:{host}', w.backoffs)}"
                    f"{cell(f'waited:{host}', round(w.seconds, 1), f'{w.seconds:,.1f}')}"
                    f"<td>{escape(w.last_backoff or '-')}</td></tr>"
                    for host, w in past[:TOP_HOSTS]
                ],
            )
        )
    elif not now:
        parts.append(
            '<p class="note">No back-off logged (a 429 or 503 with Retry-After makes '
            "every process wait for its host).</p>"
        )
    return "".join(parts)


def proxy_section(total: LogStats, hub: HubSummary | None) -> str:
    parts = ["<h2>Proxies</h2>"]
    if hub is None and not total.proxy_outcomes:
        return parts[0] + '<p class="note">No hub set (HUB_URL) and no proxy in the log.</p>'
    if hub is not None:
        parts.append(f'<p class="note">Hub {escape(hub.url)}</p>')
        if not hub.proxies:
            parts.append('<p class="note">The hub holds no proxies.</p>')
        else:
            labels = [p.url for p in hub.proxies]
            parts.append(
                figure(
                    "proxies",
                    plots.bar_figure(
                        "proxies", labels, [p.total_uses for p in hub.proxies], "requests"
                    ),
                    "Requests sent through each proxy (hub)",
                )
            )
            parts.append(
                figure(
                    "leases",
                    plots.lease_figure("leases", lease_spans(hub)),
                    "Leases per proxy, coloured by how they ended; hatched: resting",
                )
            )
            rows = []
            for p in hub.proxies:
                leases = sum(1 for lease in hub.leases if lease.proxy_id == p.id)
                resting = p.resting_until if p.resting_until and p.resting_until > hub.now else None
                rows.append(
                    f"<tr><td class='url'>{escape(p.url)}</td><td>{escape(p.state)}"
                    f"{'' if p.enabled else ' (disabled)'}</td>"
                    f"{cell(f'proxy:{p.url}:requests', p.total_uses)}"
                    f"{cell(f'proxy:{p.url}:failures', p.failures)}"
                    f"{cell(f'proxy:{p.url}:bans', p.bans)}{cell(f'proxy:{p.url}:leases', leases)}"
                    f"<td>{when(resting)}</td></tr>"
                )
            headers = ["proxy", "state", "requests", "failures", "bans", "leases", "resting until"]
            parts.append(table(headers, rows))
    if total.proxy_outcomes:
        rows = []
        for proxy, counts in sorted(total.proxy_outcomes.items()):
            cells = "".join(cell(f"proxylog:{proxy}:{o}", counts[o]) for o in OUTCOMES)
            rows.append(f"<tr><td class='url'>{escape(proxy)}</td>{cells}</tr>")
        parts.append("<p>Attempts per proxy in the action log:</p>")
        parts.append(table(["proxy", *(o.replace("_", " ") for o in OUTCOMES)], rows))
    return "".join(parts)


def queues_section(report: Report) -> str:
    """How much is left of each work queue of the hub (a Slurm queue run's lists)."""
    if not report.queues:
        return ""
    rows = []
    for q in report.queues:
        eta = "done" if q.eta == 0 else "unknown" if q.eta is None else duration(q.eta)
        cells = "".join(
            cell(f"queue:{q.name}:{part}", getattr(q, part))
            for part in ("total", "done", "pending", "leased", "expired", "failed")
        )
        eta_cell = cell(f"queue:{q.name}:eta", -1 if q.eta is None else q.eta, eta)
        rows.append(f"<tr><td>{escape(q.name)}</td>{cells}{eta_cell}</tr>")
    headers = ["queue", "URLs", "done", "pending", "leased", "expired leases", "failed", "ETA"]
    return (
        "<h2>How much is left</h2>"
        '<p class="note">The hub\'s work queues; ETA at the rate of the last 10 minutes.</p>'
        + table(headers, rows)
    )


def items_section(report: Report) -> str:
    catalog = report.catalog
    if catalog is None or not catalog.items:
        return '<h2>Item tables</h2><p class="note">No item tables in the catalog.</p>'
    tables = sorted(catalog.items.values(), key=lambda t: t.name)
    shares = [t.pages / catalog.rows if catalog.rows else 0.0 for t in tables]
    rows = [
        f"<tr><td>{escape(t.name)}</td>{cell(f'items:{t.name}:rows', t.rows)}"
        f"{cell(f'items:{t.name}:pages', t.pages)}"
        f"{cell(f'items:{t.name}:share', share, f'{share:.1%}')}</tr>"
        for t, share in zip(tables, shares, strict=True)
    ]
    return (
        "<h2>Item tables</h2>"
        + figure(
            "items",
            plots.bar_figure("items", [t.name for t in tables], [s * 100 for s in shares], "%"),
            "Share of stored pages each item table covers (distinct _key / catalog rows)",
        )
        + table(["table", "rows", "pages covered", "share of stored pages"], rows)
    )


def settings_section(settings: list[tuple[str, str]], run: dict | None = None) -> str:
    if not settings:
        return ""
    if run is None:
        origin = (
            "<p>The settings this report command sees (the data directory has no runs.jsonl).</p>"
        )
    else:
        origin = (
            f'<p data-run-spider="{escape(str(run.get("spider", "")))}" '
            f'data-run-started="{escape(str(run.get("started", "")))}">'
            f"The settings of the latest run (runs.jsonl): spider "
            f"{escape(str(run.get('spider', '')))}, started {escape(str(run.get('started', '')))}"
            f" on {escape(str(run.get('host', '')))}, pid {escape(str(run.get('pid', '')))}.</p>"
        )
    rows = [
        f'<tr><td>{escape(name)}</td><td data-setting="{escape(name)}">{escape(value)}</td></tr>'
        for name, value in settings
    ]
    return "<h2>Settings</h2>" + origin + table(["setting", "value"], rows)

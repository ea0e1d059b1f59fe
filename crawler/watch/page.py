"""``scrapy job serve``: the live view as an HTML page in the report's look (its style,
tiles, tables and matplotlib figures: ``crawler/report/html.py``, ``plots.py``).

:func:`render_page` is the whole page; :func:`render_main` the part a small script
(:data:`SCRIPT`, served as ``live.js``) fetches again every few seconds and puts in
place. Every number a reader (or a test) may check carries ``data-stat`` and
``data-value``, as in the report; each process row its state in ``data-state``.
Nothing on it names a credential: proxies and the hub by their redacted URLs, errors
redacted by the processes that wrote them.
"""

from __future__ import annotations

from html import escape

from crawler.report import plots
from crawler.report.html import STYLE, bytes_rate_text, cell, figure, size, stat, table, when
from crawler.storage.actionlog import OUTCOMES
from crawler.watch.model import (
    PROBLEMS,
    STATES,
    WAITING,
    JobView,
    ProcessView,
    failure_counts,
    node_rates,
)

# Nodes drawn each with its own line; the others are one line together.
PLOTTED_NODES = 11

LIVE_STYLE = """
body{max-width:96em}h1{overflow-wrap:anywhere}td.hosts{white-space:nowrap}
h1{overflow-wrap:anywhere}
tr.dead,tr.stalled{background:#fde2e1}tr.waiting{background:#fff3cd}tr.finished{color:#777}
.problems{border-left:4px solid #e76f51;padding:.3em .8em;background:#fdf0ee}
.problems li{overflow-wrap:anywhere}#status{color:#555;font-size:.9em}
#status.stale{color:#b00020;font-weight:600}
"""

SCRIPT = """(() => {
  const main = document.getElementById("view");
  const status = document.getElementById("status");
  const every = 1000 * Number(document.body.dataset.refresh || 5);
  const token = new URLSearchParams(location.search).get("token");
  const url = "view" + (token ? "?token=" + encodeURIComponent(token) : "");
  async function refresh() {
    try {
      const answer = await fetch(url, {cache: "no-store"});
      const text = await answer.text();
      if (answer.ok) {
        main.innerHTML = text;
        status.textContent = "updated " + new Date().toLocaleTimeString();
        status.className = "";
      } else {
        status.textContent = "not updated: " + text;
        status.className = "stale";
      }
    } catch (error) {
      status.textContent = "not updated: the server does not answer (stopped?)";
      status.className = "stale";
    }
    setTimeout(refresh, every);
  }
  setTimeout(refresh, every);
})();
"""


def render_page(view: JobView, refresh: float, main: str | None = None) -> str:
    """The whole page, its view as of now (*main*: :func:`render_main` of it, if made
    already); ``live.js`` refreshes it every *refresh* seconds."""
    name = view.job if view.job is not None else "every job"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>Live: {escape(name)}</title><style>{STYLE}{LIVE_STYLE}</style>"
        '<script src="live.js" defer></script>'
        f'<noscript><meta http-equiv="refresh" content="{refresh:g}"></noscript>'
        f'</head><body data-refresh="{refresh:g}">'
        f'<p id="status">every {refresh:g} s</p>'
        f'<main id="view">{main if main is not None else render_main(view)}</main>'
        "</body></html>\n"
    )


def render_main(view: JobView) -> str:
    return "".join(
        [
            f"<h1>Live: {escape(view.title())}</h1>",
            tiles(view),
            problems(view),
            figures(view),
            processes(view),
            hosts(view),
            proxies(view),
        ]
    )


def tiles(view: JobView) -> str:
    t = view.totals
    eta = view.eta
    items = [
        ("processes", stat("job:processes", t.processes)),
        # Dead and stalled always, to be seen at 0 too; the other states when some are.
        *[
            (state, stat(f"state:{state}", view.counts.get(state, 0)))
            for state in STATES
            if state in PROBLEMS or view.counts.get(state)
        ],
        ("pages fetched", stat("job:pages", t.pages)),
        ("pages/s now", stat("job:pages_per_s", round(t.pages_per_s, 2), f"{t.pages_per_s:,.1f}")),
        (
            "received now",
            stat("job:bytes_per_s", round(t.bytes_per_s), bytes_rate_text(t.bytes_per_s)),
        ),
        ("errors", stat("job:errors", t.errors)),
        ("retries", stat("job:retries", t.retries)),
        ("proxy bans", stat("job:bans", t.bans)),
        ("host waits", stat("job:host_waits", t.host_waits)),
        ("rows not yet committed", stat("job:lag", t.lag)),
        ("ETA", stat("job:eta", -1 if eta is None else round(eta), view.eta_text())),
    ]
    if t.list_total:
        items.append(
            (
                "listed URLs done",
                stat("job:list_done", t.list_done, f"{t.list_done:,} of {t.list_total:,}"),
            )
        )
    queue = view.snapshot.queue
    if queue is not None:
        p = queue.progress
        items.append(
            (
                f"queue {view.snapshot.queue_name}",
                stat("queue:done", p.done, f"{p.done:,} of {p.total:,}"),
            )
        )
    html = "".join(
        f'<div class="tile">{value}<span>{escape(label)}</span></div>' for label, value in items
    )
    if not view.every:
        who = f"of job {view.job!r} " if view.job is not None else ""
        return (
            f'<div class="tiles">{html}</div><p id="empty" class="empty">No crawl process {escape(who)}'
            "has reported to this hub yet.</p>"
        )
    return f'<div class="tiles">{html}</div>'


def problems(view: JobView) -> str:
    found = view.problems
    if not found:
        return ""
    items = "".join(
        f'<li data-problem="{escape(p.beat.id)}"><strong>{escape(p.state)}</strong>: '
        f"{escape(p.name)} (task {escape(p.beat.task or '-')}): {escape(p.why())}; "
        f"read <code>{escape(p.log)}</code></li>"
        for p in found
    )
    return f'<h2>Problems</h2><div class="problems"><ul>{items}</ul></div>'


def figures(view: JobView) -> str:
    now = view.snapshot.now
    rates = node_rates(view.every, now)
    if not rates:
        return ""
    lines = _plotted(rates)
    step = int((view.every[0].beat.detail.get("series") or {}).get("step") or 30)
    slots = {outcome: n for n, outcome in enumerate(OUTCOMES)}
    bins = []
    for start, errors, retries in failure_counts(view.every, now):
        counts = [0.0] * len(OUTCOMES)
        counts[slots["error"]], counts[slots["retry"]] = errors, retries
        bins.append((start, counts))
    drawn = figure(
        "node-rates",
        plots.host_rate_figure("node-rates", step, lines, ylabel="pages/s"),
        "Pages/s per node",
    )
    if any(any(counts) for _, counts in bins):
        drawn += figure(
            "failures",
            plots.outcome_figure("failures", step, bins),
            "Errors and retries per second, every node",
        )
    else:
        drawn += '<p id="no-failures" class="note">No errors and no retries in the last hour.</p>'
    return "<h2>The last hour</h2>" + drawn


def _plotted(rates: dict[str, list[tuple[float, float]]]) -> list[tuple[str, list, None]]:
    """One line per node, the busiest first; past PLOTTED_NODES, the rest as one."""
    ranked = sorted(rates, key=lambda node: -sum(r for _, r in rates[node][-4:]))
    lines: list[tuple[str, list, None]] = [
        (node, rates[node], None) for node in ranked[:PLOTTED_NODES]
    ]
    rest = ranked[PLOTTED_NODES:]
    if rest:
        summed: dict[float, float] = {}
        for node in rest:
            for start, rate in rates[node]:
                summed[start] = summed.get(start, 0.0) + rate
        lines.append((f"{len(rest)} other nodes", sorted(summed.items()), None))
    return lines


def process_row(p: ProcessView) -> str:
    beat = p.beat
    key = f"process:{beat.id}"
    kind = "waiting" if p.state in WAITING else p.state.split()[0]
    proxies = ", ".join(p.proxies()) or "-"
    why = p.why()
    if p.problem:
        why += f"; read {p.log}"
    return (
        f'<tr class="{kind}" data-state="{escape(p.state)}" data-process="{escape(beat.id)}">'
        f"<td>{escape(beat.node)}</td><td>{escape(beat.task or '-')}</td>"
        f"{cell(f'{key}:pid', beat.pid, str(beat.pid))}<td>{escape(p.state)}</td>"
        f"{cell(f'{key}:pages_per_s', round(p.pages_per_s, 2), f'{p.pages_per_s:,.1f}')}"
        f"{cell(f'{key}:pages', beat.pages)}{cell(f'{key}:errors', beat.errors)}"
        f"{cell(f'{key}:bans', beat.bans)}{cell(f'{key}:lag', beat.lag)}"
        f"{cell(f'{key}:rss', beat.rss, size(beat.rss))}"
        f'<td class="hosts">{p.hosts_text()}</td><td>{escape(proxies)}</td>'
        f'<td title="{when(beat.updated)}">{p.age:.0f} s ago</td><td>{escape(why)}</td>'
        f'<td class="text">{escape(p.last_error or "-")}</td></tr>'
    )


def processes(view: JobView) -> str:
    if not view.every:
        return ""
    headers = [
        "node", "task", "pid", "state", "pages/s", "pages", "errors", "bans",
        "lag", "peak RSS", "hosts", "proxies", "last heartbeat", "why", "last error",
    ]  # fmt: skip
    return f"<h2>Processes ({escape(view.options.describe())})</h2>" + table(
        headers, [process_row(p) for p in view.shown]
    )


def hosts(view: JobView) -> str:
    if not view.hosts:
        return ""
    rows = [
        f"<tr><td>{escape(h.host)}</td>{cell(f'host:{h.host}:waiting', h.waiting)}"
        f"{cell(f'host:{h.host}:holders', h.holders)}"
        f"{cell(f'host:{h.host}:seconds', h.seconds, f'{h.seconds:,.1f} s')}"
        f"{cell(f'host:{h.host}:episodes', h.episodes)}<td>{escape(h.reason or '-')}</td></tr>"
        for h in view.hosts
    ]
    headers = ["host", "waiting now", "processes holding it", "waited", "waits", "why"]
    return "<h2>Hosts most waited on</h2>" + table(headers, rows)


def proxies(view: JobView) -> str:
    if not view.proxies:
        return ""
    rows = [
        f"<tr><td>{escape(p.label)}</td><td>{escape(p.state)}</td>"
        f"{cell(f'proxy:{p.label}:bans', p.bans)}{cell(f'proxy:{p.label}:requests', p.requests)}"
        f"<td>{escape(', '.join(p.holders) or '-')}</td></tr>"
        for p in view.proxies
    ]
    headers = ["proxy", "state", "bans (last hour)", "requests (last hour)", "held by"]
    return "<h2>Proxies most banned</h2>" + table(headers, rows)

"""Scrapy settings of the project.

Every setting of the storage stack is listed here with its default; components read
them once, in their constructors.
"""

from scrapy.settings import default_settings as _scrapy_defaults

BOT_NAME = "crawler"

SPIDER_MODULES = ["spiders"]
NEWSPIDER_MODULE = "spiders"
COMMANDS_MODULE = "commands"

# Polite by default: a crawl of someone else's site should identify itself, obey
# robots.txt and slow down when the server does.
USER_AGENT = (
    "research-crawler/0.1 (+https://example.org/research-crawler; set USER_AGENT to your contact)"
)
ROBOTSTXT_OBEY = True
AUTOTHROTTLE_ENABLED = True
AUTOTHROTTLE_START_DELAY = 1.0
AUTOTHROTTLE_MAX_DELAY = 30.0
# How a list is split between crawl processes (-a shard=, Slurm tasks, work queues):
# "domain" (registered domain), "host" or "url". With "domain" or "host" one process
# at a time fetches a site, so the limits above hold for the site, not per process
# (crawler/partition.py).
CRAWL_PARTITION = "domain"

# Scrapy starts CONCURRENT_ITEMS tasks per response; one is plenty for the small
# number of items a page yields, and it lifts a CPU-bound crawl by about half.
CONCURRENT_ITEMS = 1

# Scrapy's duplicate filter keeps ~100 bytes per distinct request in memory; this one
# moves its fingerprints to a temporary SQLite file (in SQLITE_TMPDIR) once
# DUPEFILTER_MEMORY_FINGERPRINTS are held, and keeps DUPEFILTER_CACHE_MIB of it cached.
DUPEFILTER_CLASS = "extensions.dupefilter.SpillingDupeFilter"
DUPEFILTER_MEMORY_FINGERPRINTS = 100_000
DUPEFILTER_CACHE_MIB = 16

# Scrapy's default resolver asks for IPv4 addresses only: http://[::1]:8080/ and hosts
# with only IPv6 addresses would fail with "DNS lookup failed". This one resolves both
# (getaddrinfo in a thread) and caches as the default does; it does not apply
# DNS_TIMEOUT (the download timeout still bounds each request).
TWISTED_DNS_RESOLVER = "scrapy.resolver.CachingHostnameResolver"
# What bounds a crawl's memory: at most CONCURRENT_REQUESTS bodies are in flight, each
# at most DOWNLOAD_MAXSIZE (a gzip body's decoded size counts; a larger one is
# cancelled, logged, and an error). Scrapy's 1 GiB let one endless response take a
# gigabyte, a few at once several (docs/reference/settings.md). Raise DOWNLOAD_MAXSIZE to store
# larger bodies, and the memory bound with it.
CONCURRENT_REQUESTS = 16
DOWNLOAD_MAXSIZE = 32 * 1024 * 1024
DOWNLOAD_WARNSIZE = 8 * 1024 * 1024
# Twisted's connection pool keeps idle connections for four minutes per host, those the
# server closed too: a crawl over many hosts held every connection of its last minutes.
# This handler keeps at most HTTP_IDLE_CONNECTIONS_MAX idle ones over all hosts, the
# least recently used closed first (crawler/connpool.py).
DOWNLOAD_HANDLERS = {
    "http": "crawler.connpool.PooledHTTPDownloadHandler",
    "https": "crawler.connpool.PooledHTTPDownloadHandler",
}
HTTP_IDLE_CONNECTIONS_MAX = 512
# Scrapy keeps a download slot (its delay, its queue) a minute after a host's last
# request: one for every host of the last minute or two. Past this many, the idle ones
# whose delay is over go, least recently used first (crawler/downloader.py).
DOWNLOAD_SLOTS_MAX = 10_000

TELNETCONSOLE_ENABLED = False
# An HTTP control port on every crawl node is not wanted on a shared cluster.
REMOTE_CONTROL_ENABLED = False
LOG_LEVEL = "INFO"
# At INFO a crawl logs its start, progress, problem URLs and summary; Scrapy's banner,
# component lists and stats dump go to DEBUG. False: Scrapy's own INFO lines as well.
LOG_QUIET = True

# --- Storage -----------------------------------------------------------------------
DATA_DIR = "data"
ARCHIVE_ENABLED = True
# Each run appends a line to DATA_DIR/runs.jsonl (`scrapy shell` does not).
ARCHIVE_RUNS_LOG = True
# Set by `scrapy crawl` to the spider's -a arguments, recorded in runs.jsonl.
SPIDER_ARGUMENTS = {}
# One transaction per CATALOG_BATCH_SIZE rows, and at least every
# CATALOG_FLUSH_SECONDS, so that a slow crawl does not hold rows back.
CATALOG_BATCH_SIZE = 200
CATALOG_FLUSH_SECONDS = 5.0
ARCHIVE_ROLLOVER_BYTES = 1_000_000_000
# Also roll over a file this many seconds after it opened (0: by size only), so that
# closed files can be shipped while the crawl runs (slurm/crawl.sbatch sets it).
ARCHIVE_ROLLOVER_SECONDS = 0
# Glob patterns of other catalogs (read-only) whose URLs count as stored: a Slurm task
# skips what the shared catalog or any task's shipped catalog holds (crawler/storage/seen.py).
CATALOG_SEEN = []
ARCHIVE_PREFIX = "crawl"
# Each record is its own gzip member. ISA-L (isal) at level 1 compresses 50 KB of HTML
# in ~0.08 ms, as small as zlib's level 1 in a quarter of its time; zlib's level 6 takes
# 16x longer for 25% smaller files. Levels: isal 0-3, zlib 0-9.
ARCHIVE_COMPRESSOR = "isal"
ARCHIVE_GZIP_LEVEL = 1
# Records waiting for the writer process; the crawl waits when it is full.
ARCHIVE_QUEUE_BYTES = 1_048_576
# Statuses that are final answers and get a catalog row (other 3xx are followed).
CATALOG_STORE_STATUSES = [200, 201, 202, 203, 204, 205, 206, 300, 301, 302, 303, 307, 308, 404, 410]
PROGRESS_INTERVAL = 10.0
# "warc" (gzip WARC records), "zip" (bodies as <key[:2]>/<key>.<ext> in a zip, headers
# as JSON in each entry's extra field; zips roll over at 65,000 entries) or "sqlite"
# (a bodies(id, key, body, headers, meta) table per file, for SQL over bodies).
# crawler/storage/formats/ holds one module per format.
ARCHIVE_FORMAT = "warc"
# ARCHIVE_FORMAT=sqlite: 0 stores bodies as served, searchable with LIKE; 1-9 stores
# each as a gzip member at that zlib level.
ARCHIVE_SQLITE_GZIP_LEVEL = 0
# A page fetched again whose payload is the one stored for its key is kept as a
# revisit record referring to it ("url"); "digest" also refers to an identical payload
# stored under another URL (an index of digests in the catalog); "off" stores it whole.
ARCHIVE_DEDUP = "url"
# `scrapy shell URL`: "archive" answers cataloged URLs from the archive and fetches (and
# stores) the rest; "offline" answers only from the archive; "live" fetches, storing
# nothing. Offline replay of a whole crawl:
#   scrapy crawl SPIDER -s HTTPCACHE_ENABLED=1 -s ARCHIVE_ENABLED=0 -s HTTPCACHE_IGNORE_MISSING=1
#     -s HTTPCACHE_STORAGE=extensions.archive_cache.ArchiveCacheStorage
ARCHIVE_SHELL = "archive"
# What becomes of a stored request (skipped, replayed, revalidated) and which answers
# are stored: a dotted path to a class like extensions.archive_policy.ArchivePolicy.
ARCHIVE_POLICY = "extensions.archive_policy.ArchivePolicy"

DOWNLOADER_MIDDLEWARES = {
    # Before robots.txt, so a resumed crawl skips stored pages without asking for it.
    "middlewares.archive.ArchiveMiddleware": 75,
    "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware": None,
    "middlewares.robotstxt.RobotsTxtMiddleware": 100,
    "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
    "middlewares.retry.LoggedRetryMiddleware": 550,
    # Between the downloader and HttpCompressionMiddleware (590): sees bodies still
    # compressed, and retries one whose gzip stream was cut short.
    "middlewares.truncated_gzip.TruncatedGzipMiddleware": 595,
    # Inside RedirectMiddleware (600): keeps each redirect for the archive.
    "middlewares.redirect_hops.RedirectHopsMiddleware": 610,
    # Before HttpProxyMiddleware (750), which reads the proxy it sets.
    "middlewares.proxy_lease.ProxyLeaseMiddleware": 740,
    # After the proxy lease (a budget may be per host and proxy), last before the
    # download: a request holds its host's slot only while it is on the wire, and sees
    # the answer (a Retry-After) before any retry.
    "middlewares.host_budget.HostBudgetMiddleware": 745,
}

# Every request ends with an outcome line, whichever component gave up on it
# (crawler/downloader.py).
DOWNLOADER = "crawler.downloader.AccountingDownloader"
# A crawl that is stopping (Ctrl-C, SIGTERM, Slurm's warning signal, CLOSESPIDER_*)
# lets every request that waits go unsent at once and gives those in flight this many
# seconds to be answered; the rest are cut, and the next run fetches them.
CRAWL_CLOSE_GRACE = 5.0

SPIDER_MIDDLEWARES = {
    # Ignored statuses at DEBUG: the action log has their lines, the stats their counts.
    "scrapy.spidermiddlewares.httperror.HttpErrorMiddleware": None,
    "middlewares.httperror.QuietHttpErrorMiddleware": 50,
    # Writes the URLs it drops to the action log, and shortens them in the log.
    "scrapy.spidermiddlewares.urllength.UrlLengthMiddleware": None,
    "middlewares.urllength.LoggedUrlLengthMiddleware": 800,
    # Next to the spider: a stored start request is dropped before Scrapy's own
    # spider middlewares (referer, URL length, depth) spend time on it.
    "middlewares.resume.ResumeSpiderMiddleware": 1010,
    # Next to the engine: it must see every item that reaches the item pipelines.
    "middlewares.items.ItemPagesMiddleware": 1,
}

# Every item goes to a table of the catalog database, committed with its page's row
# (pipelines/catalog.py; docs/how-to/item-tables.md). Keep it last.
CATALOG_ITEMS_ENABLED = True
# A stored page this spider has no items for is parsed from the archive, never
# fetched (with -o: every stored page is, so the feed holds every page's items).
CATALOG_ITEMS_PARSE_STORED = True
ITEM_PIPELINES = {
    "pipelines.catalog.CatalogPipeline": 1000,
}

EXTENSIONS = {
    # The run's storage: session, action log, counters, summary (ARCHIVE_ENABLED).
    "extensions.storage.StorageExtension": 100,
    "extensions.progress.ProgressExtension": 500,
    "extensions.stop_signals.StopSignalsExtension": 500,
    "extensions.timer_sweep.TimerSweepExtension": 500,
    "extensions.job_settings.JobSettingsExtension": 500,
    # A row in the hub per crawl process, for `scrapy job top` and `scrapy job serve`.
    "extensions.heartbeat.HeartbeatExtension": 500,
    "extensions.callback_cache.CallbackCacheExtension": 500,
    # AutoThrottle with 304s lowering the delay as 200s do (revalidating crawls).
    "scrapy.extensions.throttle.AutoThrottle": None,
    "extensions.throttle.RevalidationThrottle": 0,
    # Scrapy's remote control, imported only when REMOTE_CONTROL_ENABLED is on.
    "extensions.remote_control.RemoteControl": 0,
}
# Scrapy's base list without its remote control, whose module imports aiohttp at every
# crawl's start even when the extension is off (extensions/remote_control.py).
EXTENSIONS_BASE = {
    path: order
    for path, order in _scrapy_defaults.EXTENSIONS_BASE.items()
    if path != "scrapy.extensions.remote_control.RemoteControl"
}
# Seconds between firings of a Twisted timer that lets the reactor drop the timers
# downloads cancel (extensions/timer_sweep.py); 0: off.
TIMER_SWEEP_INTERVAL = 5.0

# --- Proxy leases (middlewares/proxy_lease.py) ---------------------------------------
# HUB_URL: sqlite:///relative/hub.db, sqlite:////absolute/hub.db or postgresql://...;
# unset (and no HUB_URL environment variable) means no proxies: the crawl goes direct.
# Manage the pool with `scrapy proxies add|import|list|disable|enable|stats`.
HUB_URL = None
# Seconds to wait for the hub's database at start before failing.
HUB_CONNECT_TIMEOUT = 10.0
# A job in the hub (`scrapy job create`) whose settings the crawl takes, or the HUB_JOB
# environment variable; None: none. Command-line settings win over the job's.
JOB = None
# Seconds between looks at the job's settings while the crawl runs; the ones listed in
# extensions/job_settings.py (concurrency, delay, proxy rotation, rest, bans) apply live.
JOB_REFRESH_SECONDS = 60.0
# A work-queue URL whose crawl failed (an error after every retry: a 5xx, a timeout)
# goes back to the queue for a later crawl, this many times in all; then it is kept as
# failed until `scrapy queue requeue NAME`.
WORK_MAX_ATTEMPTS = 3
# With a hub, every crawl process writes its heartbeat there every HEARTBEAT_SECONDS:
# one row per process, updated in place (extensions/heartbeat.py), that
# `scrapy job top` and `scrapy job serve` show; a process without one for three periods
# shows as dead. False: no row.
HEARTBEAT_ENABLED = True
HEARTBEAT_SECONDS = 5.0
# Set False to crawl direct even with HUB_URL set.
PROXY_ENABLED = True
# A lease runs out this many seconds after its last renewal, so a killed crawl's proxies
# come back by themselves; a heartbeat renews held leases every PROXY_HEARTBEAT_SECONDS
# (0: a third of the TTL).
PROXY_LEASE_TTL = 60.0
PROXY_HEARTBEAT_SECONDS = 0.0
# Let a proxy go after this many requests; it then rests PROXY_REST_SECONDS
# (+/- PROXY_REST_JITTER of it) before anyone may lease it again. A lease that ends
# sooner (its crawl, or a queue batch, ended) rests it for its share: 10 of 50 requests,
# a fifth of the rest.
PROXY_ROTATE_EVERY = 50
PROXY_REST_SECONDS = 60.0
PROXY_REST_JITTER = 0.25
# A banned proxy rests PROXY_BAN_REST_SECONDS, doubled at each ban in a row, at most
# PROXY_BAN_REST_MAX_SECONDS.
PROXY_BAN_REST_SECONDS = 600.0
PROXY_BAN_REST_MAX_SECONDS = 21600.0
# Proxies one crawl process holds at once; its concurrent requests are spread over them,
# each proxy being its own download slot.
PROXY_LEASES_PER_PROCESS = 2
# What counts as a ban: these statuses, any of these strings in the body. A timeout or a
# refused/dropped connection bans a proxy only when it is the proxy's fault: the proxy
# does not answer a connection of its own (it is down), or it failed so for
# PROXY_BAN_FAILED_HOSTS different hosts in a row; otherwise the target is at fault and
# the request is retried as usual. A spider can decide instead with methods
# response_is_ban(request, response) / exception_is_ban(request, exception) (None: default).
PROXY_BAN_STATUSES = [403, 407, 429]
PROXY_BAN_BODY_MARKERS = []
PROXY_BAN_FAILED_HOSTS = 2
# Retries of a request through another proxy after bans (meta max_proxy_ban_retries).
PROXY_MAX_BAN_RETRIES = 3
# With no proxy free, requests wait: the hub is asked again every PROXY_POLL_SECONDS, and
# every PROXY_WAIT_LOG_SECONDS while they wait a warning says how many wait, for how
# long, and when the next proxy's rest or ban ends (`scrapy proxies unban` lifts bans).
PROXY_POLL_SECONDS = 2.0
PROXY_WAIT_LOG_SECONDS = 30.0

# --- Host budgets (middlewares/host_budget.py, crawler/hub/hostbudget.py) -------------
# DOWNLOAD_DELAY and CONCURRENT_REQUESTS_PER_DOMAIN hold for a host across every process
# sharing HUB_URL (without one, within this process): each request waits for a slot of
# its host's budget in the hub. False: each process keeps its own limits, as in Scrapy.
HOST_BUDGET_ENABLED = True
# True: the budget is per (host, proxy) when requests go through leased proxies, each
# proxy looking like one visitor to the host.
HOST_BUDGET_PER_PROXY = False
# A slot held by a process runs out this many seconds after its last renewal (renewed
# every third of it), so a killed process's slots come back by themselves.
HOST_SLOT_TTL = 30.0
# Send times a process takes at once: about this many seconds of a host's schedule.
HOST_SLOT_SECONDS = 10.0
# While requests wait for a host whose slots others hold, the hub is asked again at
# most this many seconds apart.
HOST_POLL_SECONDS = 1.0
# The longest robots.txt Crawl-delay kept to (a longer one is logged and capped).
HOST_CRAWL_DELAY_MAX = 30.0
# The longest Retry-After (of a 429 or 503) every process waits for a host.
HOST_RETRY_AFTER_MAX = 600.0
# A request so answered is retried after the back-off without spending RETRY_TIMES,
# this many times at most (middlewares/retry.py); then as any 429 or 503 is.
RETRY_BACKOFF_TIMES = 10
# robots.txt is fetched once per host per cluster and shared through the hub; a stored
# one older than this many seconds is fetched again.
HOST_ROBOTS_TTL = 86400.0
# Parsed robots.txt files kept, for the hosts met last (a host met again after it was
# dropped has its robots.txt read again, from the hub when there is one).
ROBOTSTXT_CACHE_HOSTS = 10_000
# Seconds a robots.txt may take (once retried); one that does not answer counts as
# none, as Scrapy treats a failed fetch, with a warning naming the host.
HOST_ROBOTS_TIMEOUT = 10.0

FEED_EXPORT_ENCODING = "utf-8"

# --- Rendering (addons/render.py, middlewares/render.py, crawler/render.py) ----------
# Off unless asked for: RENDER_ENABLED, RENDER_URL_PATTERNS, or -a render=1 (the site
# spider renders every request); then the add-on installs scrapy-playwright's download
# handlers and the render middleware. A crawl that renders nothing starts no browser.
ADDONS = {"addons.render.RenderAddon": 0, "addons.job.JobAddon": 0}
RENDER_ENABLED = False
# Regexes of URLs to render: a list, or a dict of regex -> wait spec.
RENDER_URL_PATTERNS = []
# What to wait for after the load event before the DOM is taken: "load",
# "networkidle", "selector=CSS", "timeout=MS", joined with "&". Per request:
# meta["render"] = True or a wait spec, meta["render_wait"]. The default waits, as
# browsertrix does, for the network to go quiet after load (no request for 500 ms),
# so content a script fills from a timer or a fetch() is there; a page that never goes
# quiet is taken as it is after RENDER_TIMEOUT.
RENDER_WAIT = "networkidle"
# Sub-resources the browser does not fetch.
RENDER_BLOCK_RESOURCES = ["image", "media", "font"]
# Pages open at once per browser context, and contexts (one shared, plus one per proxy
# lease); seconds a navigation or wait may take.
RENDER_MAX_PAGES = 4
RENDER_MAX_CONTEXTS = 8
RENDER_TIMEOUT = 30.0
# A visible browser window (run the crawl under `xvfb-run -a` on a machine without a display).
RENDER_HEADED = False
# Chromium binary (also the CHROMIUM_PATH environment variable); unset: Playwright's own
# browser if installed, else Debian's /usr/lib/chromium/chromium.
CHROMIUM_PATH = None

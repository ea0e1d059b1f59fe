"""Every setting a crawl reads, declared once, and the one check of a value.

:data:`SPECS` declares each setting of the project, and the settings of Scrapy the
project reads or its users set, with its kind (boolean, integer, finite number, text,
list, JSON object), its range, its choices, the shape of a dict, and whether it names
a place inside ``DATA_DIR``. :func:`check_value` checks one value as a crawl would
read it, whatever it came from: ``-s`` (text), the environment (``HUB_URL``,
``HUB_JOB``, ``CHROMIUM_PATH``), the project's settings module or a spider's
``custom_settings`` (Python values), a job in the hub (``scrapy job create|set``,
text). A bad value is a :class:`SettingValueError` whose one-line message names the
setting, the value and what to give; commands print it and exit 2.

A name declared nowhere is checked by the type of its default, when it has one
(``defaults``: Scrapy's and the project's, handed in by the caller, since the hub and
this module import no Scrapy); a name with no default at all is a spider's own or a
typo: :func:`unknown_name` says so, with the closest known name.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

BOOL = "bool"
INT = "int"
FLOAT = "float"
TEXT = "text"
LIST = "list"
DICT = "dict"
ANY = "any"
# A file name prefix: what it names stays inside DATA_DIR (no separator, no "..").
NAME = "name"

# Settings read from the environment when unset (crawler/hub/db.py, addons/job.py,
# crawler/render.py): environment variable -> setting.
ENVIRONMENT = {"HUB_URL": "HUB_URL", "HUB_JOB": "JOB", "CHROMIUM_PATH": "CHROMIUM_PATH"}


class SettingValueError(ValueError):
    """A setting's value no crawl can use; the message names the setting, the value and
    what to give."""


@dataclass(frozen=True)
class Spec:
    """What a setting takes."""

    kind: str
    low: float | None = None  # at least
    above: float | None = None  # more than
    high: float | None = None  # at most
    below: float | None = None  # less than
    choices: tuple[str, ...] = ()  # of a text, or of each element of a list
    fold_case: bool = False  # choices in any case
    element: str | None = None  # a list's elements: INT or TEXT
    values: str | None = None  # a dict's values: ORDER, FEED, SIZE, or None (any)
    optional: bool = False  # None or empty: unset
    prefixes: tuple[str, ...] = ()  # a text must start with one of them
    what: str = ""  # what the value is, in a message ("seconds", "HTTP statuses")
    numbers_too: bool = False  # besides the choices, an integer (a log level)
    secret: bool = False  # may hold credentials: never shown whole in a message


# Shapes of a dict's values.
ORDER = "order"  # a component's order: an integer, or None (off)
FEED = "feed"  # a feed's options: a JSON object with a "format"
SIZE = "size"  # a thumbnail's [width, height]: two integers > 0


def _seconds(low: float | None = 0, above: float | None = None) -> Spec:
    return Spec(FLOAT, low=low if above is None else None, above=above, what="seconds")


def _count(low: int = 0) -> Spec:
    return Spec(INT, low=low)


# ARCHIVE_COMPRESSOR: the gzip compressors of archive records and their highest level.
GZIP_LEVELS = {"isal": 3, "zlib": 9}


def _flag() -> Spec:
    return Spec(BOOL)


def _text(optional: bool = False) -> Spec:
    return Spec(TEXT, optional=optional)


def _orders() -> Spec:
    return Spec(DICT, values=ORDER, what="component paths and their orders")


def _statuses() -> Spec:
    return Spec(LIST, element=INT, low=100, high=599, what="HTTP statuses")


SPECS: dict[str, Spec] = {
    # -- the project's settings (crawler/settings.py) ----------------------------------
    "BOT_NAME": _text(),
    "SPIDER_MODULES": Spec(LIST, element=TEXT),
    "NEWSPIDER_MODULE": _text(),
    "COMMANDS_MODULE": _text(),
    "USER_AGENT": _text(),
    "ROBOTSTXT_OBEY": _flag(),
    "AUTOTHROTTLE_ENABLED": _flag(),
    "AUTOTHROTTLE_START_DELAY": _seconds(),
    "AUTOTHROTTLE_MAX_DELAY": _seconds(),
    "CRAWL_PARTITION": Spec(TEXT, choices=("domain", "host", "url"), fold_case=True),
    "CONCURRENT_ITEMS": _count(1),
    "DUPEFILTER_CLASS": _text(),
    "DUPEFILTER_MEMORY_FINGERPRINTS": _count(1),
    "DUPEFILTER_CACHE_MIB": _count(0),
    "TWISTED_DNS_RESOLVER": _text(),
    "CONCURRENT_REQUESTS": _count(1),
    "DOWNLOAD_MAXSIZE": Spec(INT, low=0, what="bytes"),
    "DOWNLOAD_WARNSIZE": Spec(INT, low=0, what="bytes"),
    "DOWNLOAD_HANDLERS": Spec(DICT, what="URI schemes and their handlers' paths"),
    "HTTP_IDLE_CONNECTIONS_MAX": _count(0),
    "DOWNLOAD_SLOTS_MAX": _count(1),
    "TELNETCONSOLE_ENABLED": _flag(),
    "REMOTE_CONTROL_ENABLED": _flag(),
    "LOG_LEVEL": Spec(
        TEXT, choices=("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"), numbers_too=True
    ),
    "LOG_QUIET": _flag(),
    "DATA_DIR": _text(),
    "ARCHIVE_ENABLED": _flag(),
    "ARCHIVE_RUNS_LOG": _flag(),
    "SPIDER_ARGUMENTS": Spec(DICT),
    "CATALOG_BATCH_SIZE": _count(1),
    "CATALOG_FLUSH_SECONDS": _seconds(),
    "ARCHIVE_ROLLOVER_BYTES": Spec(INT, low=1, what="bytes"),
    "ARCHIVE_ROLLOVER_SECONDS": _seconds(),
    "CATALOG_SEEN": Spec(LIST, element=TEXT),
    "ARCHIVE_PREFIX": Spec(NAME),
    "ARCHIVE_COMPRESSOR": Spec(TEXT, choices=tuple(GZIP_LEVELS)),
    "ARCHIVE_GZIP_LEVEL": Spec(INT, low=0, high=9),
    "ARCHIVE_QUEUE_BYTES": Spec(INT, low=65536, what="bytes"),
    "CATALOG_STORE_STATUSES": _statuses(),
    "PROGRESS_INTERVAL": _seconds(),
    "ARCHIVE_FORMAT": Spec(TEXT, choices=("warc", "zip", "sqlite"), fold_case=True),
    "ARCHIVE_SQLITE_GZIP_LEVEL": Spec(INT, low=0, high=9),
    "ARCHIVE_DEDUP": Spec(TEXT, choices=("url", "digest", "off"), fold_case=True),
    "ARCHIVE_SHELL": Spec(TEXT, choices=("archive", "offline", "live"), fold_case=True),
    "ARCHIVE_POLICY": _text(),
    "DOWNLOADER_MIDDLEWARES": _orders(),
    "DOWNLOADER": _text(),
    "SPIDER_MIDDLEWARES": _orders(),
    "CATALOG_ITEMS_ENABLED": _flag(),
    "CATALOG_ITEMS_PARSE_STORED": _flag(),
    "ITEM_PIPELINES": _orders(),
    "EXTENSIONS": _orders(),
    "EXTENSIONS_BASE": _orders(),
    "TIMER_SWEEP_INTERVAL": _seconds(),
    "HUB_URL": Spec(
        TEXT,
        optional=True,
        prefixes=("sqlite:///", "postgresql://", "postgres://"),
        what="a hub URL",
        secret=True,
    ),
    "HUB_CONNECT_TIMEOUT": _seconds(above=0),
    "JOB": _text(optional=True),
    "JOB_REFRESH_SECONDS": _seconds(above=0),
    "PROXY_ENABLED": _flag(),
    "PROXY_LEASE_TTL": _seconds(above=0),
    "PROXY_HEARTBEAT_SECONDS": _seconds(),
    "PROXY_ROTATE_EVERY": _count(1),
    "PROXY_REST_SECONDS": _seconds(),
    "PROXY_REST_JITTER": Spec(FLOAT, low=0, below=1, what="a share of the rest"),
    "PROXY_BAN_REST_SECONDS": _seconds(),
    "PROXY_BAN_REST_MAX_SECONDS": _seconds(),
    "PROXY_LEASES_PER_PROCESS": _count(1),
    "PROXY_BAN_STATUSES": _statuses(),
    "PROXY_BAN_BODY_MARKERS": Spec(LIST, element=TEXT),
    "PROXY_BAN_FAILED_HOSTS": _count(1),
    "PROXY_MAX_BAN_RETRIES": _count(0),
    "PROXY_POLL_SECONDS": _seconds(above=0),
    "PROXY_WAIT_LOG_SECONDS": _seconds(above=0),
    "HOST_BUDGET_ENABLED": _flag(),
    "HOST_BUDGET_PER_PROXY": _flag(),
    "HOST_SLOT_TTL": _seconds(above=1),
    "HOST_SLOT_SECONDS": _seconds(),
    "HOST_POLL_SECONDS": _seconds(above=0),
    "HOST_CRAWL_DELAY_MAX": _seconds(),
    "HOST_RETRY_AFTER_MAX": _seconds(),
    "RETRY_BACKOFF_TIMES": _count(0),
    "HOST_ROBOTS_TTL": _seconds(),
    "HOST_ROBOTS_TIMEOUT": _seconds(above=0),
    "ROBOTSTXT_CACHE_HOSTS": _count(1),
    "CRAWL_CLOSE_GRACE": _seconds(),
    "WORK_MAX_ATTEMPTS": _count(1),
    "HEARTBEAT_ENABLED": _flag(),
    "HEARTBEAT_SECONDS": _seconds(above=0),
    "FEED_EXPORT_ENCODING": _text(),
    "ADDONS": _orders(),
    "RENDER_ENABLED": _flag(),
    "RENDER_URL_PATTERNS": Spec(ANY),
    "RENDER_WAIT": _text(),
    "RENDER_BLOCK_RESOURCES": Spec(LIST, element=TEXT),
    "RENDER_MAX_PAGES": _count(1),
    "RENDER_MAX_CONTEXTS": _count(1),
    "RENDER_TIMEOUT": _seconds(above=0),
    "RENDER_HEADED": _flag(),
    "CHROMIUM_PATH": _text(optional=True),
    # -- set by the project's commands and add-ons, not by users --------------------------
    "JOB_VERSION": Spec(INT, low=0, optional=True),
    "JOB_SETTINGS_READ": Spec(DICT),
    "REPARSING": _flag(),
    # -- Scrapy's, as the project reads them or users set them ----------------------------
    "DOWNLOAD_DELAY": _seconds(),
    "RANDOMIZE_DOWNLOAD_DELAY": _flag(),
    "DOWNLOAD_TIMEOUT": _seconds(),
    "DNS_TIMEOUT": _seconds(),
    "CONCURRENT_REQUESTS_PER_DOMAIN": _count(1),
    "AUTOTHROTTLE_TARGET_CONCURRENCY": Spec(FLOAT, above=0),
    "RETRY_ENABLED": _flag(),
    "RETRY_TIMES": _count(0),
    "RETRY_HTTP_CODES": _statuses(),
    "HTTPERROR_ALLOWED_CODES": _statuses(),
    "HTTPERROR_ALLOW_ALL": _flag(),
    "REDIRECT_MAX_TIMES": _count(0),
    "DEPTH_LIMIT": _count(0),
    "URLLENGTH_LIMIT": _count(0),
    "CLOSESPIDER_TIMEOUT": _seconds(),
    "CLOSESPIDER_ITEMCOUNT": _count(0),
    "CLOSESPIDER_PAGECOUNT": _count(0),
    "CLOSESPIDER_ERRORCOUNT": _count(0),
    "FEEDS": Spec(DICT, values=FEED, what="feed URIs and their options"),
    "FILES_STORE": _text(optional=True),
    "IMAGES_STORE": _text(optional=True),
    "FILES_EXPIRES": Spec(INT, low=0, what="days"),
    "IMAGES_EXPIRES": Spec(INT, low=0, what="days"),
    "IMAGES_THUMBS": Spec(DICT, values=SIZE, what="thumbnail ids and their [width, height]"),
}

# Settings checked together: (names, check of their values, what to give).
COMBINATIONS: list[tuple[tuple[str, ...], Callable[..., bool], str]] = [
    (
        ("ARCHIVE_COMPRESSOR", "ARCHIVE_GZIP_LEVEL"),
        lambda compressor, level: level <= GZIP_LEVELS.get(compressor, 9),
        "ARCHIVE_GZIP_LEVEL is 0-3 with ARCHIVE_COMPRESSOR=isal (0-9 with zlib)",
    ),
    (
        ("PROXY_HEARTBEAT_SECONDS", "PROXY_LEASE_TTL"),
        lambda heartbeat, ttl: heartbeat < ttl,
        "PROXY_HEARTBEAT_SECONDS is less than PROXY_LEASE_TTL",
    ),
    (
        ("PROXY_BAN_REST_SECONDS", "PROXY_BAN_REST_MAX_SECONDS"),
        lambda rest, most: most >= rest,
        "PROXY_BAN_REST_MAX_SECONDS is at least PROXY_BAN_REST_SECONDS",
    ),
]


# -- reading a value as a crawl reads it (Scrapy's typed getters) -------------------------


def _as_bool(value: object) -> bool:
    # Scrapy's getbool.
    try:
        return bool(int(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        if value in ("True", "true"):
            return True
        if value in ("False", "false"):
            return False
        raise ValueError(value) from None


def _as_list(value: object) -> list:
    # Scrapy's getlist.
    if isinstance(value, str):
        return value.split(",")
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ValueError(value)


def _as_dict(value: object) -> dict:
    # Scrapy's getdict: a dict, a Settings object (dict defaults are BaseSettings), or
    # JSON text of an object.
    if isinstance(value, str):
        value = json.loads(value)
    copy = getattr(value, "copy_to_dict", None)
    if copy is not None:
        value = copy()
    if not isinstance(value, Mapping):
        raise ValueError(value)
    return dict(value)


def _number(value: object, kind: str) -> float:
    if isinstance(value, bool):
        raise ValueError(value)
    got = int(value) if kind == INT else float(value)  # type: ignore[arg-type]
    if kind == FLOAT and not math.isfinite(got):
        raise ValueError(value)
    return got


# -- what to give, in words -----------------------------------------------------------


def _range(spec: Spec) -> str:
    if spec.low is not None and spec.high is not None:
        return f"from {spec.low:g} to {spec.high:g}"
    if spec.low is not None and spec.below is not None:
        return f"of at least {spec.low:g} and less than {spec.below:g}"
    if spec.low is not None:
        return f"of at least {spec.low:g}"
    if spec.above is not None:
        return f"more than {spec.above:g}"
    if spec.high is not None:
        return f"of at most {spec.high:g}"
    return ""


def describe(spec: Spec) -> str:
    """What a setting takes, in words ("an integer of at least 1")."""
    kind = spec.kind
    if kind == BOOL:
        return "true or false (True, False, 1 or 0)"
    if kind in (INT, FLOAT):
        noun = "an integer" if kind == INT else "a finite number"
        words = " ".join(w for w in (noun, spec.what and f"({spec.what})", _range(spec)) if w)
        return words
    if kind == LIST and spec.element == INT:
        what = spec.what or "integers"
        bounds = f" ({_range(spec)})" if _range(spec) else ""
        return f"{what}: integers{bounds}, separated by commas"
    if kind == LIST:
        return "a list: values separated by commas"
    if kind == DICT:
        return f"a JSON object of {spec.what}" if spec.what else "a JSON object"
    if kind == NAME:
        return "a file name prefix, not a path (no '/', no '..'): archives stay in DATA_DIR/archive"
    if spec.choices:
        return "one of " + ", ".join(spec.choices) + (" (or a number)" if spec.numbers_too else "")
    if spec.prefixes:
        return f"{spec.what} starting with " + " or ".join(spec.prefixes)
    return "a text"


# -- checks ---------------------------------------------------------------------------


def _problem(name: str, value: object, spec: Spec) -> SettingValueError:
    return SettingValueError(f"{name}={_shown(value, spec.secret)}: give {describe(spec)}")


def _shown(value: object, secret: bool = False) -> str:
    if secret:
        # A URL's credentials (user:password@) are never shown.
        value = re.sub(r"//[^/@]*@", "//***@", str(value))
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _in_range(got: float, spec: Spec) -> bool:
    return not (
        (spec.low is not None and got < spec.low)
        or (spec.above is not None and got <= spec.above)
        or (spec.high is not None and got > spec.high)
        or (spec.below is not None and got >= spec.below)
    )


def convert(name: str, value: object, spec: Spec) -> object:
    """``value`` of setting ``name`` as a crawl reads it; raises SettingValueError."""
    kind = spec.kind
    if spec.optional and value in (None, ""):
        return None
    try:
        if kind == BOOL:
            return _as_bool(value)
        if kind in (INT, FLOAT):
            got = _number(value, kind)
            if not _in_range(got, spec):
                raise ValueError(value)
            return got
        if kind == LIST:
            return _list(value, spec)
        if kind == DICT:
            return _dict(name, value, spec)
        if kind == NAME:
            return _name(value)
        if kind == TEXT:
            return _text_value(value, spec)
    except (TypeError, ValueError):
        raise _problem(name, value, spec) from None
    return value


def _list(value: object, spec: Spec) -> list:
    items = _as_list(value)
    if spec.element == INT:
        items = [_number(item.strip() if isinstance(item, str) else item, INT) for item in items]
        if not all(_in_range(item, spec) for item in items):
            raise ValueError(value)
    return items


def _dict(name: str, value: object, spec: Spec) -> dict:
    got = _as_dict(value)
    shape = spec.values
    for key, item in got.items():
        if shape == ORDER and item is not None:
            _number(item, INT)
        elif shape == FEED and not (isinstance(item, Mapping) and item.get("format")):
            raise ValueError(value)
        elif shape == SIZE:
            size = _as_list(item)
            if len(size) != 2 or min(_number(n, INT) for n in size) < 1:
                raise ValueError(value)
        if shape in (FEED, SIZE) and not isinstance(key, str):
            raise ValueError(value)
    return got


def _name(value: object) -> str:
    text = str(value)
    if not text or text in (".", "..") or "/" in text or "\\" in text or "\0" in text:
        raise ValueError(value)
    return text


def _text_value(value: object, spec: Spec) -> object:
    if spec.choices:
        text = str(value)
        folded = text.lower() if spec.fold_case else text
        if folded in spec.choices:
            return folded
        if spec.numbers_too and not isinstance(value, bool):
            return int(value)  # type: ignore[arg-type]
        raise ValueError(value)
    if spec.prefixes and not str(value).startswith(spec.prefixes):
        raise ValueError(value)
    return value


def _by_default(name: str, value: object, default: object) -> None:
    """A setting declared nowhere, checked by the type of its default."""
    if isinstance(default, bool):
        spec = Spec(BOOL)
    elif isinstance(default, int):
        spec = Spec(INT)
    elif isinstance(default, float):
        spec = Spec(FLOAT)
    elif isinstance(default, Mapping) or hasattr(default, "copy_to_dict"):
        spec = Spec(DICT)
    else:
        return
    convert(name, value, spec)


def check_value(name: str, value: object, defaults: Mapping[str, object] | None = None) -> object:
    """``value`` of setting ``name`` as a crawl reads it; a SettingValueError when no
    crawl can use it. A name not in :data:`SPECS` is checked by the type of its default
    in ``defaults``; one with neither passes."""
    spec = SPECS.get(name)
    if spec is not None:
        return convert(name, value, spec)
    if defaults is not None and name in defaults:
        _by_default(name, value, defaults.get(name))
    return value


def check_combinations(get: Callable[[str], object]) -> None:
    """Check the settings read together (:data:`COMBINATIONS`); ``get(name)`` gives a
    setting's checked value (None: unset). Raises SettingValueError."""
    for names, holds, rule in COMBINATIONS:
        values = [get(name) for name in names]
        if any(v is None for v in values) or holds(*values):
            continue
        given = ", ".join(f"{n}={v!r}" for n, v in zip(names, values, strict=True))
        raise SettingValueError(f"{given}: give values where {rule}")


def unknown_name(name: str, known: Iterable[str], then: str = "") -> str | None:
    """What to say of a setting ``name`` that is neither declared here nor in ``known``
    (Scrapy's and the project's defaults), ``then`` what becomes of it, and the closest
    known name; None when it is known."""
    if name in SPECS or name in known:
        return None
    close = difflib.get_close_matches(name, set(SPECS).union(known), n=1, cutoff=0.75)
    hint = f"did you mean {close[0]}?" if close else "check the spelling"
    return f"{name} is not a setting of Scrapy or this project{then}; {hint}"


def from_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The settings the environment gives (:data:`ENVIRONMENT`), by setting name."""
    return {
        setting: environ[variable]
        for variable, setting in ENVIRONMENT.items()
        if environ.get(variable)
    }

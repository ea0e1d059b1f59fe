"""What to render with a browser, how long to wait, and where the browser is.

The ``RENDER_*`` settings are parsed here into a :class:`RenderConfig`, which
``addons/render.py`` (settings for scrapy-playwright) and ``middlewares/render.py``
(which requests go to the browser) share. Nothing here imports Playwright.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

DEBIAN_CHROMIUM = "/usr/lib/chromium/chromium"
DEFAULT_BLOCKED = ("image", "media", "font")


class RenderConfigError(ValueError):
    """A RENDER_* setting (or a meta["render"] value) cannot be used as given."""


class BrowserNotFoundError(RenderConfigError):
    """No Chromium to render with."""


def flag(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Wait:
    """What to wait for after the page's ``load`` event, before its DOM is taken.

    Written as a string: ``load`` (nothing more), ``networkidle``, ``selector=CSS``
    (an element matching CSS is attached) or ``timeout=MS`` (a fixed pause); several
    joined with ``&``, e.g. ``selector=#content&timeout=200``. Or as a dict with the
    keys ``selector``, ``networkidle``, ``timeout``.
    """

    selector: str | None = None
    network_idle: bool = False
    timeout_ms: int = 0

    @classmethod
    def parse(cls, spec) -> Wait:
        if isinstance(spec, Wait):
            return spec
        if spec is None or spec is True or spec == "":
            return cls()
        if isinstance(spec, dict):
            return cls(
                selector=spec.get("selector"),
                network_idle=flag(spec.get("networkidle", False)),
                timeout_ms=int(spec.get("timeout", 0)),
            )
        selector, idle, timeout = None, False, 0
        for part in str(spec).split("&"):
            name, _, value = part.strip().partition("=")
            if name == "load":
                continue
            if name == "networkidle":
                idle = True
            elif name == "selector" and value:
                selector = value
            elif name == "timeout" and value.isdigit():
                timeout = int(value)
            else:
                raise RenderConfigError(
                    f"render wait {spec!r}: expected load, networkidle, selector=CSS or "
                    "timeout=MS (joined with &)"
                )
        return cls(selector=selector, network_idle=idle, timeout_ms=timeout)


@dataclass(frozen=True)
class RenderConfig:
    """The RENDER_* settings, read once."""

    enabled: bool = False
    patterns: tuple[tuple[re.Pattern, Wait | None], ...] = ()
    wait: Wait = field(default_factory=Wait)
    blocked: frozenset[str] = frozenset(DEFAULT_BLOCKED)
    max_pages: int = 4
    max_contexts: int = 8
    timeout_ms: int = 30_000
    headed: bool = False
    chromium_path: str | None = None

    @classmethod
    def from_settings(cls, settings, spider=None) -> RenderConfig:
        patterns = _patterns(settings.get("RENDER_URL_PATTERNS") or ())
        render_all = flag(getattr(spider, "render", False))
        max_pages = settings.getint("RENDER_MAX_PAGES", 4)
        max_contexts = settings.getint("RENDER_MAX_CONTEXTS", 8)
        if max_pages < 1 or max_contexts < 1:
            raise RenderConfigError(
                "RENDER_MAX_PAGES and RENDER_MAX_CONTEXTS must be at least 1, not "
                f"{max_pages} and {max_contexts}"
            )
        return cls(
            enabled=settings.getbool("RENDER_ENABLED") or bool(patterns) or render_all,
            patterns=patterns,
            wait=Wait.parse(settings.get("RENDER_WAIT") or "networkidle"),
            blocked=frozenset(settings.getlist("RENDER_BLOCK_RESOURCES", list(DEFAULT_BLOCKED))),
            max_pages=max_pages,
            max_contexts=max_contexts,
            timeout_ms=int(settings.getfloat("RENDER_TIMEOUT", 30.0) * 1000),
            headed=settings.getbool("RENDER_HEADED"),
            chromium_path=settings.get("CHROMIUM_PATH") or os.environ.get("CHROMIUM_PATH"),
        )

    def wait_for(self, url: str) -> Wait | None:
        """The wait of the first RENDER_URL_PATTERNS entry matching ``url`` (None: none)."""
        for pattern, wait in self.patterns:
            if pattern.search(url):
                return wait or self.wait
        return None


def _patterns(value) -> tuple[tuple[re.Pattern, Wait | None], ...]:
    """RENDER_URL_PATTERNS: a list of regexes, or a dict of regex -> wait."""
    if isinstance(value, str):
        value = json.loads(value) if value.strip().startswith(("[", "{")) else [value]
    items = value.items() if isinstance(value, dict) else ((p, None) for p in value)
    out = []
    for pattern, wait in items:
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise RenderConfigError(f"RENDER_URL_PATTERNS: bad regex {pattern!r}: {exc}") from None
        out.append((compiled, None if wait is None else Wait.parse(wait)))
    return tuple(out)


def playwright_browser() -> str | None:
    """The Chromium that ``playwright install chromium`` put in place, if it did."""
    try:
        import playwright
    except ImportError:
        return None
    browsers_json = Path(playwright.__file__).parent / "driver/package/browsers.json"
    try:
        browsers = {
            b["name"]: b["revision"] for b in json.loads(browsers_json.read_text())["browsers"]
        }
    except (OSError, ValueError, KeyError):
        return None
    root = Path(os.environ.get("PLAYWRIGHT_BROWSERS_PATH") or Path.home() / ".cache/ms-playwright")
    candidates = [
        ("chromium-headless-shell", "chromium_headless_shell", "*/chrome-headless-shell"),
        ("chromium-headless-shell", "chromium_headless_shell", "*/headless_shell"),
        ("chromium", "chromium", "*/chrome"),
    ]
    for name, folder, pattern in candidates:
        revision = browsers.get(name)
        if revision:
            for path in sorted((root / f"{folder}-{revision}").glob(pattern)):
                if os.access(path, os.X_OK):
                    return str(path)
    return None


def find_browser(configured: str | None) -> str | None:
    """The Chromium to launch: CHROMIUM_PATH, else Playwright's own, else Debian's.

    Returns None for Playwright's own browser (Playwright finds it itself). Raises
    :class:`BrowserNotFoundError` naming both ways to get one.
    """
    if configured:
        if os.path.isfile(configured) and os.access(configured, os.X_OK):
            return configured
        raise BrowserNotFoundError(
            f"CHROMIUM_PATH={configured}: no executable there. {HOW_TO_GET_ONE}"
        )
    if playwright_browser():
        return None
    if os.access(DEBIAN_CHROMIUM, os.X_OK):
        return DEBIAN_CHROMIUM
    raise BrowserNotFoundError(f"Rendering needs Chromium and none was found. {HOW_TO_GET_ONE}")


HOW_TO_GET_ONE = (
    "Install one with `apt-get install chromium` (Debian's, used from "
    f"{DEBIAN_CHROMIUM}) or `playwright install chromium` (Playwright's own), or point "
    "CHROMIUM_PATH (setting or environment variable) at a Chromium binary."
)


class ResourceBlocker:
    """PLAYWRIGHT_ABORT_REQUEST: drop sub-resources of the blocked types (never the page)."""

    def __init__(self, blocked: frozenset[str]):
        self.blocked = blocked

    def __call__(self, request) -> bool:
        return request.resource_type in self.blocked and not request.is_navigation_request()

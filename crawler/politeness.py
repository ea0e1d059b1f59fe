"""The host policy: every rule of how hard a crawl may ask one host, written once.

A host's *interval* (seconds between two requests to it, every process together) is the
largest of ``DOWNLOAD_DELAY``, its robots.txt ``Crawl-delay`` (capped at
``HOST_CRAWL_DELAY_MAX``) and AutoThrottle's current delay for it; its *concurrency*
(requests in flight at once) is ``CONCURRENT_REQUESTS_PER_DOMAIN``; a 429 or 503 with
``Retry-After`` (seconds or an HTTP date, capped at ``HOST_RETRY_AFTER_MAX``) is a
*back-off*: no request to the host until it ends, retried without spending
``RETRY_TIMES`` up to ``RETRY_BACKOFF_TIMES`` times. A host slot taken from the hub, and a
claim to fetch a host's robots.txt, run out ``HOST_SLOT_TTL`` seconds after their last
renewal.

Everything else takes these numbers from :class:`HostPolicy`: the host-budget middleware
and its gates, the retry middleware, the hub's store (which applies the interval it is
given and never works one out) and the report. No Scrapy and no hub here; settings are
read through the getters Scrapy's settings have (``getfloat``, ``getint``).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Protocol

BACKOFF_STATUSES = (429, 503)
# AutoThrottle's delay for a host that answers in milliseconds: below this, not an
# interval kept cluster-wide.
THROTTLE_FLOOR = 0.05


class Settings(Protocol):
    def getfloat(self, name: str, default: float = 0.0) -> float: ...

    def getint(self, name: str, default: int = 0) -> int: ...


class HostPolicyError(ValueError):
    """A politeness setting has a value no crawl can keep to."""


@dataclass(frozen=True)
class Interval:
    """A host's interval and the setting or signal it comes from."""

    seconds: float
    why: str

    def __str__(self) -> str:
        return f"{self.why} {self.seconds:g} s"


@dataclass(frozen=True)
class HostPolicy:
    delay: float = 0.0  # DOWNLOAD_DELAY
    concurrency: int = 8  # CONCURRENT_REQUESTS_PER_DOMAIN
    crawl_delay_max: float = 30.0  # HOST_CRAWL_DELAY_MAX
    retry_after_max: float = 600.0  # HOST_RETRY_AFTER_MAX
    backoff_times: int = 10  # RETRY_BACKOFF_TIMES
    slot_ttl: float = 30.0  # HOST_SLOT_TTL
    jitter: float = 0.5  # DOWNLOAD_DELAY_JITTER

    SETTINGS = {
        "delay": "DOWNLOAD_DELAY",
        "concurrency": "CONCURRENT_REQUESTS_PER_DOMAIN",
        "crawl_delay_max": "HOST_CRAWL_DELAY_MAX",
        "retry_after_max": "HOST_RETRY_AFTER_MAX",
        "backoff_times": "RETRY_BACKOFF_TIMES",
        "slot_ttl": "HOST_SLOT_TTL",
        "jitter": "DOWNLOAD_DELAY_JITTER",
    }

    @classmethod
    def from_settings(cls, settings: Settings) -> HostPolicy:
        values = {}
        for name, setting in cls.SETTINGS.items():
            default = getattr(cls, name)
            getter = settings.getint if isinstance(default, int) else settings.getfloat
            try:
                values[name] = getter(setting, default)
            except (TypeError, ValueError):
                raise HostPolicyError(
                    f"{setting} must be a number, not {settings.get(setting)!r}"  # type: ignore[attr-defined]
                ) from None
        if _priority(settings, "RANDOMIZE_DOWNLOAD_DELAY") > _priority(
            settings, "DOWNLOAD_DELAY_JITTER"
        ):  # the deprecated switch, set over the jitter: Scrapy's +/-50% or none
            values["jitter"] = 0.5 if settings.getbool("RANDOMIZE_DOWNLOAD_DELAY") else 0.0  # type: ignore[attr-defined]
        policy = cls(**values)
        policy.check()
        return policy

    def check(self) -> None:
        """Refuse values no crawl can keep to, naming the setting."""
        problems = []
        for name, setting in self.SETTINGS.items():
            if not math.isfinite(getattr(self, name)):
                problems.append(f"{setting} must be a finite number")
        if self.delay < 0:
            problems.append("DOWNLOAD_DELAY must be >= 0")
        if self.concurrency < 1:
            problems.append("CONCURRENT_REQUESTS_PER_DOMAIN must be >= 1")
        if self.crawl_delay_max < 0 or self.retry_after_max < 0:
            problems.append("HOST_CRAWL_DELAY_MAX and HOST_RETRY_AFTER_MAX must be >= 0")
        if self.backoff_times < 0:
            problems.append("RETRY_BACKOFF_TIMES must be >= 0")
        if self.slot_ttl <= 1:
            problems.append("HOST_SLOT_TTL must be > 1 (seconds)")
        if self.jitter < 0:
            problems.append("DOWNLOAD_DELAY_JITTER must be >= 0")
        if problems:
            raise HostPolicyError("; ".join(problems))

    def updated(self, settings: Settings) -> HostPolicy:
        """The policy a job's live *settings* give, or this one if they give none a
        crawl can keep to (the job's checks refuse such values before they get here)."""
        try:
            return HostPolicy.from_settings(settings)
        except HostPolicyError:
            return self

    # --- the rules --------------------------------------------------------------------
    def interval(self, crawl_delay: float | None = None, throttle: float = 0.0) -> Interval:
        """The host's interval: the largest of ``DOWNLOAD_DELAY``, its (capped)
        Crawl-delay and AutoThrottle's *throttle* delay for it (one under
        ``THROTTLE_FLOOR`` counts as none: a host that fast is paced by its concurrency,
        and by each process's download slot, which keeps to it still)."""
        return max(
            Interval(self.delay, "DOWNLOAD_DELAY"),
            Interval(throttle if throttle >= THROTTLE_FLOOR else 0.0, "AutoThrottle"),
            Interval(self.crawl_delay(crawl_delay) or 0.0, "Crawl-delay"),
            key=lambda i: i.seconds,
        )

    def gap(self, interval: float, rng: random.Random | None = None) -> float:
        """The wait before a host's next request: its interval, lengthened by up to
        ``DOWNLOAD_DELAY_JITTER`` of it (never shortened: the interval is a floor)."""
        if interval <= 0 or self.jitter <= 0:
            return interval
        return interval * (1 + (rng or random).uniform(0, self.jitter))

    def crawl_delay(self, asked: float | None) -> float | None:
        """The Crawl-delay kept to when robots.txt asks for *asked* seconds (None: none)."""
        if asked is None or not math.isfinite(asked) or asked <= 0:
            return None
        return min(asked, self.crawl_delay_max)

    def backoff(
        self, status: int, retry_after: bytes | str | None, now: float | None = None
    ) -> float | None:
        """Seconds no request may go to a host that answered *status* with this
        ``Retry-After`` header (capped), or None: not a back-off."""
        if status not in BACKOFF_STATUSES:
            return None
        seconds = retry_after_seconds(retry_after, now)
        if seconds is None or seconds <= 0:
            return None
        return min(seconds, self.retry_after_max)

    @property
    def claim_ttl(self) -> float:
        """How long a claim to fetch a host's robots.txt holds without being fulfilled."""
        return self.slot_ttl


def _priority(settings: Settings, name: str) -> int:
    getpriority = getattr(settings, "getpriority", None)
    return (getpriority(name) or 0) if getpriority is not None else 0


def retry_after_seconds(value: bytes | str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (a number or an HTTP date), or None
    when it says nothing usable."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    if not text:
        return None
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


class HostBackoffs:
    """The back-offs in force in this process, per budget key: until when (on the
    caller's monotonic clock) and why. Ended ones are dropped as new ones come, so that
    memory follows the hosts backed off now, not every host ever backed off."""

    SWEEP_AT = 1024

    def __init__(self) -> None:
        self._until: dict[str, tuple[float, str]] = {}

    def set(self, key: str, until: float, reason: str, now: float) -> bool:
        """*key* backs off until *until*; False when a later back-off already stands."""
        if until <= self.until(key, now):
            return False
        if len(self._until) >= self.SWEEP_AT:
            self._until = {k: v for k, v in self._until.items() if v[0] > now}
        self._until[key] = (until, reason)
        return True

    def until(self, key: str, now: float) -> float:
        """When *key*'s back-off ends (0.0: none in force)."""
        held = self._until.get(key)
        if held is None:
            return 0.0
        if held[0] <= now:
            del self._until[key]
            return 0.0
        return held[0]

    def reason(self, key: str) -> str | None:
        held = self._until.get(key)
        return held[1] if held else None

    def __len__(self) -> int:
        return len(self._until)

"""Signals of the project (send them with ``crawler.signals.send_catch_log``)."""

# An attempt to record in the action log. Arguments: url, key, outcome, and any of
# attempt, status, error, elapsed_ms, bytes, depth.
action = object()


def attempt_fields(request) -> dict:
    """What the action log says of one attempt of ``request`` (url and key as listed)."""
    meta = request.meta
    return {
        "url": meta.get("catalog_url", request.url),
        "key": meta.get("catalog_key"),
        "depth": meta.get("depth", 0),
        "attempt": meta.get("retry_times", 0) + 1,
    }


def send_action(crawler, request, outcome: str, **fields) -> None:
    """Send :data:`action` for one attempt of ``request``."""
    crawler.signals.send_catch_log(action, outcome=outcome, **attempt_fields(request), **fields)

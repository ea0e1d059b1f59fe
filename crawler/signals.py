"""Signals of the project (send them with ``crawler.signals.send_catch_log``)."""

# An attempt to record in the action log. Arguments: url, key, outcome, and any of
# attempt, status, error, elapsed_ms, bytes, depth.
action = object()


def send_action(crawler, request, outcome: str, **fields) -> None:
    """Send :data:`action` for one attempt of ``request`` (url and key as listed)."""
    meta = request.meta
    crawler.signals.send_catch_log(
        action,
        url=meta.get("catalog_url", request.url),
        key=meta.get("catalog_key"),
        outcome=outcome,
        depth=meta.get("depth", 0),
        attempt=meta.get("retry_times", 0) + 1,
        **fields,
    )

"""Signals of the project (send them with ``crawler.signals.send_catch_log``)."""

# An attempt to record in the action log. Arguments: url, key, outcome, and any of
# attempt, status, error, elapsed_ms, bytes, depth.
action = object()

"""Errors of the hub, each saying what to fix."""

from __future__ import annotations


class HubError(Exception):
    """A hub operation failed."""


class HubUnavailableError(HubError):
    """The hub at HUB_URL cannot be reached or opened."""


class InvalidHubURLError(HubError, ValueError):
    """HUB_URL is malformed or names an unsupported database."""


class InvalidProxyURLError(HubError, ValueError):
    """A proxy URL is malformed."""

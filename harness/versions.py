"""Installed package versions, for the environment record and for messages that name them."""

from __future__ import annotations

from importlib import metadata


def package_version(name: str) -> str | None:
    """The installed distribution's version, or None where it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None

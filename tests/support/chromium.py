"""Debian's Chromium as the browser tests launch it: by path (no browser is ever downloaded), headless, and without
the background connections this machine's closed network refuses."""

from __future__ import annotations

from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

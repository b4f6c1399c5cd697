"""``python -m bench plumbing``: what opod's HTTP server and its engine client cost a request, set beside bare ones."""

from bench.plumbing.cli import command

__all__ = ["command"]

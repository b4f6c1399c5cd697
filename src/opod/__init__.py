"""opod: a self-hosted LLM inference fleet with one OpenAI-compatible endpoint."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("opod")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+source"

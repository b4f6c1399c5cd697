"""Secrets: API keys and their hashes, node tokens, and the anti-replay window for signed calls."""

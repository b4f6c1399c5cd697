"""The /v1 data path: authenticate, pick a worker, relay the answer, count what was served."""

"""The one error the shard operations raise: a status for the lead's route, a kind, and words with a remedy."""

from __future__ import annotations


class ShardError(Exception):
    """A refused or failed shard operation.

    ``status`` is the HTTP status the ``/admin/v1/shards`` routes should answer
    with: 400 bad input, 404 unknown model or gang, 409 the fleet cannot take
    it now (too few workers, another change under way), 502 a worker failed
    while carrying it out. ``kind`` is a short machine word for the error body.
    """

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message

    def to_body(self) -> dict[str, dict[str, str]]:
        """The leader's ``/admin/v1`` error shape."""
        return {"error": {"message": self.message, "type": self.kind}}


def bad_request(message: str) -> ShardError:
    return ShardError(400, "invalid_request", message)


def not_found(message: str) -> ShardError:
    return ShardError(404, "not_found", message)


def conflict(message: str) -> ShardError:
    return ShardError(409, "conflict", message)


def worker_failed(message: str) -> ShardError:
    return ShardError(502, "worker_failed", message)

"""The typed refusals of the store and the services over it; the edges map them to status codes
(InvalidInput → 400, Forbidden → 403, NotFound → 404, Conflict → 409)."""

from __future__ import annotations


class StoreError(Exception):
    """The store cannot do what was asked: unreachable, closed, or a database error. The message says why."""


class NotFound(StoreError):
    """The named record does not exist."""


class Forbidden(StoreError):
    """The change is not allowed for whom it names (a key for a person in a project they do not belong to)."""


class Conflict(StoreError):
    """The write would break a rule the store keeps (a duplicate id or hash, a token bound elsewhere)."""


class InvalidInput(StoreError, ValueError):
    """An argument the store refuses before touching the database (empty id, naive datetime, bad JSON)."""

"""Capacity quotas: per scope, a guarantee and a limit in GPUs, CPU cores and GB of memory.

A quota is replaced whole: :meth:`QuotasRepo.put_quota` writes every amount, and an
amount left ``None`` is not governed. The scope is kept as answers name it
(``team:ID``); the reconciler counts each model against its owner's scope and every
scope above it (:mod:`opod.fleet.quotas`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Row, delete, select

from opod.store.audit import AuditRow, insert_audit
from opod.store.base import Repository, text_arg, when
from opod.store.errors import InvalidInput, NotFound
from opod.store.schema import QUOTA_KINDS, quotas

RESOURCES = ("gpus", "cpu_cores", "memory_gb")
AMOUNT_MAX = 1 << 40
"""More than any fleet holds: a larger amount is a mistake, not a quota."""


@dataclass(frozen=True, slots=True)
class QuotaAmounts:
    """A guarantee or a limit: ``None`` where it does not govern."""

    gpus: int | None = None
    cpu_cores: int | None = None
    memory_gb: int | None = None

    def governed(self) -> bool:
        return any(getattr(self, r) is not None for r in RESOURCES)


@dataclass(frozen=True, slots=True)
class QuotaRecord:
    scope: str
    kind: str
    guarantee: QuotaAmounts = field(default_factory=QuotaAmounts)
    limit: QuotaAmounts = field(default_factory=QuotaAmounts)
    updated_by: str = ""
    updated_at: datetime | None = None


def _amounts(values: QuotaAmounts, which: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for resource in RESOURCES:
        value = getattr(values, resource)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= AMOUNT_MAX
        ):
            raise InvalidInput(
                f"{which}.{resource}: {value!r} is not an amount; give a whole number from 0 up, or leave it out "
                "for no " + which
            )
        out[f"{which}_{resource}"] = value
    return out


def _record(row: Row[Any]) -> QuotaRecord:
    m = row._mapping
    return QuotaRecord(
        scope=m["scope"],
        kind=m["kind"],
        guarantee=QuotaAmounts(*(m[f"guarantee_{r}"] for r in RESOURCES)),
        limit=QuotaAmounts(*(m[f"limit_{r}"] for r in RESOURCES)),
        updated_by=m["updated_by"],
        updated_at=m["updated_at"],
    )


class QuotasRepo(Repository):
    def list_quotas(self) -> list[QuotaRecord]:
        with self._read() as conn:
            return [_record(row) for row in conn.execute(select(quotas).order_by(quotas.c.scope))]

    def get_quota(self, scope: str) -> QuotaRecord | None:
        with self._read() as conn:
            row = conn.execute(select(quotas).where(quotas.c.scope == text_arg(scope, "quota scope"))).first()
        return _record(row) if row is not None else None

    def put_quota(
        self,
        scope: str,
        kind: str,
        guarantee: QuotaAmounts,
        limit: QuotaAmounts,
        *,
        by: str,
        at: datetime | None = None,
        audit: AuditRow | None = None,
    ) -> QuotaRecord:
        """Replace ``scope``'s quota whole (a new one, or every amount of the old); its audit row in the same transaction.

        Refused (``InvalidInput``, nothing written) when an amount is not a whole number from 0, or a
        guarantee is above the limit of the same resource.
        """
        if kind not in QUOTA_KINDS:
            raise InvalidInput(f"quota scope kind {kind!r} is not one of {', '.join(QUOTA_KINDS)}")
        values: dict[str, Any] = {
            "scope": text_arg(scope, "quota scope"),
            "kind": kind,
            **_amounts(guarantee, "guarantee"),
            **_amounts(limit, "limit"),
            "updated_by": text_arg(by, "quota updated_by", empty=True),
            "updated_at": when(at, "quota updated_at"),
        }
        for resource in RESOURCES:
            floor, ceiling = getattr(guarantee, resource), getattr(limit, resource)
            if floor is not None and ceiling is not None and floor > ceiling:
                raise InvalidInput(
                    f"guarantee.{resource}: {floor} is above limit.{resource} {ceiling}; a scope cannot be "
                    "guaranteed more than it may hold, so lower the guarantee or raise the limit"
                )
        update = {k: v for k, v in values.items() if k != "scope"}
        with self._write() as conn:
            conn.execute(self._upsert(quotas, values, on=["scope"], update=update))
            if audit is not None:
                insert_audit(conn, audit)
            row = conn.execute(select(quotas).where(quotas.c.scope == scope)).one()
        return _record(row)

    def remove_quota(self, scope: str, *, audit: AuditRow | None = None) -> QuotaRecord:
        """Remove ``scope``'s quota (its models are ungoverned from then on); ``NotFound`` when it has none."""
        with self._write() as conn:
            row = conn.execute(select(quotas).where(quotas.c.scope == text_arg(scope, "quota scope"))).first()
            if row is None:
                raise NotFound(f"quota {scope!r}: the scope has no quota; GET /api/v1/quotas lists those that do")
            conn.execute(delete(quotas).where(quotas.c.scope == scope))
            if audit is not None:
                insert_audit(conn, audit)
        return _record(row)

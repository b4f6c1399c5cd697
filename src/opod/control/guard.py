"""``/api/v1/guard``: the guard library (the settings' ``guard`` policies), where its policies are attached, and
what the guards did.

Thin handlers over :class:`~opod.access.guard_service.GuardService`, the one writer of attachments. A target is
``org:NAME``, ``team:ORG/TEAM``, ``project:ORG/TEAM/PROJECT`` (or the ID after the colon), ``user:ID|EMAIL`` or
``key:ID``; answers name it by ID (``Scope``, ``ScopeID``), and ``GET /guard`` adds the name people know it by.
The policies themselves are the settings' (``PUT /api/v1/settings``); the judges (``/guard/judges``) are not
built yet.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi import APIRouter, Depends

from opod.access.guard_attachments import Attachment
from opod.access.guard_service import AttachmentStanding, GuardService
from opod.contract import durations
from opod.contract.admin.services import (
    GuardAttachment,
    GuardAttachmentRequest,
    GuardAttachmentView,
    GuardCountView,
    GuardEventsView,
    GuardEventView,
    GuardPolicyView,
    GuardView,
)
from opod.control.audit import audit_draft
from opod.control.context import ControlError
from opod.control.spec import SpecRouter
from opod.settings.guard import GuardPolicy
from opod.store.audit import AuditDraft
from opod.store.usage import UsageRecord

DEFAULT_SINCE = timedelta(hours=24)
SINCE_FORMS = "a duration back from now (90m, 24h, 7d) or a time (RFC 3339: 2026-03-04T05:06:07Z)"


def since_of(text: str | None, now: datetime) -> datetime:
    """The moment ``since`` names: a duration back from ``now``, or an RFC 3339 time; 24 h back when absent."""
    if text is None or not text.strip():
        return now - DEFAULT_SINCE
    value = text.strip()
    try:
        back = durations.seconds(value)
    except durations.TooLong as err:
        raise ControlError(400, f"since: {err}") from None
    except ValueError:
        pass
    else:
        if back <= 0:
            raise ControlError(400, f"since: {text!r} is no time back; write {SINCE_FORMS}")
        return now - timedelta(seconds=back)
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise ControlError(400, f"since: {text!r} is neither {SINCE_FORMS}") from None
    if at.tzinfo is None or at.utcoffset() is None:
        raise ControlError(400, f"since: {text!r} has no time zone; write it with one, like 2026-03-04T05:06:07Z")
    return at.astimezone(UTC)


def attachment_answer(attachment: Attachment) -> GuardAttachment:
    return GuardAttachment(Scope=attachment.scope, ScopeID=attachment.scope_id, Policy=attachment.policy)


def attachment_view(standing: AttachmentStanding) -> GuardAttachmentView:
    a = standing.attachment
    return GuardAttachmentView(Scope=a.scope, ScopeID=a.scope_id, Policy=a.policy, name=standing.name or None)


def policy_view(policy: GuardPolicy) -> GuardPolicyView:
    return GuardPolicyView(
        name=policy.name,
        mode=policy.mode,
        fail=policy.fail,
        no_store=policy.no_store,
        judge=policy.judge or None,
        checks=[check.describe() for check in policy.checks],
    )


def router(guard: GuardService) -> APIRouter:
    api = SpecRouter()

    def event_view(row: UsageRecord) -> GuardEventView:
        return GuardEventView(
            at=row.ts,
            request_id=row.request_id or None,
            project=guard.project_name(row.project_id) or None,
            model=row.model or None,
            status=row.status or None,
            action=row.guard_action,
            policy=row.guard_policy or None,
            category=row.guard_category or None,
            rule=row.guard_rule or None,
            guard_ms=row.guard_ms,
        )

    @api.get("/api/v1/guard", operation_id="getGuard", tags=["guard"], response_model=GuardView)
    async def get_guard() -> GuardView:
        library = guard.library
        return GuardView(
            enabled=library.enabled,
            policies=[p.name for p in library.policies],
            default=list(library.default),
            attachments=[attachment_view(s) for s in guard.standings()],
            details=[policy_view(p) for p in library.policies],
        )

    @api.post(
        "/api/v1/guard/attachments", operation_id="postGuardAttachments", tags=["guard"], response_model=GuardAttachment
    )
    async def post_guard_attachments(
        body: GuardAttachmentRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> GuardAttachment:
        return attachment_answer(await guard.attach(body.target, body.policy, draft))

    @api.delete(
        "/api/v1/guard/attachments",
        operation_id="deleteGuardAttachments",
        tags=["guard"],
        response_model=GuardAttachment,
    )
    async def delete_guard_attachments(
        body: GuardAttachmentRequest, draft: AuditDraft = Depends(audit_draft)
    ) -> GuardAttachment:
        return attachment_answer(await guard.detach(body.target, body.policy, draft))

    @api.get("/api/v1/guard/events", operation_id="getGuardEvents", tags=["guard"], response_model=GuardEventsView)
    async def get_guard_events(since: str | None = None) -> GuardEventsView:
        found = await guard.events(since_of(since, datetime.now(UTC)))
        return GuardEventsView(
            since=found.since,
            counts=[
                GuardCountView(
                    project=guard.project_name(c.project_id) or None,
                    action=c.action,
                    policy=c.policy or None,
                    category=c.category or None,
                    count=c.count,
                )
                for c in found.counts
            ],
            events=[event_view(row) for row in found.events],
        )

    return api

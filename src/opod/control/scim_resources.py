"""What SCIM answers once a call is let in: Users and Groups, searches by POST, discovery, unknown paths.

:mod:`opod.control.scim` imports this at the first call its door lets in, not at start:
``scim2_models`` is slow to import, and most leaders never see a SCIM call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from scim2_models import (
    AuthenticationScheme,
    Bulk,
    ChangePassword,
    Context,
    EnterpriseUser,
    ETag,
    Filter,
    Group,
    Meta,
    Patch,
    Required,
    ResourceType,
    Schema,
    SchemaExtension,
    SCIMException,
    ServiceProviderConfig,
    Sort,
    User,
)
from starlette.requests import Request
from starlette.responses import Response

from opod.access.people import People
from opod.access.tenancy import Tenancy
from opod.control.scim_directory import Directory, ScimUser
from opod.control.scim_wire import PAGE_MAX, ScimError, one_or_list, page, read_json, scim_response, search_request
from opod.settings.holder import SettingsHolder
from opod.store import Store
from opod.store.audit import AuditDraft

_Call = TypeVar("_Call")
"""The call as the door made it (:mod:`opod.control.scim`'s)."""


class Resources:
    """Every answer past SCIM's door, through :meth:`answer`; the Users and Groups in :attr:`directory`."""

    def __init__(self, people: People, tenancy: Tenancy, settings: SettingsHolder, store: Store) -> None:
        self.directory = Directory(people, tenancy, settings, store)

    async def answer(self, handler: Callable[[Resources, _Call], Awaitable[Response]], call: _Call) -> Response:
        """``handler``'s answer to ``call``; scim2's own refusals raised as :class:`ScimError`."""
        try:
            return await handler(self, call)
        except SCIMException as err:  # a patch path that reaches nothing, a mutability rule
            where = err.context.get("path")
            raise ScimError(
                err.status, err.detail + (f" (path {where})" if where else ""), err.scim_type or None
            ) from None

    async def unknown(self, request: Request) -> Response:
        raise ScimError(
            404,
            f"no such path: {request.method} {request.url.path}; SCIM answers /Users, /Groups and the discovery paths",
        )

    # --- searches by POST (RFC 7644 3.4.3) ----------------------------------------------------

    async def search_users(self, request: Request, draft: AuditDraft, base: str) -> Response:
        body = await read_json(request)
        return await self.directory.users(request, draft, base, _searching(request, User, body))

    async def search_groups(self, request: Request, draft: AuditDraft, base: str) -> Response:
        body = await read_json(request)
        return await self.directory.groups(request, draft, base, _searching(request, Group, body))

    async def search_all(self, request: Request, base: str) -> Response:
        search = search_request(request, ScimUser | Group, await read_json(request))
        found = await self.directory.all_users(base) + await self.directory.all_groups(base)
        return scim_response(
            page(search, [r for r in found if search.filter is None or search.filter.match(r)], ScimUser | Group)
        )

    # --- discovery ---------------------------------------------------------------------------------

    async def service_provider_config(self, base: str) -> Response:
        config = ServiceProviderConfig(
            documentation_uri="https://github.com/opod/opod",
            patch=Patch(supported=True),
            bulk=Bulk(supported=False, max_operations=0, max_payload_size=0),
            filter=Filter(supported=True, max_results=PAGE_MAX),
            change_password=ChangePassword(supported=False),
            sort=Sort(supported=False),
            etag=ETag(supported=False),
            authentication_schemes=[
                AuthenticationScheme(
                    type="oauthbearertoken",
                    name="Bearer token",
                    primary=True,
                    description="The SCIM token an operator stored with PUT /api/v1/auth/secrets/scim-token",
                )
            ],
            meta=Meta(resource_type="ServiceProviderConfig", location=f"{base}/ServiceProviderConfig"),
        )
        return scim_response(config.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE))

    async def resource_types(self, request: Request, base: str) -> Response:
        types: dict[str, dict[str, Any]] = {}
        for model in (User, Group):
            kind = ResourceType.from_resource(model)
            if model is User:
                kind.schema_extensions = [SchemaExtension(schema_=EnterpriseUser.__schema__, required=False)]
            kind.meta = Meta(resource_type="ResourceType", location=f"{base}/ResourceTypes/{kind.id}")
            types[str(kind.id)] = kind.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE)
        return one_or_list(request, types, "ResourceType", ResourceType)

    async def schemas(self, request: Request, base: str) -> Response:
        found = {}
        for model in (User, Group, EnterpriseUser):
            schema = model.to_schema()
            if model is User:
                _required(schema, "emails", "value")
            schema.meta = Meta(resource_type="Schema", location=f"{base}/Schemas/{schema.id}")
            found[str(schema.id)] = schema.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE)
        return one_or_list(request, found, "Schema", Schema)


def _required(schema: Schema, name: str, inner: str) -> None:
    """Mark ``name`` and its ``inner`` sub-attribute required: opod needs a person's email (RFC 7643 7 lets a service
    provider publish what it requires), though it takes one from a userName that is an address."""
    for attribute in schema.attributes or []:
        if attribute.name == name:
            attribute.required = Required.true
            for sub in attribute.sub_attributes or []:
                if sub.name == inner:
                    sub.required = Required.true


def _searching(request: Request, model: Any, body: dict[str, Any]) -> Any:
    return search_request(request, ScimUser if model is User else model, body)


__all__ = ["Resources"]

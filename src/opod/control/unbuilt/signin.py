"""Sign-in (the LDAP test): routed to the spec's letter, answering 501 until sign-in is built."""

from __future__ import annotations

from fastapi import APIRouter

from opod.contract.admin.tenancy import LDAPTestRequest, LDAPTestView
from opod.control.spec import SpecRouter
from opod.control.unbuilt.base import not_built


def router() -> APIRouter:
    api = SpecRouter()

    @api.post("/api/v1/auth/ldap/test", operation_id="postAuthLdapTest", tags=["auth"], response_model=LDAPTestView)
    async def post_auth_ldap_test(body: LDAPTestRequest) -> LDAPTestView:
        raise not_built("sign-in")

    return api

"""Node tokens as the leader holds them: which exist, which node each signs for.

Tokens are derived from the leader's node secret (:mod:`opod.security.nodetokens`);
this book keeps their ids, expiry and revocation in memory, and which token each
registered node joined with, so a signed call is checked without the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from opod.contract.nodeauth import AuthRefused, Refusal, SignedHeader, parse_header, verify
from opod.security.nodetokens import NodeTokenMinter
from opod.security.replay import ReplayGuard

LOCAL_TOKEN_ID = "t_local"
"""The token ``opod up``'s own worker joins with, minted by the leader for its in-process worker."""


@dataclass(frozen=True, slots=True)
class NodeToken:
    id: str
    name: str = ""
    expires_at: datetime | None = None
    revoked: bool = False

    def active(self, now: datetime | None = None) -> bool:
        now = now or datetime.now(UTC)
        return not self.revoked and (self.expires_at is None or self.expires_at > now)


class NodeTokenBook:
    def __init__(self, minter: NodeTokenMinter) -> None:
        self.minter = minter
        self._tokens: dict[str, NodeToken] = {}
        self._bound: dict[str, str] = {}
        self._guard = ReplayGuard()

    # --- bookkeeping --------------------------------------------------------

    def put(self, token: NodeToken) -> None:
        self._tokens[token.id] = token

    def revoke(self, token_id: str) -> None:
        token = self._tokens.get(token_id)
        if token is not None:
            self._tokens[token_id] = NodeToken(token.id, token.name, token.expires_at, revoked=True)

    def bind(self, node_id: str, token_id: str) -> None:
        self._bound[node_id] = token_id

    def unbind(self, node_id: str) -> None:
        self._bound.pop(node_id, None)

    def token_id_of(self, node_id: str) -> str | None:
        return self._bound.get(node_id)

    def token_for_node(self, node_id: str) -> str | None:
        """The token a node signs with, if it is bound to an active one."""
        token_id = self._bound.get(node_id)
        token = self._tokens.get(token_id) if token_id else None
        if token is None or not token.active():
            return None
        return self.minter.token(token.id)

    # --- checking signed calls ----------------------------------------------

    def check(
        self, value: str | None, method: str, path: str, *, registering: bool = False
    ) -> tuple[SignedHeader, str]:
        """Verify a worker's signed call; returns the header and the token id that signed it.

        A node that has not registered yet may sign with any active token; a
        registered node must sign with the token it joined with.
        """
        header = parse_header(value)
        bound = self._bound.get(header.node_id)
        if bound is not None:
            token = self._tokens.get(bound)
            if token is None or not token.active():
                why = "was revoked" if token is not None and token.revoked else "expired or no longer exists"
                raise AuthRefused(
                    Refusal.UNKNOWN_NODE,
                    f"the node token node {header.node_id!r} joined with {why}; join again with a new token (opod token create --node)",
                    header.node_id,
                )
            candidates = [token]
        elif registering:
            candidates = [t for t in self._tokens.values() if t.active()]
        else:
            candidates = []
        if not candidates:
            raise AuthRefused(
                Refusal.UNKNOWN_NODE,
                f"node {header.node_id!r} is unknown here; register first with a node token (opod token create --node)",
                header.node_id,
            )
        last: AuthRefused | None = None
        for token in candidates:
            try:
                checked = verify(value, method, path, self.minter.token(token.id))
            except AuthRefused as err:
                if err.reason is not Refusal.SIGNATURE:
                    raise
                last = err
                continue
            self._guard.check(checked)
            return checked, token.id
        assert last is not None
        if bound is None:
            raise AuthRefused(
                Refusal.SIGNATURE,
                f"no active node token matches the signature of node {header.node_id!r}; check the token given to opod join",
                header.node_id,
            )
        raise last

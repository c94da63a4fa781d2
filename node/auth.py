"""Bearer tokens and what each principal may see: a user only its own runs, ops everything."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from cancel_bus import RunInfo, Tombstone

from .settings import TokenGrant


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request comes from: ``ops`` sees and cancels everything, ``user`` only the runs of
    ``user_id``; ``name`` is recorded as who asked for a cancel."""

    role: Literal["ops", "user"]
    user_id: str | None
    name: str

    @property
    def is_ops(self) -> bool:
        """An ops principal: every run, node and tombstone."""
        return self.role == "ops"

    def may_see(self, run: RunInfo) -> bool:
        """Whether it may see (and cancel) the run: ops, or the run is its user's."""
        return self.is_ops or run.user_id == self.user_id

    def may_act_for(self, user_id: str) -> bool:
        """Whether it may start or cancel runs as ``user_id``: ops, or its own user."""
        return self.is_ops or user_id == self.user_id

    def may_manage(self, tombstone: Tombstone) -> bool:
        """Ops: every tombstone; a user: those it laid (on its own runs, by its selectors)."""
        return self.is_ops or (
            tombstone.requested_by == self.name
            and tombstone.selector.get("user_id") == self.user_id
        )


ANONYMOUS_OPS = Principal(role="ops", user_id=None, name="anonymous")


class TokenTable:
    """Constant-time lookup of bearer tokens. Empty table: auth is off, everyone is ops."""

    def __init__(self, tokens: dict[str, TokenGrant]) -> None:
        self._tokens = [(token.encode(), grant) for token, grant in tokens.items()]

    @property
    def enabled(self) -> bool:
        """Tokens are configured; without any, auth is off (everyone is ops)."""
        return bool(self._tokens)

    def principal(self, token: str | None) -> Principal | None:
        """Who ``token`` (a bearer token, or None) is; None: nobody."""
        if not self.enabled:
            return ANONYMOUS_OPS
        if not token:
            return None
        offered = token.strip().encode()
        found: TokenGrant | None = None
        for known, grant in self._tokens:  # compare with every token: no timing hint
            if hmac.compare_digest(known, offered):
                found = grant
        if found is None:
            return None
        name = found.name or (f"user:{found.user_id}" if found.user_id else found.role)
        return Principal(role=found.role, user_id=found.user_id, name=name)


# Declares the scheme in the OpenAPI (Swagger's "Authorize"); the token is checked below.
BEARER = HTTPBearer(
    auto_error=False,
    description="An API token of CANCEL_BUS_API_TOKENS (none needed when auth is off).",
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)]


async def authenticate(request: Request, credentials: Credentials) -> Principal:
    """The request's :class:`Principal`, from its bearer token; HTTP 401 if the token is missing or
    unknown (auth on)."""
    table: TokenTable = request.app.state.tokens
    principal = table.principal(credentials.credentials if credentials else None)
    if principal is None:
        raise HTTPException(
            status_code=401,
            detail="missing or invalid bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return principal


async def require_ops(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
    """The request's principal if it is ops; else HTTP 403."""
    if not principal.is_ops:
        raise HTTPException(status_code=403, detail="this needs an ops token")
    return principal


CurrentPrincipal = Annotated[Principal, Depends(authenticate)]
OpsPrincipal = Annotated[Principal, Depends(require_ops)]

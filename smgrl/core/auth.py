"""Control-plane authentication and roles (docs/rl-control-plane.md, "Auth"; decision D3 of
docs/deviations.md). Pure: no I/O.

Order (SMG's ``apply_control_plane_auth``):

1. ``--control-plane-api-keys`` configured: ``Authorization: Bearer <key>`` (scheme case-insensitive,
   extra spaces tolerated) must name one of them, else 401 ``text/plain`` with
   ``www-authenticate: Bearer realm="control-plane"``. Roles: ``admin`` reaches everything; ``user``
   reads discovery, the journal routes and ``GET /workers`` only. Unlike SMG 1.13.0, every engine
   route (per-worker or fan-out, any method) needs ``admin`` (D3): a GET fan-out of SGLang's
   ``/flush_cache`` flushes every engine, so "GET" does not mean "read-only" there.
2. Only tenant keys (``--tenant-api-key``) and no ``--api-key``: control routes refuse everything.
3. ``--api-key`` set: that key as bearer (JSON 401, realm ``data-plane``, as SMG's simple check).
4. No keys at all: open (development mode).

Keys are compared in constant time, and no key text ever leaves this module: a principal carries
the key's id and name, never the key.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

import attrs

from smgrl.core.errors import ConfigError

ROLES = ("admin", "user")


@attrs.frozen
class ControlPlaneKey:
    """One ``--control-plane-api-keys id:name:role:key`` entry. ``key`` is a secret: never logged."""

    id: str
    name: str
    role: str
    key: str = attrs.field(repr=False)

    @classmethod
    def parse(cls, text: str) -> ControlPlaneKey:
        parts = text.split(":", 3)
        if len(parts) != 4 or not all(parts):
            raise ConfigError("Invalid --control-plane-api-keys entry (expected 'id:name:role:key')")
        kid, name, role, key = parts
        if role.lower() not in ROLES:
            raise ConfigError(
                f"Invalid role '{role}' in --control-plane-api-keys entry '{kid}' (expected admin or user)"
            )
        return cls(id=kid, name=name, role=role.lower(), key=key)


@attrs.frozen
class TenantKey:
    """One ``--tenant-api-key tenant:key`` entry (data-plane identity; refused on control routes)."""

    tenant: str
    key: str = attrs.field(repr=False)

    @classmethod
    def parse(cls, text: str) -> TenantKey:
        tenant, sep, key = text.partition(":")
        if not sep or not tenant or not key:
            raise ConfigError("Invalid --tenant-api-key entry (expected 'tenant_id:key')")
        return cls(tenant=tenant, key=key)


CONTROL_REALM = 'Bearer realm="control-plane"'
DATA_REALM = 'Bearer realm="data-plane"'
MISSING = "Missing or invalid Authorization header"
INVALID = "Invalid authentication token"
INVALID_API_KEY = "Invalid API key"
MISSING_API_KEY = "Missing API key: send it as `Authorization: Bearer <key>`"
ADMIN_REQUIRED = "Admin role required for this control plane operation"

# What a route does, for the role check.
READ = "read"  # discovery, journal routes, GET /workers
ENGINE = "engine"  # per-worker proxy and fan-out: admin only (D3)
WRITE = "write"  # worker registration and other writes


@attrs.frozen
class Principal:
    id: str
    name: str
    role: str
    auth_method: str  # api_key | shared_key | none

    @property
    def label(self) -> str:
        """Who the audit names: the key id, ``unauthenticated`` for a refused caller (SMG's
        ``principal=unauthenticated``), else the auth method."""
        if self.auth_method == "api_key" or self.id == "unauthenticated":
            return self.id
        return self.auth_method


ANONYMOUS_ADMIN = Principal("anonymous", "anonymous", "admin", "none")
UNAUTHENTICATED = Principal("unauthenticated", "unauthenticated", "user", "none")


@attrs.frozen
class Denied:
    status: int
    message: str
    www_authenticate: str | None = None
    json: bool = False  # the --api-key check answers JSON, the control-plane check text
    principal: Principal = UNAUTHENTICATED
    reason: str = ""


def bearer_token(header: str | None) -> str | None:
    """The token of ``Bearer <token>``; None for a missing header, another scheme, or a bare key."""
    if not header:
        return None
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = rest.strip()
    return token or None


def check_api_key(authorization: str | None, keys: Sequence[str]) -> Denied | None:
    """The ``--api-key`` style check (also the data plane's, with the tenant keys): None when the
    bearer is one of ``keys``, else the JSON 401 SMG answers (missing vs wrong key differ)."""
    token = bearer_token(authorization)
    if token is None:
        return Denied(401, MISSING_API_KEY, DATA_REALM, json=True, reason="missing api key")
    if any(_matches(token, key) for key in keys):
        return None
    return Denied(
        401, INVALID_API_KEY, DATA_REALM + ', error="invalid_token"', json=True, reason="wrong api key"
    )


def _matches(token: str, key: str) -> bool:
    return hmac.compare_digest(
        token.encode("utf-8", "surrogateescape"), key.encode("utf-8", "surrogateescape")
    )


@attrs.frozen
class AuthPolicy:
    control_keys: tuple[ControlPlaneKey, ...] = ()
    tenant_keys: tuple[TenantKey, ...] = ()
    api_key: str | None = attrs.field(default=None, repr=False)

    @classmethod
    def build(
        cls, control_keys: Sequence[ControlPlaneKey], tenant_keys: Sequence[TenantKey], api_key: str | None
    ) -> AuthPolicy:
        return cls(tuple(control_keys), tuple(tenant_keys), api_key)

    @property
    def configured(self) -> bool:
        """Some control-plane auth is configured (else every caller is the anonymous admin)."""
        return bool(self.control_keys or self.tenant_keys or self.api_key)

    def check(self, authorization: str | None, action: str) -> Principal | Denied:
        if self.control_keys:
            token = bearer_token(authorization)
            if token is None:
                return Denied(401, MISSING, CONTROL_REALM, reason="missing or malformed authorization")
            for k in self.control_keys:
                if _matches(token, k.key):
                    principal = Principal(k.id, k.name, k.role, "api_key")
                    if principal.role != "admin" and action != READ:
                        return Denied(403, ADMIN_REQUIRED, principal=principal, reason="admin role required")
                    return principal
            return Denied(401, INVALID, CONTROL_REALM, reason="unknown key")
        if self.tenant_keys and not self.api_key:
            token = bearer_token(authorization)
            return Denied(
                401,
                MISSING if token is None else INVALID,
                CONTROL_REALM,
                reason="control plane closed to tenant keys",
            )
        if self.api_key:
            denied = check_api_key(authorization, (self.api_key,))
            return denied or Principal("api-key", "api-key", "admin", "shared_key")
        return ANONYMOUS_ADMIN

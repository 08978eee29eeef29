"""Control-plane auth decisions (docs/rl-control-plane.md, "Auth"; D3): every configuration x credential x action."""

import pytest

from smgrl.core.auth import (
    ENGINE,
    READ,
    WRITE,
    AuthPolicy,
    ControlPlaneKey,
    Denied,
    Principal,
    TenantKey,
    bearer_token,
)

KEYS = (
    ControlPlaneKey("k1", "trainer", "admin", "adm-secret"),
    ControlPlaneKey("k2", "viewer", "user", "usr-secret"),
)
TENANTS = (TenantKey("t1", "tenant-secret"),)


@pytest.mark.parametrize(
    "header, token",
    [
        (None, None),
        ("", None),
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("BEARER   abc", "abc"),
        ("Basic abc", None),
        ("abc", None),
        ("Bearer ", None),
        ("Bearer", None),
    ],
)
def test_bearer_token(header, token):
    assert bearer_token(header) == token


def outcome(result):
    if isinstance(result, Denied):
        return result.status
    return result.role


@pytest.mark.parametrize(
    "header, action, expected",
    [
        (None, READ, 401),
        ("Basic adm-secret", READ, 401),
        ("adm-secret", READ, 401),
        ("Bearer wrong", READ, 401),
        ("Bearer tenant-secret", READ, 401),
        ("Bearer adm-secret", READ, "admin"),
        ("Bearer adm-secret", ENGINE, "admin"),
        ("Bearer adm-secret", WRITE, "admin"),
        ("Bearer usr-secret", READ, "user"),
        ("Bearer usr-secret", ENGINE, 403),  # D3: GET engine routes need admin too
        ("Bearer usr-secret", WRITE, 403),
    ],
)
def test_control_plane_keys(header, action, expected):
    assert outcome(AuthPolicy(KEYS, TENANTS).check(header, action)) == expected


def test_denials_carry_the_smg_texts():
    p = AuthPolicy(KEYS)
    missing = p.check(None, READ)
    assert missing.message == "Missing or invalid Authorization header"
    assert missing.www_authenticate == 'Bearer realm="control-plane"' and not missing.json
    assert p.check("Bearer nope", READ).message == "Invalid authentication token"
    forbidden = p.check("Bearer usr-secret", ENGINE)
    assert forbidden.message == "Admin role required for this control plane operation"
    assert forbidden.www_authenticate is None and forbidden.principal.id == "k2"


def test_tenant_keys_alone_close_the_control_plane():
    p = AuthPolicy((), TENANTS)
    assert outcome(p.check("Bearer tenant-secret", READ)) == 401
    assert outcome(p.check(None, READ)) == 401


def test_shared_api_key():
    p = AuthPolicy((), (), "wk")
    assert outcome(p.check("Bearer wk", ENGINE)) == "admin"
    missing, wrong = p.check(None, READ), p.check("Bearer x", READ)
    assert missing.json and missing.status == 401 and missing.message.startswith("Missing API key")
    assert wrong.message == "Invalid API key" and 'error="invalid_token"' in wrong.www_authenticate


def test_no_keys_is_open():
    assert isinstance(AuthPolicy().check(None, ENGINE), Principal)


def test_no_key_text_in_reprs():
    p = AuthPolicy(KEYS, TENANTS, "wk-secret")
    text = repr(p) + repr(p.check("Bearer adm-secret", READ)) + repr(p.check("Bearer usr-secret", WRITE))
    for secret in ("adm-secret", "usr-secret", "tenant-secret", "wk-secret"):
        assert secret not in text

"""One error tree (smgrl/core/errors.py): each family's envelope comes from one renderer, and the error
both families meet (UpstreamUnreachable) renders in whichever envelope its route family names."""

from __future__ import annotations

import pytest

from smgrl.core import errors as e
from smgrl.http import app as _every_route  # noqa: F401 - imports every module that defines an error class


def _tree(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_tree(sub)}
    return out


def test_the_one_unreachable_error_renders_in_each_family():
    err = e.UpstreamUnreachable("upstream `u` unreachable: refused", worker_id="w", url="u")
    rl = {
        "error": "upstream_unreachable",
        "message": "upstream `u` unreachable: refused",
        "worker_id": "w",
        "url": "u",
    }
    assert err.body() == e.rl_body(err) == rl
    assert list(err.body()) == ["error", "message", "worker_id", "url"]  # SMG's field order
    assert e.openai_body(err) == {
        "error": {
            "type": "service_unavailable_error",
            "code": "upstream_unreachable",
            "message": "upstream `u` unreachable: refused",
            "param": None,
            "retryable": True,
            "worker_id": "w",
            "url": "u",
        }
    }
    assert e.openai_headers(err) == [(b"x-smg-error-code", b"upstream_unreachable"), (b"retry-after", b"1")]
    assert isinstance(err, e.RlError) and isinstance(err, e.DataPlaneError) and err.status == 502


@pytest.mark.parametrize(
    ("err", "body"),
    [
        (e.ModelRequired("name one"), {"type": "invalid_request_error", "code": "model_required"}),
        (e.RequestTimeout("slow"), {"type": "service_unavailable_error", "code": "request_timeout"}),
        (e.InvalidRequest("bad", "invalid_type", param="model"), {"code": "invalid_type", "param": "model"}),
    ],
)
def test_a_data_plane_error_renders_the_openai_envelope(err, body):
    rendered = err.body()["error"]
    assert rendered == e.openai_body(err)["error"] and body.items() <= rendered.items()
    assert ("retryable" in rendered) == err.retryable


def test_the_version_policy_header_error_keeps_the_rl_crates_envelope():
    err = e.InvalidVersionPolicyHeader("invalid version policy `x`")
    assert err.body() == {"error": "invalid_version_policy", "message": "invalid version policy `x`"}


def test_every_answer_has_one_code_per_family():
    # A code means one thing: two classes of one family never share it (InvalidRequest's codes vary).
    for family in (e.RlError, e.DataPlaneError):
        classes = _tree(family) - {e.InvalidRequest}
        codes = [c.code for c in classes]
        assert len(codes) == len(set(codes)) > 5, family
        assert all(isinstance(c.status, int) and 400 <= c.status < 600 for c in classes)

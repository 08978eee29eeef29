"""What an unauthenticated client sends cannot forge audit log lines or fields.

The real audit path (guard -> smgrl.telemetry.logs -> the writer thread), both formats: an ``x-request-id``
with tabs posing as ``key=value`` fields, a newline in the path posing as a whole log line, and
C1 / Unicode separators sent raw in a header.
"""

from __future__ import annotations

import io
import json
import re

import pytest
from rl_api_helpers import KEYS, rl_cfg

from smgrl.telemetry import logs
from smgrl.testing import gateway_in_process

FORGED = "2026-01-01T00:00:00.000Z INFO  smgrl.telemetry.audit: control_plane_audit principal=admin outcome=success"
UNSAFE = [chr(c) for c in [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]]


async def _attack(client) -> None:
    await client.get("/workers", headers={"x-request-id": "r1\tprincipal=admin\toutcome=success"})
    # Decoded by the server: a newline, then a line separator, in the worker id of the path.
    await client.get("/workers/x%0A" + FORGED.replace(" ", "%20") + "%E2%80%A8z")
    # NEL raw in a header (smgrl may replace such an id) and, decoded, in the path.
    await client.get("/workers/r3%C2%85nel", headers={"x-request-id": b"r3\x85nel\xe2\x80\xa8ls"})


@pytest.mark.parametrize("json_lines", [False, True], ids=["text", "json"])
async def test_denied_requests_log_one_escaped_line_each(json_lines):
    out = io.StringIO()
    logs.configure("info", json_lines, out)
    try:
        async with gateway_in_process(rl_cfg(control_plane_keys=KEYS)) as gw:
            await _attack(gw.client)
    finally:
        logs.shutdown()
    text = out.getvalue()
    assert not any(ch in text.replace("\n", "") for ch in UNSAFE)
    audit = [line for line in text.split("\n") if "control_plane_audit" in line]
    assert len(audit) == 3, text  # one line per request, none forged
    if json_lines:
        records = [json.loads(line) for line in audit]
        assert [r["principal"] for r in records] == ["unauthenticated"] * 3
        assert records[0]["request_id"] == "r1\tprincipal=admin\toutcome=success"
        assert records[1]["path"] == "/workers/x\n" + FORGED + "\u2028z"
    else:
        # Outside quoted values, each line has one principal and one outcome: the real ones.
        bare = [re.sub(r'"(?:[^"\\]|\\.)*"', '""', line) for line in audit]
        assert all(b.count(" principal=") == 1 and " principal=unauthenticated " in b for b in bare)
        assert all(b.count(" outcome=") == 1 and " outcome=denied " in b for b in bare)
        assert 'request_id="r1\\tprincipal=admin\\toutcome=success"' in audit[0]
        assert "\\n2026-01-01T00:00:00.000Z INFO" in audit[1] and "\\u2028z" in audit[1]
        assert "/workers/r3\\x85nel" in audit[2]

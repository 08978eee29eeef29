"""Validation of ``POST/PUT /workers`` bodies, with SMG's error texts (pure).

SMG answers ``400 {"error": "<text>", "code": "BAD_REQUEST"}`` where the text comes from serde:
``Invalid JSON data: Failed to deserialize the JSON body into the target type: <path>: <problem>``
or ``JSON syntax error: Failed to parse the request body as JSON: <problem>``. serde's trailing
"at line L column C" is not reproduced; the field path and the problem are.
"""

from __future__ import annotations

import json
from typing import Any

from smgrl.core.worker import URL_SCHEMES, WORKER_TYPES
from smgrl.errors import WorkerApiError, bad_request

DESERIALIZE = "Invalid JSON data: Failed to deserialize the JSON body into the target type: "


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    if isinstance(value, list):
        return "sequence"
    if isinstance(value, dict):
        return "map"
    return "null"


def _invalid(path: str, value: Any, expected: str) -> WorkerApiError:
    return bad_request(f"{DESERIALIZE}{path}: invalid type: {_type_name(value)}, expected {expected}")


def parse_json_body(data: bytes, content_type: str | None) -> Any:
    if not content_type or content_type.split(";")[0].strip().lower() != "application/json":
        raise bad_request("Missing Content-Type: application/json header")
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"JSON syntax error: Failed to parse the request body as JSON: {exc}") from None


def check_labels(value: Any, field: str = "labels") -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _invalid(field, value, "a map")
    for k, v in value.items():
        if not isinstance(v, str):
            raise _invalid(f"{field}.{k}", v, "a string")
    return dict(value)


def _opt_str(body: dict, key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise _invalid(key, value, "a string")
    return value


def check_worker_spec(body: Any) -> dict[str, Any]:
    """A worker spec as POST/PUT take it; unknown fields are ignored (as SMG does)."""
    if not isinstance(body, dict):
        raise bad_request(
            f"{DESERIALIZE}invalid type: {_type_name(body)}, expected struct WorkerConfigRequest"
        )
    if "url" not in body:
        raise bad_request(f"{DESERIALIZE}missing field `url`")
    url = body["url"]
    if not isinstance(url, str):
        raise _invalid("url", url, "a string")
    spec: dict[str, Any] = {"url": url}
    spec["api_key"] = _opt_str(body, "api_key")
    spec["model_id"] = _opt_str(body, "model_id")
    spec["runtime"] = _opt_str(body, "runtime") or _opt_str(body, "runtime_type")
    worker_type = _opt_str(body, "worker_type") or "regular"
    if worker_type not in WORKER_TYPES:
        raise bad_request(
            f"{DESERIALIZE}worker_type: unknown variant `{worker_type}`, expected one of "
            + ", ".join(f"`{t}`" for t in WORKER_TYPES)
        )
    spec["worker_type"] = worker_type
    port = body.get("bootstrap_port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
        raise _invalid("bootstrap_port", port, "u16")
    spec["bootstrap_port"] = port
    spec["labels"] = check_labels(body.get("labels"))
    if not url.startswith(URL_SCHEMES):
        raise bad_request(
            f"Invalid value for field 'worker_url': {url} - URL must start with a lowercase http://, "
            "https://, grpc://, grpcs://, or ipc:// scheme"
        )
    host = url.split("://", 1)[1].split("/", 1)[0]
    if not host or any(c.isspace() for c in url):
        raise bad_request(f"Invalid value for field 'worker_url': {url} - URL has no host")
    return spec

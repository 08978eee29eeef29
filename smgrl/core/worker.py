"""The registry's worker record and the pure rules around it (DP ranks, engine names, label sizes).

A ``Worker`` is one registry entry, exactly as SMG's registry holds it: a DP-aware engine with
``dp_size`` N is N entries ``<base_url>@0 .. @N-1`` that share one engine address. Records are
frozen; the registry projection (``smgrl.state.registry``) replaces them, never mutates them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import attrs

from smgrl.core.control_url import split_host_port
from smgrl.core.origin import authority_of

from .numbers import parse_uint

# Runtime names SMG renders lower-case in the discovery row's ``engine`` field; anything else
# (``unspecified``, an unknown hint) is shown as ``unknown``.
KNOWN_ENGINES = frozenset({"sglang", "vllm", "trtllm", "mlx", "tokenspeed", "generic", "external"})
WORKER_TYPES = ("regular", "prefill", "decode", "encode")
HEALTH_STATES = ("pending", "ready", "not_ready", "failed", "draining")
URL_SCHEMES = ("http://", "https://", "grpc://", "grpcs://", "ipc://")


@attrs.frozen
class Worker:
    id: str
    url: str
    base_url: str
    worker_type: str = "regular"
    connection_mode: str = "http"
    runtime: str = "unspecified"
    model_id: str | None = None
    caller_labels: Mapping[str, str] = attrs.field(factory=dict)
    discovered_labels: Mapping[str, str] = attrs.field(factory=dict)
    status: str = "pending"
    dp_aware: bool = False
    dp_rank: int | None = None
    dp_size: int | None = None
    # The id of the registered (rank-0) record: DP ranks created at discovery point back to it,
    # and removing it removes the whole group (one engine address).
    group: str = ""
    has_api_key: bool = False
    bootstrap_port: int | None = None
    source: str = "api"
    registered_seq: int = 0

    @property
    def labels(self) -> dict[str, str]:
        """Discovered metadata overlaid with caller labels (caller labels win, as in SMG)."""
        if not self.caller_labels:
            return dict(self.discovered_labels)
        return {**self.discovered_labels, **self.caller_labels}

    @property
    def engine(self) -> str:
        name = (self.runtime or "").lower()
        return name if name in KNOWN_ENGINES else "unknown"

    @property
    def effective_model_id(self) -> str:
        if self.model_id:
            return self.model_id
        labels = self.labels
        return labels.get("served_model_name") or labels.get("model_path") or "unknown"

    @property
    def is_visible(self) -> bool:
        """Pending registrations are invisible to ``/v1/rl`` (SMG: 404, never matched)."""
        return self.status != "pending"


def _userinfo_end(url: str) -> int:
    """The index of the ``@`` that ends a URL's userinfo, or -1 (a DP-rank ``@N`` suffix is not
    userinfo: it follows the port)."""
    if "://" not in url:
        return -1
    start = url.index("://") + 3
    authority = authority_of(url)
    at = authority.rfind("@")
    if at == -1:
        return -1
    head = authority[:at]
    if url.endswith("@" + authority[at + 1 :]) and _rank(authority[at + 1 :]) is not None:
        # ``http://h:p@1`` is rank 1 of ``http://h:p``; ``http://u:p@h:1@2`` still has userinfo.
        # Only after a numeric port: ``http://u:PASS@2130706433`` (an all-digit host) and
        # ``http://u:PASS@5/v1`` are userinfo, not ranks of ``http://u:PASS``.
        inner = head.rfind("@")
        if inner != -1:
            return start + inner
        port = head.rpartition(":")[2]
        if ":" in head and port.isascii() and port.isdigit():
            return -1
    return start + at


def redact_url(url: str) -> str:
    """The URL with any userinfo (``user:password@``) replaced by ``***@``: safe to echo."""
    end = _userinfo_end(url)
    if end == -1:
        return url
    start = url.index("://") + 3
    return url[:start] + "***" + url[end:]


def worker_url_problem(url: str) -> str | None:
    """Why a worker URL cannot be registered (SMG 1.13.0's wording where SMG refuses it too), or
    None. Shared by ``POST``/``PUT /workers`` and ``launch --worker-urls``; the text never
    contains a password (the URL is echoed with its userinfo redacted).

    * no scheme (``127.0.0.1:31002``): SMG refuses it at launch and at ``POST /workers`` alike;
    * userinfo (``http://user:PASS@host``): SMG accepts it, echoes it and logs it; smgrl refuses
      it (docs/deviations.md): the engine's key goes in ``api_key`` / ``--api-key``, where it is
      kept apart from events, logs and answers.
    """
    shown = redact_url(url)
    prefix = f"Invalid value for field 'worker_url': {shown} - "
    if not url.startswith(URL_SCHEMES):
        return (
            prefix + "URL must start with a lowercase http://, https://, grpc://, grpcs://, or ipc:// scheme"
        )
    if _userinfo_end(url) != -1:
        return (
            prefix + "a worker URL must not carry credentials (user:password@); give the engine's key "
            "as api_key (POST /workers) or --api-key (smgrl launch)"
        )
    host = url.split("://", 1)[1].split("/", 1)[0]
    if not host or host.startswith(":"):
        return prefix + "Invalid URL format: empty host"
    if any(c.isspace() for c in host):
        return prefix + "Invalid URL format: invalid international domain name"
    return None


_LOOPBACK_NAMES = frozenset({"localhost", "::1", "0:0:0:0:0:0:0:1"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "*"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _is_loopback(host: str) -> bool:
    return host in _LOOPBACK_NAMES or host.endswith(".localhost") or host.startswith("127.")


def on_this_host(url: str) -> bool:
    """Whether a worker URL names a loopback host (so the engine runs here and reads this host's
    filesystem; decided from the text alone, no DNS)."""
    if "://" not in url:
        return False
    authority = authority_of(strip_rank(url)).rsplit("@", 1)[-1]
    host, _ = split_host_port(authority)
    return _is_loopback(host.strip("[]").lower().rstrip("."))


def reaches_listener(url: str, listen_host: str | None, listen_port: int | None) -> bool:
    """Whether an HTTP worker URL names the listener ``(listen_host, listen_port)``: the same
    port, and the listener's own host, or a loopback name when the listener is on loopback or a
    wildcard address. Decided from the text alone (no DNS): other names of this host are found
    by discovery instead, which sees the gateway's id on ``GET /health``."""
    if listen_port is None or not url.startswith(("http://", "https://")):
        return False
    scheme = url.split("://", 1)[0]
    authority = authority_of(strip_rank(url)).rsplit("@", 1)[-1]
    host, port_text = split_host_port(authority)
    host = host.strip("[]").lower().rstrip(".")
    try:
        port = int(port_text) if port_text else _DEFAULT_PORTS[scheme]
    except ValueError:
        return False
    if port != listen_port:
        return False
    listen = (listen_host or "").strip("[]").lower()
    if host == listen:
        return True
    return _is_loopback(host) and (listen in _WILDCARDS or _is_loopback(listen))


def self_registration(url: str) -> str:
    """The refusal of a worker URL that reaches this gateway (SMG's field-error form)."""
    return (
        f"Invalid value for field 'worker_url': {redact_url(url)} - this URL reaches this gateway "
        "itself; register the engines' own URLs (a gateway routing to itself loops until the "
        "request times out)"
    )


def _rank(tail: str) -> int | None:
    """A DP rank suffix as Rust parses a ``usize``: ASCII digits only (``"²".isdigit()`` is
    True and ``int("²")`` raises), below 2**64 (``int()`` refuses 4,300+ digits)."""
    if not (tail.isascii() and tail.isdigit()):
        return None
    return parse_size(tail)


def dp_rank_of(url: str) -> int:
    """Rank = integer after the last ``@``; missing or non-numeric gives 0 (SMG's rule)."""
    _, sep, tail = url.rpartition("@")
    rank = _rank(tail) if sep else None
    return 0 if rank is None else rank


def strip_rank(url: str) -> str:
    """The base URL of a DP rank URL (``http://h:p@1`` -> ``http://h:p``)."""
    head, sep, tail = url.rpartition("@")
    return head if sep and _rank(tail) is not None else url


def connection_mode_for(url: str) -> str:
    if url.startswith(("grpc://", "grpcs://")):
        return "grpc"
    if url.startswith("ipc://"):
        return "zmq"
    return "http"


def parse_size(value: str | None) -> int | None:
    """Labels ``tp_size``/``dp_size``/``pp_size``: trimmed, unsigned int, else None."""
    if value is None:
        return None
    number = parse_uint(value.strip())  # past u64: None (int() refuses 4,300+ digits: was a 500)
    return number if number is not None and number < 2**64 else None


def is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True

"""Where a worker's RL control routes live (docs/tokenspeed.md, "Registering").

For an HTTP worker that is the worker itself. A gRPC or ZMQ worker (TokenSpeed) advertises a
control URL in its ``rl.control_url`` label; an engine that bound a wildcard address advertises
what it bound, and the only host the gateway knows to be reachable is the worker's own, so the
wildcard is replaced by it. Mirrors SMG 1.13.0's ``resolve_control_url`` string handling
exactly (no URL parser: odd input comes back unchanged rather than "fixed").
"""

from __future__ import annotations

from collections.abc import Mapping

from smgrl.core.selector import rust_trim

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


def split_host_port(authority: str) -> tuple[str, str | None]:
    """``host:port`` -> (host, port); IPv6 brackets stay on the host, a bare IPv6 has no port."""
    if authority.startswith("["):
        end = authority.find("]")
        if end != -1:
            rest = authority[end + 1 :]
            return authority[: end + 1], (rest[1:] if rest.startswith(":") else None)
    host, sep, port = authority.rpartition(":")
    if sep and ":" not in host:
        return host, port
    return authority, None


def host_of(url: str) -> str:
    """The host part of a worker URL, without scheme, port, path or DP-rank suffix (``@<rank>``)."""
    rest = url.split("://", 1)[1] if "://" in url else url
    authority = rest.split("/", 1)[0]
    return split_host_port(authority)[0].split("@", 1)[0]


def resolve_control_url(advertised: str, worker_url: str) -> str:
    """Resolve an advertised control URL against the worker's URL.

    Trimmed and stripped of trailing ``/``; returned unchanged unless its host is a wildcard
    (``""``, ``0.0.0.0``, ``::``, ``[::]``), in which case the worker's host replaces it and the
    advertised scheme, port and path are kept.
    """
    advertised = rust_trim(advertised).rstrip("/")
    scheme, sep, rest = advertised.partition("://")
    if not sep:
        return advertised
    authority, slash, path = rest.partition("/")
    host, port = split_host_port(authority)
    if host not in WILDCARD_HOSTS:
        return advertised
    out = f"{scheme}://{host_of(worker_url)}"
    if port is not None:
        out += f":{port}"
    if slash and path:
        out += f"/{path}"
    return out


def is_blank(label: str | None) -> bool:
    """True when an ``rl.control_url`` label is absent or blank after trimming (no endpoint)."""
    return label is None or not rust_trim(label)


def control_url_for(
    connection_mode: str, base_url: str, worker_url: str, labels: Mapping[str, str]
) -> str | None:
    """A worker's control URL: its ``base_url`` over HTTP, else the resolved ``rl.control_url`` label.

    An ``rl.control_url`` label on an HTTP worker is ignored; a gRPC/ZMQ worker without the
    label (or with a blank one) has no control endpoint (``None`` -> ``no_control_endpoint``).
    """
    if connection_mode == "http":
        return base_url
    label = labels.get("rl.control_url")
    if label is None or is_blank(label):
        return None
    return resolve_control_url(label, worker_url)

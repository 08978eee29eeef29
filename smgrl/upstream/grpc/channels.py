"""``ChannelSet``: one :class:`~smgrl.upstream.grpc.Channel` per engine address, for a gateway
that calls many engines for its whole life (the gRPC counterpart of the HTTP ``PoolSet``)."""

from __future__ import annotations

from smgrl.upstream.grpc.channel import Channel
from smgrl.upstream.grpc.framing import DEFAULT_MAX_MESSAGE_BYTES


def address_of(url: str) -> tuple[str, int]:
    """``grpc://host:port[@rank][/...]`` -> (host, port); IPv6 hosts in brackets. ValueError
    for a URL without a numeric port."""
    rest = url.split("://", 1)[1] if "://" in url else url
    authority = rest.split("/", 1)[0]
    if authority.startswith("["):
        end = authority.find("]")
        host, tail = authority[1:end], authority[end + 1 :]
        port = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port = authority.rpartition(":")
    port = port.split("@", 1)[0]
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"gRPC URL {url!r} has no host:port")
    return host, int(port)


class ChannelSet:
    def __init__(
        self, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, keepalive_secs: float | None = None
    ):
        self.max_message_bytes = max_message_bytes
        self.keepalive_secs = keepalive_secs
        self._channels: dict[tuple[str, int], Channel] = {}

    def get(self, url: str) -> Channel:
        key = address_of(url)
        channel = self._channels.get(key)
        if channel is None:
            channel = Channel(
                *key, max_message_bytes=self.max_message_bytes, keepalive_secs=self.keepalive_secs
            )
            self._channels[key] = channel
        return channel

    async def discard(self, url: str) -> None:
        """Close the channel of an engine that left the fleet."""
        channel = self._channels.pop(address_of(url), None)
        if channel is not None:
            await channel.aclose()

    async def aclose(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.aclose()

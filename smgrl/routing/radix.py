"""The approximate prefix tree behind cache-aware routing (SGLang router's "approximate radix
tree"). Pure: time comes in as an argument.

The tree remembers which instances (tenants) were recently sent which prompt prefixes, as a
stand-in for the engines' KV caches that the gateway cannot see. Keys are strings (prompt text)
or tuples of token ids; one tree per model, shared by that model's instances.

Invariant: a tenant present on a node is present on every ancestor (an insert marks the whole
path), so "the tenants that share the first N elements" is the tenant set of the node N deep.
Size is counted per tenant as the label lengths of its nodes (what its cache would hold); when
the total exceeds ``max_size`` the least recently used tenant leaves are evicted first.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Mapping
from typing import TypeAlias

Key: TypeAlias = str | tuple[int, ...]


def common_prefix_len(a: Key, b: Key) -> int:
    """Length of the common prefix of two strings (or two tuples), by halving slices (C speed)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class _Node:
    __slots__ = ("children", "label", "parent", "tenants")

    def __init__(self, label: Key, parent: _Node | None) -> None:
        self.label = label
        self.parent = parent
        self.children: dict[object, _Node] = {}
        self.tenants: dict[str, float] = {}  # tenant -> last access time


class RadixTree:
    def __init__(self, max_size: int = 1 << 26) -> None:
        self.max_size = max_size
        self.root = _Node("", None)
        self.tenant_size: dict[str, int] = {}

    @property
    def size(self) -> int:
        return sum(self.tenant_size.values())

    def match(self, key: Key, allowed: Collection[str]) -> tuple[int, list[str]]:
        """How much of ``key`` some allowed tenant shares, and those tenants (deepest match)."""
        node = self.root
        matched = 0
        best: list[str] = []
        while matched < len(key):
            child = node.children.get(key[matched])
            if child is None:
                break
            here = [t for t in child.tenants if t in allowed]
            if not here:
                break
            n = common_prefix_len(child.label, key[matched:])
            matched += n
            best = here
            if n < len(child.label):
                break
            node = child
        return matched, best

    def insert(self, key: Key, tenant: str, now: float) -> None:
        node = self.root
        i = 0
        while i < len(key):
            rest = key[i:]
            child = node.children.get(rest[0])
            if child is None:
                leaf = _Node(rest, node)
                leaf.tenants[tenant] = now
                node.children[rest[0]] = leaf
                self.tenant_size[tenant] = self.tenant_size.get(tenant, 0) + len(rest)
                break
            n = common_prefix_len(child.label, rest)
            if n < len(child.label):
                child = self._split(node, child, n)
            if tenant not in child.tenants:
                self.tenant_size[tenant] = self.tenant_size.get(tenant, 0) + len(child.label)
            child.tenants[tenant] = now
            node = child
            i += n
        if self.size > self.max_size:
            self.evict(int(self.max_size * 0.9))

    def _split(self, parent: _Node, child: _Node, at: int) -> _Node:
        mid = _Node(child.label[:at], parent)
        mid.tenants = dict(child.tenants)
        parent.children[mid.label[0]] = mid
        child.label = child.label[at:]
        child.parent = mid
        mid.children[child.label[0]] = child
        # Every tenant on the child is on mid too: the sizes are unchanged (the label was split).
        return mid

    def remove_tenant(self, tenant: str) -> None:
        """Forget everything ``tenant`` was sent (instance removed, or its weights changed)."""
        if self.tenant_size.pop(tenant, None) is None:
            return
        stack = [self.root]
        while stack:
            node = stack.pop()
            for key, child in list(node.children.items()):
                if tenant in child.tenants:
                    del child.tenants[tenant]
                    stack.append(child)
                if not child.tenants:
                    del node.children[key]

    def evict(self, target: int) -> None:
        """Drop least recently used tenant leaves until the total size is at most ``target``."""
        heap: list[tuple[float, int, _Node, str]] = []
        counter = 0
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            for tenant, when in node.tenants.items():
                if not any(tenant in c.tenants for c in node.children.values()):
                    heap.append((when, counter, node, tenant))
                    counter += 1
        heapq.heapify(heap)
        total = self.size
        while heap and total > target:
            _, _, node, tenant = heapq.heappop(heap)
            if node.tenants.pop(tenant, None) is None:
                continue
            total -= len(node.label)
            left = self.tenant_size[tenant] - len(node.label)
            if left > 0:
                self.tenant_size[tenant] = left
            else:
                self.tenant_size.pop(tenant, None)
            parent = node.parent
            if not node.tenants and parent is not None:
                parent.children.pop(node.label[0], None)
            if (
                parent is not None
                and parent is not self.root
                and tenant in parent.tenants
                and not any(tenant in c.tenants for c in parent.children.values())
            ):
                heapq.heappush(heap, (parent.tenants[tenant], counter, parent, tenant))
                counter += 1

    def sizes(self) -> Mapping[str, int]:
        return self.tenant_size

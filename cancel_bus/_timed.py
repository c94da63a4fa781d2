"""A map whose entries expire: what a node remembers for a while (early cancels, recent finish
notices, nonces, accepted cancels). Bounded in age and in size; the oldest entry goes first."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class TimedMap(Generic[K, V]):
    """Entries live ``ttl`` seconds (monotonic clock); beyond ``max_items`` the oldest is dropped.
    Putting a key again renews it."""

    def __init__(self, ttl: float, max_items: int) -> None:
        self._ttl = ttl
        self._max_items = max_items
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def put(self, key: K, value: V) -> None:
        self._entries.pop(key, None)
        self._entries[key] = (time.monotonic(), value)
        self._prune()

    def get(self, key: K) -> V | None:
        self._prune()
        entry = self._entries.get(key)
        return entry[1] if entry is not None else None

    def pop(self, key: K) -> V | None:
        self._prune()
        entry = self._entries.pop(key, None)
        return entry[1] if entry is not None else None

    def __contains__(self, key: object) -> bool:
        self._prune()
        return key in self._entries

    def __len__(self) -> int:
        self._prune()
        return len(self._entries)

    def __iter__(self) -> Iterator[K]:
        self._prune()
        return iter(list(self._entries))

    def _prune(self) -> None:
        horizon = time.monotonic() - self._ttl
        entries = self._entries
        while entries:
            oldest = next(iter(entries))
            if entries[oldest][0] > horizon and len(entries) <= self._max_items:
                return
            del entries[oldest]

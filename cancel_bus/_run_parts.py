"""The parts of a run's state on its owner that are not its token: what it emitted (its output,
within a limit), what waits to be written (phase, delivery time, relayed entries), and what its
owner observed of its code (leaks after its end, the longest stretches between checkpoints).
Plain values: the run's code writes them, the node's rooms take them."""

from __future__ import annotations

import json
import time
from typing import Any

RelayEntry = tuple[str, str, str]  # event type, time, data as JSON


class Output:
    """What the run emitted, up to ``limit`` characters (the rest is dropped: ``truncated``)."""

    __slots__ = ("chunks", "limit", "size", "truncated")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[str] = []
        self.size = 0
        self.truncated = False

    @property
    def text(self) -> str:
        return "".join(self.chunks)

    def keep(self, text: str) -> str:
        """Append output within the limit; -> the part kept."""
        room = self.limit - self.size
        if len(text) > room:
            text = text[: max(room, 0)]
            self.truncated = True
        if text:
            self.chunks.append(text)
            self.size += len(text)
        return text


class Pending:
    """What waits to be written off the hot path: the phase, the delivery time, relay entries."""

    __slots__ = ("delivery_dirty", "phase", "phase_dirty", "relay")

    def __init__(self) -> None:
        self.phase: str | None = None
        self.phase_dirty = False
        self.delivery_dirty = False
        self.relay: list[RelayEntry] = []

    def clear(self) -> None:
        """Phase and delivery time travel with the finish itself: nothing else to write."""
        self.phase_dirty = self.delivery_dirty = False


class Notes:
    """What the owner observed of the run's code: calls after its end (leaks), and, profiled,
    the longest stretch from a checkpoint at each code site to the next one."""

    __slots__ = ("_delta", "_leaked", "closed", "dirty", "gaps", "last_checkpoint", "last_site")

    def __init__(self) -> None:
        self._delta: dict[str, Any] | None = None  # leaks not written yet
        self._leaked = False
        self.closed = False
        self.gaps: dict[str, float] = {}
        self.dirty = False  # a gap grew by more than 10 ms since the last write
        self.last_checkpoint = 0.0  # when (perf_counter) and where the last checkpoint was
        self.last_site: str | None = None

    @property
    def waiting(self) -> bool:
        """Something new to write."""
        return self._delta is not None or self.dirty

    def close(self) -> None:
        """The run's scope exited: its last stretch counts for its last checkpoint."""
        self.closed = True
        if self.last_site is not None:
            self.note_gap(self.last_site, time.perf_counter() - self.last_checkpoint)

    def checkpoint_at(self, site: str) -> None:
        """A profiled checkpoint at ``site``: the stretch since the previous one ends here."""
        now = time.perf_counter()
        if self.last_site is not None:
            self.note_gap(self.last_site, now - self.last_checkpoint)
        self.last_checkpoint, self.last_site = now, site

    def leak(self, call: str, site: str, at: float) -> None:
        """The run's code made ``call`` at ``site`` after its end."""
        delta = self._delta
        if delta is None:
            delta = self._delta = {"calls": {}}
            if not self._leaked:
                self._leaked = True
                delta.update(first_call=call, first_site=site, first_at=f"{at:.6f}")
        delta["calls"][call] = delta["calls"].get(call, 0) + 1

    def note_gap(self, site: str, seconds: float) -> None:
        """A profiled run went ``seconds`` from the checkpoint at ``site`` to the next one."""
        worst = self.gaps.get(site, 0.0)
        if seconds > worst:
            self.gaps[site] = seconds
            self.dirty = self.dirty or seconds - worst > 0.01

    def take(self) -> str:
        """What is new, as JSON ('' if nothing): leaks, the slowest checkpoints."""
        notes: dict[str, Any] = {}
        if self._delta is not None:
            notes["leaked_after_cancel"], self._delta = self._delta, None
        if self.dirty or (self.closed and self.gaps):
            self.dirty = False
            slowest = sorted(self.gaps.items(), key=lambda item: item[1], reverse=True)
            notes["slowest_checkpoints"] = {site: round(s * 1000, 1) for site, s in slowest[:10]}
        return json.dumps(notes, separators=(",", ":")) if notes else ""

    def put_back(self, notes: str) -> None:
        """Notes that could not be written: again with the next ones."""
        leak = json.loads(notes).get("leaked_after_cancel")
        if leak is not None:
            delta = self._delta = self._delta or {"calls": {}}
            for key in ("first_call", "first_site", "first_at"):
                if key in leak:
                    delta.setdefault(key, leak[key])
            for call, n in leak["calls"].items():
                delta["calls"][call] = delta["calls"].get(call, 0) + n
        self.dirty = True

"""The bus's lifecycle, shared by its rooms: new → starting → running → draining → closed."""

from __future__ import annotations

from typing import Literal

from ._errors import BusClosed

Phase = Literal["new", "starting", "running", "draining", "closed"]


class Lifecycle:
    def __init__(self) -> None:
        self.phase: Phase = "new"

    @property
    def active(self) -> bool:
        """Running or draining: background work goes on."""
        return self.phase in ("running", "draining")

    def require_open(self, accepting: bool = False) -> None:
        """Raise :class:`BusClosed` unless calls are served (and, ``accepting``, new runs)."""
        if self.phase == "running" or (self.phase == "draining" and not accepting):
            return
        raise BusClosed(
            "the bus is draining and accepts no new runs"
            if self.phase == "draining"
            else f"the bus is {self.phase}"
        )

"""A condition that may last (heartbeats failing, finishes waiting for Redis): logged once when it
starts, again only for a kind of failure not seen yet in this spell (two kinds taking turns are
two lines, not one per attempt), and once when it ends."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("cancel_bus")


class Trouble:
    def __init__(self, what: str) -> None:
        self.what = what
        self.since: float | None = None  # monotonic: when it started
        self._kinds: set[str] = set()  # the kinds of failure said in this spell

    @property
    def on(self) -> bool:
        return self.since is not None

    def failing(self, kind: str, detail: str) -> None:
        """An attempt failed; ``kind`` says what kind of failure (a new one is logged again)."""
        if self.since is None:
            self.since = time.monotonic()
        elif kind in self._kinds:
            return
        self._kinds.add(kind)
        log.warning("cancel-bus: %s: %s", self.what, detail)

    def over(self, detail: str = "") -> None:
        """It works again."""
        if self.since is None:
            return
        lasted = time.monotonic() - self.since
        self.since = None
        self._kinds.clear()
        log.info("cancel-bus: %s: over after %.1f s%s", self.what, lasted, detail)


def kind_of(exc: BaseException) -> str:
    """What kind of failure ``exc`` is: what Redis raised, if it raised (and its reply code)."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    code = getattr(exc, "code", None)
    return f"{type(cause).__name__} {code}" if code else type(cause).__name__

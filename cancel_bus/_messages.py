"""Messages on node channels, and their optional HMAC-SHA256 seal.

Pub/sub is the doorbell, Redis keys are the truth: a message only speeds up what a sweep of the
stored state would do anyway. Still, assume an attacker can read the bus: with a signing key,
every message is sealed over **all** its fields — kind, run, target, modes, reason, requester,
recipient node (and, for a cancel, the recipient's epoch), a timestamp and a nonce. A receiver
acts only on a message whose seal verifies with one of its keys, whose timestamp is within the
window (on the Redis clock, as nodes estimate it), whose nonce it has not seen, and which is
addressed to itself. A nonce is remembered by its recipient only; since the recipient (and its
incarnation) is sealed in, a captured message is useless on any other node and, after the
window, anywhere.

Key rotation: the first key signs, every key verifies. To rotate from K1 to K2, deploy
``[K1, K2]`` (sign K1, accept both), then ``[K2, K1]``, then ``[K2]``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ._timed import TimedMap
from ._types import CancelMode, CancelRequest, RunInfo, StopCause


class Rejection(StrEnum):
    """Why a message was dropped (each counted apart in :class:`~cancel_bus.BusStats`)."""

    MALFORMED = "malformed"
    FORGED = "forged"  # no valid seal
    STALE = "stale"  # sealed outside the window
    REPLAYED = "replayed"  # a nonce seen before
    MISADDRESSED = "misaddressed"  # for another node, incarnation or run


class MessageSigner:
    """Seals and checks messages; without keys, nothing is sealed and every message passes."""

    def __init__(
        self,
        namespace: str,
        keys: Sequence[bytes],
        clock: Callable[[], float],
        window: float = 30.0,
        max_nonces: int = 100_000,
    ) -> None:
        self._namespace = namespace
        self._keys = list(keys)
        self._clock = clock
        self._window = window
        self._seen: TimedMap[str, None] = TimedMap(window * 2, max_nonces)

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def seal(self, body: dict[str, Any]) -> str:
        """``body`` as JSON with a timestamp, a nonce and the seal over everything."""
        if not self._keys:
            return json.dumps(body, separators=(",", ":"))
        sealed = {**body, "ts": f"{self._clock():.3f}", "n": secrets.token_hex(12)}
        sealed["a"] = self._mac(self._keys[0], sealed)
        return json.dumps(sealed, separators=(",", ":"))

    def check(self, body: dict[str, Any]) -> Rejection | None:
        """Why ``body`` must be dropped, or None. Remembers the nonce of a message that passes."""
        if not self._keys:
            return None
        mac = body.get("a")
        if not isinstance(mac, str):
            return Rejection.FORGED
        unsealed = {k: v for k, v in body.items() if k != "a"}
        if not any(hmac.compare_digest(mac, self._mac(key, unsealed)) for key in self._keys):
            return Rejection.FORGED
        try:
            sent_at = float(body["ts"])
        except (KeyError, TypeError, ValueError):
            return Rejection.MALFORMED
        if not abs(self._clock() - sent_at) <= self._window:
            return Rejection.STALE
        nonce = str(body.get("n"))
        if nonce in self._seen:
            return Rejection.REPLAYED
        self._seen.put(nonce, None)
        return None

    def _mac(self, key: bytes, body: dict[str, Any]) -> str:
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hmac.new(key, f"{self._namespace}\n{canonical}".encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class CancelMessage:
    """A cancel for one of the recipient's runs (``request_cancel``), bound to the recipient's
    incarnation and to the run the target resolved to."""

    run_id: str
    target: str
    requested_mode: CancelMode
    request: CancelRequest
    to: str
    epoch: str


@dataclass(frozen=True, slots=True)
class FinishedMessage:
    """A run the recipient waits for has ended; ``run`` is its record unless too large to carry."""

    run_id: str
    run: RunInfo | None
    to: str


@dataclass(frozen=True, slots=True)
class ProbeMessage:
    """A node's probe of its own channel: sent through Redis, it must come back."""

    nonce: str
    to: str
    epoch: str


Message = CancelMessage | FinishedMessage | ProbeMessage


def probe_body(nonce: str, to: str, epoch: str) -> dict[str, Any]:
    return {"k": "probe", "n": nonce, "to": to, "ep": epoch}


def decode(data: str) -> dict[str, Any] | None:
    """The JSON object of a channel message, or None."""
    try:
        body = json.loads(data)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def parse_message(body: dict[str, Any]) -> Message | None:
    """The typed message of a decoded body; ``None`` if it is not one of ours."""
    try:
        kind = body["k"]
        if kind == "cancel":
            request = CancelRequest(
                mode=CancelMode(body["em"]),
                reason=_optional_text(body.get("reason")),
                requested_by=_optional_text(body.get("by")),
                requested_at=float(body["at"]),
                cause=StopCause(body.get("c") or StopCause.USER),
            )
            return CancelMessage(
                run_id=_text(body["r"]),
                target=_text(body["tg"]),
                requested_mode=CancelMode(body["m"]),
                request=request,
                to=_text(body["to"]),
                epoch=_text(body["ep"]),
            )
        if kind == "finished":
            raw = body.get("run")
            run = RunInfo.from_redis(raw) if isinstance(raw, dict) else None
            return FinishedMessage(run_id=_text(body["r"]), run=run, to=_text(body["to"]))
        if kind == "probe":
            return ProbeMessage(_text(body["n"]), _text(body["to"]), _text(body["ep"]))
    except (ValueError, KeyError, TypeError):
        return None
    return None


RUN_TARGET_PREFIX = "run:"
SESSION_TARGET_PREFIX = "session:"


def run_target(run_id: str) -> str:
    return RUN_TARGET_PREFIX + run_id


def session_target(session: tuple[str, str, str]) -> str:
    return SESSION_TARGET_PREFIX + ":".join(session)


def addressed_to(message: Message, node_id: str, epoch: str) -> bool:
    """The message is for this incarnation, and about the run it names (a run cancel's target,
    a finish notice's record)."""
    if message.to != node_id:
        return False
    if isinstance(message, FinishedMessage):
        return message.run is None or message.run.run_id == message.run_id
    if message.epoch != epoch:
        return False
    if isinstance(message, ProbeMessage):
        return True
    by_session = message.target.startswith(SESSION_TARGET_PREFIX)
    return by_session or message.target == run_target(message.run_id)


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _optional_text(value: object) -> str | None:
    return None if value is None else _text(value)

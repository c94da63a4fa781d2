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


class Field(StrEnum):
    """Every field of a channel message, named once: the Lua prelude gets them as ``F.<name>``
    (``_scripts.py``), and nothing writes a message field by hand. The seal's own fields are
    never a message's: :meth:`MessageSigner.seal` refuses a body that has one (a probe once
    kept its nonce in ``n``, which the seal overwrote: a signed node was never ready)."""

    KIND = "k"  # a MessageKind
    RUN = "r"
    TARGET = "tg"  # run:<id> or session:<app>:<user>:<session>
    MODE = "m"  # the mode the request asked for
    RUN_MODE = "em"  # the run's mode after it (a stronger request escalates)
    AT = "at"  # when the cancel was requested (server clock)
    REASON = "reason"
    BY = "by"
    CAUSE = "c"
    TRACEPARENT = "tp"  # the cancel's W3C trace context
    TO = "to"  # the recipient node
    EPOCH = "ep"  # the recipient's incarnation
    STATUS = "st"
    RECORD = "run"  # a finish notice's run record
    PROBE = "pn"  # a probe's nonce
    SEALED_AT = "ts"  # the seal's: when it was sealed
    NONCE = "n"  # the seal's: spent once per recipient
    SEAL = "a"  # the seal's: the HMAC


SEAL_FIELDS = frozenset({Field.SEALED_AT, Field.NONCE, Field.SEAL})


class MessageKind(StrEnum):
    CANCEL = "cancel"
    FINISHED = "finished"
    PROBE = "probe"


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
        if SEAL_FIELDS & body.keys():
            raise ValueError(
                f"a message may not use the seal's fields: {SEAL_FIELDS & body.keys()}"
            )
        if not self._keys:
            return json.dumps(body, separators=(",", ":"))
        sealed = {
            **body,
            Field.SEALED_AT: f"{self._clock():.3f}",
            Field.NONCE: secrets.token_hex(12),
        }
        sealed[Field.SEAL] = self._mac(self._keys[0], sealed)
        return json.dumps(sealed, separators=(",", ":"))

    def check(self, body: dict[str, Any]) -> Rejection | None:
        """Why ``body`` must be dropped, or None. Remembers the nonce of a message that passes."""
        if not self._keys:
            return None
        mac = body.get(Field.SEAL)
        if not isinstance(mac, str):
            return Rejection.FORGED
        unsealed = {k: v for k, v in body.items() if k != Field.SEAL}
        if not any(hmac.compare_digest(mac, self._mac(key, unsealed)) for key in self._keys):
            return Rejection.FORGED
        try:
            sent_at = float(body[Field.SEALED_AT])
        except (KeyError, TypeError, ValueError):
            return Rejection.MALFORMED
        if not abs(self._clock() - sent_at) <= self._window:
            return Rejection.STALE
        nonce = str(body.get(Field.NONCE))
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
    return {Field.KIND: MessageKind.PROBE, Field.PROBE: nonce, Field.TO: to, Field.EPOCH: epoch}


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
        kind = body[Field.KIND]
        if kind == MessageKind.CANCEL:
            request = CancelRequest(
                mode=CancelMode(body[Field.RUN_MODE]),
                reason=_optional_text(body.get(Field.REASON)),
                requested_by=_optional_text(body.get(Field.BY)),
                requested_at=float(body[Field.AT]),
                cause=StopCause(body.get(Field.CAUSE) or StopCause.USER),
                traceparent=_optional_text(body.get(Field.TRACEPARENT)) or "",
            )
            return CancelMessage(
                run_id=_text(body[Field.RUN]),
                target=_text(body[Field.TARGET]),
                requested_mode=CancelMode(body[Field.MODE]),
                request=request,
                to=_text(body[Field.TO]),
                epoch=_text(body[Field.EPOCH]),
            )
        if kind == MessageKind.FINISHED:
            raw = body.get(Field.RECORD)
            run = RunInfo.from_redis(raw) if isinstance(raw, dict) else None
            return FinishedMessage(run_id=_text(body[Field.RUN]), run=run, to=_text(body[Field.TO]))
        if kind == MessageKind.PROBE:
            return ProbeMessage(
                _text(body[Field.PROBE]), _text(body[Field.TO]), _text(body[Field.EPOCH])
            )
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

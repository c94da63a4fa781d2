"""Messages on node channels, and their optional HMAC-SHA256 signature.

Pub/sub is the doorbell, Redis keys are the truth: a message only speeds up what a sweep of the
stored state would do anyway. With a signing key, every message carries ``auth`` =
``"<ts>:<nonce>:<hex hmac>"`` over ``namespace|purpose|ts|nonce``; a message whose signature is
wrong, whose timestamp is outside the window, or whose nonce was seen before is dropped and
counted.
Timestamps are node estimates of the Redis clock, so node clock skew does not matter.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._types import CancelMode, CancelRequest, RunInfo


def cancel_purpose(target: str, mode: CancelMode) -> str:
    return f"cancel|{target}|{mode.value}"


FINISHED_PURPOSE = "finished"


class MessageSigner:
    """Signs and verifies ``auth`` tokens; without a key every token is ``""`` and accepted."""

    def __init__(
        self,
        namespace: str,
        key: bytes | None,
        clock: Callable[[], float],
        window: float = 30.0,
        max_nonces: int = 100_000,
    ) -> None:
        self._namespace = namespace
        self._key = key
        self._clock = clock
        self._window = window
        self._max_nonces = max_nonces
        self._seen: OrderedDict[str, float] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def auth(self, purpose: str) -> str:
        if self._key is None:
            return ""
        ts = f"{self._clock():.3f}"
        nonce = secrets.token_hex(8)
        return f"{ts}:{nonce}:{self._mac(purpose, ts, nonce)}"

    def verify(self, purpose: str, auth: object) -> bool:
        if self._key is None:
            return True
        if not isinstance(auth, str) or auth.count(":") != 2:
            return False
        ts, nonce, mac = auth.split(":")
        if not hmac.compare_digest(mac, self._mac(purpose, ts, nonce)):
            return False
        try:
            sent_at = float(ts)
        except ValueError:
            return False
        now = self._clock()
        if abs(now - sent_at) > self._window or nonce in self._seen:
            return False
        self._remember(nonce, sent_at, now)
        return True

    def _mac(self, purpose: str, ts: str, nonce: str) -> str:
        assert self._key is not None
        text = f"{self._namespace}|{purpose}|{ts}|{nonce}".encode()
        return hmac.new(self._key, text, hashlib.sha256).hexdigest()

    def _remember(self, nonce: str, sent_at: float, now: float) -> None:
        self._seen[nonce] = sent_at
        while self._seen:
            oldest, at = next(iter(self._seen.items()))
            if now - at <= self._window and len(self._seen) <= self._max_nonces:
                break
            del self._seen[oldest]


@dataclass(frozen=True, slots=True)
class CancelMessage:
    """A cancel for one of the receiving node's runs (published by ``request_cancel``)."""

    run_id: str
    target: str
    requested_mode: CancelMode
    request: CancelRequest
    auth: str


@dataclass(frozen=True, slots=True)
class FinishedMessage:
    """A run this node waits for has ended; ``run`` is its record unless too large to carry."""

    run_id: str
    run: RunInfo | None
    auth: str


def parse_message(data: str) -> CancelMessage | FinishedMessage | None:
    """Decode a channel message; ``None`` if it is not one of ours (counted as rejected)."""
    try:
        body: dict[str, Any] = json.loads(data)
        kind = body["k"]
        if kind == "cancel":
            request = CancelRequest(
                mode=CancelMode(body["em"]),
                reason=body.get("reason"),
                requested_by=body.get("by"),
                requested_at=float(body["at"]),
            )
            return CancelMessage(
                run_id=str(body["r"]),
                target=str(body["tg"]),
                requested_mode=CancelMode(body["m"]),
                request=request,
                auth=str(body.get("a", "")),
            )
        if kind == "finished":
            raw = body.get("run")
            run = RunInfo.from_redis(raw) if isinstance(raw, dict) else None
            return FinishedMessage(run_id=str(body["r"]), run=run, auth=str(body.get("a", "")))
    except (ValueError, KeyError, TypeError):
        return None
    return None

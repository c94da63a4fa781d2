"""What reaches this node on its channel: each message is acted on only if it is sealed (on a
signed bus), fresh, unseen, and addressed to this incarnation; every one dropped is counted by
why. A cancel sets its run's token (or waits for the run's start); a finish notice answers the
local callers waiting for the run; a probe is the node's own, come back (``_probe.py``). The
connection is ``_subscription.py``'s; what a reconnect missed, ``_sweep.py``'s."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ._messages import (
    CancelMessage,
    MessageSigner,
    ProbeMessage,
    Rejection,
    addressed_to,
    decode,
    parse_message,
)
from ._ports import Delivery, Identified, Owner
from ._types import BusStats
from ._waiters import Waiters

log = logging.getLogger("cancel_bus")


class Inbox:
    """``probe_came_back``: told the nonce of each of this node's probes that came back."""

    def __init__(
        self,
        *,
        lease: Identified,
        signer: MessageSigner,
        local: Owner,
        waiters: Waiters,
        stats: BusStats,
        probe_came_back: Callable[[str], None],
    ) -> None:
        self._lease = lease
        self._signer = signer
        self._local = local
        self._waiters = waiters
        self._stats = stats
        self._probe_came_back = probe_came_back

    def receive(self, data: str) -> None:
        """Act on one message's body (never raises: a defect is logged)."""
        try:
            self._on_message(data)
        except Exception:
            log.exception("cancel-bus: failed to handle a bus message")

    def _on_message(self, data: str) -> None:
        body = decode(data)
        rejection = Rejection.MALFORMED if body is None else self._signer.check(body)
        message = parse_message(body) if body is not None and rejection is None else None
        if rejection is None and message is None:
            rejection = Rejection.MALFORMED
        me = self._lease.identity
        if message is not None and not addressed_to(message, me.node_id, me.epoch):
            rejection = Rejection.MISADDRESSED
        if rejection is not None or message is None:
            self._reject(rejection or Rejection.MALFORMED)
        elif isinstance(message, ProbeMessage):
            self._probe_came_back(message.nonce)
        elif isinstance(message, CancelMessage):
            delivery = self._local.deliver(message.run_id, message.request, message.target)
            if delivery is Delivery.MISADDRESSED:
                self._reject(Rejection.MISADDRESSED)
            elif delivery is Delivery.DELIVERED:
                self._stats.cancels_delivered += 1
        else:
            self._waiters.resolve(message.run_id, message.run)

    def _reject(self, why: Rejection) -> None:
        self._stats.messages_rejected += 1
        field = f"messages_{why.value}"
        setattr(self._stats, field, getattr(self._stats, field) + 1)

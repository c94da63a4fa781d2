"""What a node publishes itself: on a signed bus, the notices a script kept (a cancel for an owner,
a finish for a waiter: a seal must name the recipient, which only the script finds out), sealed
and sent right after it; and every bus the node's probe of its own channel."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from ._errors import CancelBusError
from ._keys import KeySpace
from ._messages import Field, MessageSigner, decode, probe_body
from ._redis import Client, translated

log = logging.getLogger("cancel_bus")


class Notices:
    def __init__(
        self, redis: Client, keys: KeySpace, *, pub_command: str, signer: MessageSigner
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._pub_command = pub_command
        self._signer = signer

    @property
    def script_pub(self) -> str:
        """What a script is given to notify with: the publish command, or ``''`` on a signed bus
        (then it keeps its notices, for :meth:`publish`)."""
        return "" if self._signer.enabled else self._pub_command

    async def publish(self, notices: Sequence[Sequence[str]]) -> dict[str, list[int]]:
        """Seal and send the notices a script kept (``[node_id, message JSON]``); -> by kind of
        message, the receivers of each one sent. The state is already written: a notice that
        cannot be sent is left to the sweeps."""
        bodies = [(node_id, decode(message) or {}) for node_id, message in notices]
        counts = await asyncio.gather(
            *(self._send(node_id, body) for node_id, body in bodies), return_exceptions=True
        )
        receivers: dict[str, list[int]] = {}
        for (_, body), sent in zip(bodies, counts, strict=True):
            if isinstance(sent, CancelBusError):
                log.debug("cancel-bus: a notice was not sent: %s", sent)
            elif isinstance(sent, BaseException):
                raise sent
            else:
                receivers.setdefault(str(body.get(Field.KIND)), []).append(sent)
        return receivers

    async def probe(self, node_id: str, epoch: str, nonce: str) -> int:
        """Send a probe to the node's own channel (sealed on a signed bus); -> subscribers that
        received it."""
        return await self._send(node_id, probe_body(nonce, node_id, epoch))

    async def _send(self, node_id: str, body: dict[str, Any]) -> int:
        message = self._signer.seal(body)  # plain JSON without keys
        with translated("publish"):
            count = await self._redis.execute_command(
                self._pub_command, self._keys.channel(node_id), message
            )
        return int(count)

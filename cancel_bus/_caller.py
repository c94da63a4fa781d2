"""The caller's side of a cancel, from request to answer, and waiting for runs to end.

The request goes to Redis (``request_cancel``). An unknown run while Redis has lately lost the
namespace's data is asked about again until its owner has re-asserted it, or the timeout: then
the answer is not known (:class:`BusUnavailable`), never a false ``not_found``. A cancel this
node had recorded is kept for recovery (recorded again if Redis loses it) and, when its run is
here, delivered at once (the owner was not sent a message). With ``wait``, each stopping run of
the answer is waited for until it ends or the deadline; a tree answers ``cancelled`` only once
all of it has stopped.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from . import _tracing as tracing
from ._calls import ScriptCalls
from ._errors import BusUnavailable, CancelBusError, SessionBusy
from ._messages import run_target
from ._ports import Delivery, Identified, Keeper, Owner
from ._protocol import CancelAnswer, CancelOrder, Code
from ._reads import Reads
from ._redis import within
from ._run import RunSpec
from ._types import (
    BusStats,
    CancelMode,
    CancelRequest,
    CancelResult,
    MultitaskStrategy,
    Outcome,
    RunInfo,
    RunStatus,
    StopCause,
)
from ._waiters import Waiters

log = logging.getLogger("cancel_bus")

TURN_RECHECK = 5.0  # seconds a queued run waits before trying its start again (a lost notice)
WITHDRAW_TRIES = 3  # attempts to withdraw a queued run that will not start
RECOVERING_FIRST = 0.05  # seconds before asking again about a run Redis may have lost; doubles
RECOVERING_MOST = 0.5  # ... up to this


class CallerSide:
    def __init__(
        self,
        *,
        lease: Identified,
        calls: ScriptCalls,
        reads: Reads,
        local: Owner,
        recovery: Keeper,
        waiters: Waiters,
        stats: BusStats,
    ) -> None:
        self._lease = lease
        self._calls = calls
        self._reads = reads
        self._local = local
        self._recovery = recovery
        self._waiters = waiters
        self._stats = stats

    async def cancel(self, order: CancelOrder, wait: bool, timeout: float) -> CancelResult:
        """Record the cancel, then wait (``wait``) for its runs to end within ``timeout``; a
        span of the caller's trace, which the cancel carries to the runs' owners."""
        with tracing.span(
            "cancel_bus.cancel",
            {
                "cancel_bus.target": order.target,
                "cancel_bus.mode": order.mode.value,
                "cancel_bus.cause": order.cause.value,
                "cancel_bus.node": self._lease.identity.node_id,
            },
        ) as (traceparent, span):
            result = await self._cancel(replace(order, traceparent=traceparent), wait, timeout)
            if span is not None:
                span.set_attribute("cancel_bus.outcome", result.outcome.value)
            return result

    async def _cancel(self, order: CancelOrder, wait: bool, timeout: float) -> CancelResult:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        pause = RECOVERING_FIRST
        while True:
            request = self._calls.request_cancel(
                order,
                waiter=self._lease.identity.node_id if wait else "",
                caller=self._lease.identity.node_id,
            )
            answer = await within(
                max(0.0, deadline - loop.time()), request, "; the cancel may not be recorded"
            )
            if answer.code is not Code.RECOVERING:
                return await self.settle(answer, order.target, wait, deadline)
            if loop.time() + pause >= deadline:
                raise BusUnavailable(
                    "Redis lost the namespace's data lately and the run's owner has not "
                    "re-asserted it within the timeout: whether it exists is not known yet"
                )
            await asyncio.sleep(pause)
            pause = min(2 * pause, RECOVERING_MOST)

    async def interrupt(self, holder: str, spec: RunSpec, timeout: float) -> RunInfo | None:
        """Cancel the session's active run ``holder`` for the new run ``spec`` (its strategy is
        the cancel's cause, the new run the one who asks) and wait for its end -> the run as it
        ended (``None``: it was gone already). :class:`SessionBusy` if it did not end within
        ``timeout``: the cancel stands, and will still be honoured."""
        order = CancelOrder(
            target=run_target(holder),
            run_id=holder,
            session=None,
            mode=spec.interrupt_mode,
            reason=f"{spec.strategy.value}: run {spec.run_id} of its session",
            requested_by=spec.run_id,
            cause=StopCause(spec.strategy.value),
            tree=True,
        )
        result = await self.cancel(order, wait=True, timeout=timeout)
        if result.outcome is Outcome.STOPPING:
            assert spec.session is not None
            raise SessionBusy(spec.session, holder)
        return result.run if result.outcome is not Outcome.NOT_FOUND else None

    async def enqueue(self, spec: RunSpec) -> RunInfo:
        """Record the queued run ``spec``; a busy session's active run is interrupted first if
        its strategy says so (again, if another run took the session meanwhile), within its
        timeout: :class:`SessionBusy` past it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + spec.interrupt_timeout
        while True:
            try:
                return await self._calls.enqueue_run(
                    spec.run_id,
                    spec.session,
                    spec.metadata,
                    spec.parent,
                    queue=spec.strategy is MultitaskStrategy.ENQUEUE,
                    interrupted=spec.interrupted,
                )
            except SessionBusy as busy:
                left = deadline - loop.time()
                if spec.strategy is MultitaskStrategy.REJECT or left <= 0:
                    raise
                ended = await self.interrupt(busy.active_run_id, spec, left)
                if ended is not None:
                    spec = replace(spec, interrupted=ended.run_id)

    async def settle(
        self, answer: CancelAnswer, target: str, wait: bool, deadline: float
    ) -> CancelResult:
        """The result of a recorded cancel: its runs' ends, those that came by the deadline."""
        self._stats.cancels_requested += 1
        if answer.unheard:  # published, and nobody on an owner's channel heard it
            self._stats.cancels_unheard += answer.unheard
            log.warning(
                "cancel-bus: %d owner(s) not listening: their sweeps deliver", answer.unheard
            )
        nodes = [(answer.code, answer.run), *((code, run) for _, code, run in answer.descendants)]
        for code, node in nodes:
            request = node.cancel_request if code is Code.STOPPING and node is not None else None
            if node is not None and request is not None:
                self._accepted(node, request)
        finals = await asyncio.gather(
            *(self._end_of(code, node, wait, deadline) for code, node in nodes)
        )
        results = [
            CancelResult(outcome=Outcome(code), run=node) if final is None else final
            for (code, node), final in zip(nodes, finals, strict=True)
        ]
        root, below = results[0], results[1:]
        if root.outcome is Outcome.CANCELLED and any(r.outcome is Outcome.STOPPING for r in below):
            root = CancelResult(outcome=Outcome.STOPPING, run=root.run)  # not until they stop
        if answer.truncated:
            log.warning(
                "cancel-bus: the tree of %s is too large for one cancel: runs left out", target
            )
        return CancelResult(
            outcome=root.outcome, run=root.run, descendants=below, truncated=answer.truncated
        )

    async def await_turn(self, run_id: str, holder: str) -> None:
        """Return once the run ``holder`` (whose end the queued ``run_id`` waits for) or
        ``run_id`` itself (cancelled while queued) has ended, or after :data:`TURN_RECHECK`.
        :class:`BusUnavailable` if Redis cannot say."""
        waits = [asyncio.ensure_future(self.wait(r, TURN_RECHECK)) for r in (holder, run_id)]
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        for waiting in done:
            waiting.result()

    async def withdraw(self, run_id: str) -> None:
        """Record the queued ``run_id`` cancelled (cause ``client_disconnect``): it will not
        start, and the runs queued behind it move up. Tried a few times; if Redis stays away,
        the run stays queued until cancelled (logged)."""
        order = CancelOrder(
            target=run_target(run_id),
            run_id=run_id,
            session=None,
            mode=CancelMode.IMMEDIATE,
            reason="its caller stopped waiting for its turn",
            requested_by=self._lease.identity.node_id,
            cause=StopCause.CLIENT_DISCONNECT,
            tree=True,
        )
        failure: CancelBusError | None = None
        for _ in range(WITHDRAW_TRIES):
            try:
                await self.cancel(order, wait=False, timeout=self._lease.patience)
                return
            except CancelBusError as exc:
                failure = exc
        log.warning(
            "cancel-bus: queued run %s could not be withdrawn (%s): it stays queued until "
            "cancelled",
            run_id,
            failure,
        )

    async def record_of(self, run_id: str) -> RunInfo | None:
        return await self._reads.get_run(run_id)

    async def wait(self, run_id: str, timeout: float) -> RunInfo | None:
        """The run as it stands at its end or at the timeout (None if unknown)."""
        deadline = asyncio.get_running_loop().time() + timeout
        status = await within(timeout, self._calls.add_waiter(run_id, self._lease.identity.node_id))
        if not status:
            return None
        if RunStatus(status).is_active:
            final = await self._waiters.until_end(run_id, deadline, self._reads.get_run)
            if final is not None:
                return final
        return await self._reads.get_run(run_id)

    def _accepted(self, run: RunInfo, request: CancelRequest) -> None:
        """A cancel this node had recorded: kept for recovery, and delivered at once if the
        run is here."""
        self._recovery.accepted(run.run_id, request)
        here = run.owner == self._lease.identity.node_id
        if here and self._local.deliver(run.run_id, request) is Delivery.DELIVERED:
            self._stats.cancels_delivered += 1

    async def _end_of(
        self, code: str, run: RunInfo | None, wait: bool, deadline: float
    ) -> CancelResult | None:
        """How a stopping run ended, if it did before the deadline (and the caller waits)."""
        if code != "stopping" or run is None or not wait:
            return None
        final = await self._waiters.until_end(run.run_id, deadline, self._reads.get_run)
        return None if final is None else CancelResult(outcome=_outcome_of(final), run=final)


def _outcome_of(final: RunInfo) -> Outcome:
    if final.end_reason == "owner_lost":
        return Outcome.OWNER_LOST
    if final.status is RunStatus.CANCELLED:
        return Outcome.CANCELLED
    return Outcome.ALREADY_FINISHED

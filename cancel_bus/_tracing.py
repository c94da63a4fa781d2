"""OpenTelemetry, when it is installed: a cancel continues its caller's trace across the bus.

The asking node opens ``cancel_bus.cancel`` in the caller's context and sends that span's W3C
``traceparent`` with the request: Redis keeps it with the run's cancel (``cancel_traceparent``)
and the cancel message carries it (the seal covers it), so the owner's node, however the cancel
reaches it (message or sweep), records its part as children of that span:
``cancel_bus.deliver`` when the run's token is set, ``cancel_bus.observe`` at the checkpoint
that raised, ``cancel_bus.finish`` once the end is recorded. The record, trace context
included, goes back to the waiting caller in the finish notice. Without ``opentelemetry-api``,
or with no SDK configured, nothing is traced and nothing is sent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from ._version import VERSION

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the library works without OpenTelemetry
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.trace import Span

TRACEPARENT = "traceparent"
_PROPAGATOR = TraceContextTextMapPropagator() if trace is not None else None


@contextlib.contextmanager
def span(name: str, attributes: Mapping[str, str]) -> Iterator[tuple[str, Span | None]]:
    """A span of this node around the block, in the current context -> its ``traceparent``
    (``''``: not traced) and the span, to note what the block found out (None: no tracing)."""
    if trace is None or _PROPAGATOR is None:
        yield "", None
        return
    tracer = trace.get_tracer("cancel_bus", VERSION)
    with tracer.start_as_current_span(name, attributes=attributes) as current:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        yield carrier.get(TRACEPARENT, ""), current


def happened(
    name: str, traceparent: str, attributes: Mapping[str, str], at: float | None = None
) -> None:
    """A moment of the cancel on this node (``at``: when, seconds since the epoch; else now),
    in the trace ``traceparent`` (the caller checks it has one)."""
    if trace is None or _PROPAGATOR is None:
        return
    context = _PROPAGATOR.extract({TRACEPARENT: traceparent})
    when = None if at is None else int(at * 1e9)
    tracer = trace.get_tracer("cancel_bus", VERSION)
    tracer.start_span(name, context=context, attributes=attributes, start_time=when).end(
        end_time=when
    )

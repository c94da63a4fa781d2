"""OpenTelemetry for the node: off unless the standard ``OTEL_*`` variables ask for traces.

An OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``)
turns it on, ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` off; every other
``OTEL_*`` variable (headers, timeouts, the batch's delay, the service's name and attributes)
is read by the SDK as usual. On, the node exports its spans over OTLP/HTTP in batches (flushed
when it stops), instruments its HTTP server with the standard FastAPI instrumentation (a
caller's ``traceparent`` header is continued), and the library's cancel spans
(``cancel_bus._tracing``) join the trace on every node a cancel crosses. It needs the extra
``cancel-bus[otel]``; asked for without it, the node refuses to start, in one line.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from fastapi import FastAPI

from cancel_bus import __version__ as VERSION

ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SERVICE_NAME = "cancel-bus-node"  # unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES say


def wanted(environ: Mapping[str, str]) -> str | None:
    """The variable that asks for traces, if the environment does (and nothing turns them off)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return None
    return next((name for name in ENDPOINTS if environ.get(name, "").strip()), None)


def start_tracing(app: FastAPI, environ: Mapping[str, str] = os.environ) -> Callable[[], None]:
    """Trace the app if the environment asks for it -> what flushes and stops the export (a
    no-op when off). Raises ValueError if asked for without OpenTelemetry installed."""
    asked_by = wanted(environ)
    if asked_by is None:
        return lambda: None
    try:
        from opentelemetry import trace  # noqa: PLC0415 (the extra is optional)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor  # noqa: PLC0415
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
    except ImportError as exc:
        raise ValueError(
            f"{asked_by} asks for traces, but OpenTelemetry is not installed ({exc.name}): "
            "install cancel-bus[otel], or unset it"
        ) from None
    resource = Resource.create({"service.version": VERSION})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)
    return provider.shutdown

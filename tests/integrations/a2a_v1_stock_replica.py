"""a2a-sdk 1.x as it is, on one process (see replica.py): trpc-agent's ``a2a_v1`` service of the
scripted agent (JSON-RPC at ``/a2a``, REST under ``/rest``), served by the SDK's own
``DefaultRequestHandler`` and in-memory task store, nothing of cancel-bus in the way: the
reference that the replicas' answers are compared with (test_a2a_v1_differential.py). Also the
agent's gates and the store's read counts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes.rest_routes import create_rest_routes
from starlette.applications import Starlette
from trpc_agent_sdk.server.a2a_v1 import TrpcA2aAgentService, create_a2a_application

from cancel_bus import CancelBus

from .a2a_reads import read_routes
from .a2a_v1_replica import CountingTaskStore, card
from .replica_routes import gate_routes
from .trpc_support import APP, GatedSessionService, StreamingAgent


@asynccontextmanager
async def serve(bus: CancelBus, url: str) -> AsyncIterator[Starlette]:
    del bus  # stock: no bus
    agent = StreamingAgent(name="streamer")
    service = TrpcA2aAgentService(
        service_name=APP,
        agent=agent,
        agent_card=card(url),
        session_service=GatedSessionService(agent),
    )
    store = CountingTaskStore()
    handler = DefaultRequestHandler(agent_executor=service, task_store=store, agent_card=card(url))
    a2a = create_a2a_application(service, request_handler=handler)
    yield Starlette(
        routes=[
            *a2a.routes,
            *gate_routes(agent.gate),
            *read_routes(store.reads),
            *create_rest_routes(handler, path_prefix="/rest"),
        ]
    )

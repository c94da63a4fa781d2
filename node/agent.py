"""The simulated agent: streams text chunks, then calls tools, turn after turn, with the
checkpoints a real agent has (trpc-agent's LlmAgent: after every streamed chunk, after every
tool, and between turns)."""

from __future__ import annotations

import asyncio

from cancel_bus import RunHandle

from .schemas import AgentSpec

CANCEL_MARKER = "User cancel the agent execution."
_WORDS = ("the ", "agent ", "thinks ", "about ", "your ", "question ", "and ", "answers ")


async def run_agent(run: RunHandle, spec: AgentSpec) -> None:
    """A tool that is in flight when a cancel comes (modes checkpoint and after_turn) completes
    and its result is kept; tools not yet started are skipped."""
    interval = spec.token_interval_ms / 1000
    for turn in range(spec.turns):
        if turn:
            run.turn_boundary()
        run.phase = "llm"
        for i in range(spec.tokens):
            await asyncio.sleep(interval)
            run.emit(_WORDS[i % len(_WORDS)])
            run.checkpoint()
        for tool in spec.tools:
            run.phase = f"tool:{tool.name}"
            run.emit_event("tool_call", {"name": tool.name, "turn": turn})
            await asyncio.sleep(tool.duration_ms / 1000)
            result = f"[{tool.name}: done]"
            run.emit(result)
            run.emit_event("tool_result", {"name": tool.name, "turn": turn, "result": result})
            run.checkpoint()
    run.phase = "done"


def record_cancellation(run: RunHandle) -> None:
    """After a cancel stopped the agent: keep the partial output and say why it ends there."""
    if run.cancel_requested is not None:
        run.emit(f"\n{CANCEL_MARKER}")
        run.emit_event("cancelled", {"reason": run.cancel_requested.reason})

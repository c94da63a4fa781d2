"""trpc-agent's internals that ``trpc_agent.py`` replaces or wraps, and the check, at install
time, that this version of trpc-agent still has their shape."""

from __future__ import annotations

import importlib.metadata
import inspect
from typing import Any

from trpc_agent_sdk.cancel import _cancel  # type: ignore[import-untyped]
from trpc_agent_sdk.runners import Runner  # type: ignore[import-untyped]

SUPPORTED = "trpc-agent-py>=1.1,<1.3"
ORIGINAL_RUN_ASYNC = Runner.run_async

# The manager's methods and parameters this module replaces, and the module functions that must
# reach them through ``_manager``; checked at install time.
_METHODS = {
    "register_run": ("self", "app_name", "user_id", "session_id"),
    "cancel_run": ("self", "app_name", "user_id", "session_id"),
    "is_cancelled": ("self", "session_key"),
    "cleanup_run": ("self", "app_name", "user_id", "session_id"),
    "get_active_sessions": ("self",),
    "get_cancel_event": ("self", "session_key"),
}
_FUNCTIONS = (
    "register_run",
    "cancel_run",
    "is_run_cancelled",
    "cleanup_run",
    "raise_if_cancelled",
    "get_cancel_event",
)
_RUN_ASYNC = ("self", "user_id", "session_id", "new_message", "run_config", "agent_context")


def checked_cancel_module() -> Any:
    """``trpc_agent_sdk.cancel._cancel`` if it still has the shape this module replaces."""
    module: Any = _cancel
    problems: list[str] = []
    manager_class = getattr(module, "_RunCancellationManager", None)
    if manager_class is None or not hasattr(module, "_manager"):
        problems.append("no _RunCancellationManager/_manager")
    else:
        for name, parameters in _METHODS.items():
            method = getattr(manager_class, name, None)
            if method is None or tuple(inspect.signature(method).parameters) != parameters:
                problems.append(f"_RunCancellationManager.{name}")
    for name in _FUNCTIONS:
        function = getattr(module, name, None)
        if function is None or "_manager" not in function.__code__.co_names:
            problems.append(f"{name}() does not use _manager")
    if tuple(inspect.signature(ORIGINAL_RUN_ASYNC).parameters) != _RUN_ASYNC:
        problems.append("Runner.run_async")
    if problems:
        version = importlib.metadata.version("trpc-agent-py")
        raise RuntimeError(
            f"cancel_bus.integrations.trpc_agent supports {SUPPORTED}; trpc-agent-py {version} "
            f"changed trpc_agent_sdk.cancel._cancel: {'; '.join(problems)}"
        )
    return module

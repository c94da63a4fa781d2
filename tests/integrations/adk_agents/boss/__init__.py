"""The ADK app ``boss`` (see adk_support.py)."""

from . import agent  # noqa: F401 (ADK's loader finds root_agent here)

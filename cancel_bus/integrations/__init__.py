"""Adapters that make agent frameworks' own cancel APIs work across nodes.

Each adapter is one module importing its framework (see docs/integrations.md); install the
matching extra, e.g. ``pip install 'cancel-bus[langgraph]'``. The core package never imports them.
"""

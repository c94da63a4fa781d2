"""The cancel-bus node service: HTTP API, CLI, embedded server, dashboard."""

"""The optional comparison with other Redis-based systems (each in its own virtualenv)."""

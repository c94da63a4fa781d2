"""The Redis client factory, its retry policy, and the one place redis errors are translated."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    NoPermissionError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._errors import BusUnavailable, CancelBusError

RETRYABLE: tuple[type[RedisError], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    BusyLoadingError,
    ReadOnlyError,
)


def create_client(
    url: str,
    *,
    client_name: str,
    retries: int = 3,
    socket_timeout: float = 5.0,
    max_connections: int = 64,
    **extra: Any,
) -> Redis:
    """A client with an explicit retry policy (jittered exponential backoff, bounded attempts),
    health checks and keepalive, answering ``str``."""
    return Redis.from_url(
        url,
        decode_responses=True,
        client_name=client_name,
        retry=Retry(ExponentialWithJitterBackoff(cap=0.5, base=0.02), retries, RETRYABLE),
        retry_on_error=list(RETRYABLE),
        socket_timeout=socket_timeout,
        socket_connect_timeout=min(socket_timeout, 2.0),
        socket_keepalive=True,
        health_check_interval=30,
        max_connections=max_connections,
        **extra,
    )


@contextlib.contextmanager
def translated(action: str) -> Iterator[None]:
    """Translate what redis-py raises into the cancel-bus error tree (``raise ... from exc``)."""
    try:
        yield
    except RETRYABLE as exc:
        raise BusUnavailable(f"{action}: Redis unavailable ({type(exc).__name__}: {exc})") from exc
    except (AuthenticationError, NoPermissionError) as exc:
        raise BusUnavailable(f"{action}: Redis refused access ({exc})") from exc
    except ResponseError as exc:
        raise CancelBusError(f"{action}: Redis error: {exc}") from exc
    except RedisError as exc:
        raise BusUnavailable(f"{action}: {type(exc).__name__}: {exc}") from exc
    except OSError as exc:
        raise BusUnavailable(f"{action}: {exc}") from exc
    except RuntimeError as exc:
        if not is_closed_transport(exc):
            raise
        raise BusUnavailable(f"{action}: Redis connection lost ({exc})") from exc


def is_closed_transport(exc: BaseException) -> bool:
    """uvloop reports a write on a connection the peer reset as a RuntimeError, not an OSError
    (MagicStack/uvloop#506); redis-py has already discarded the connection when it surfaces."""
    return isinstance(exc, RuntimeError) and "handler is closed" in str(exc)

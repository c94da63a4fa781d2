"""Connecting to Redis (a server, a Sentinel group or a Cluster), the retry policy, and the one
place redis errors are translated.

URLs: ``redis://`` / ``rediss://`` (one server), ``redis+sentinel://[user:pass@]host:port,
host:port/<service>/<db>`` (commands and subscriptions follow the current primary; sentinel
credentials as ``?sentinel_username=&sentinel_password=``), ``redis+cluster://[user:pass@]
host:port,host:port`` (sharded pub/sub). A ``rediss+`` scheme uses TLS; other query parameters
are redis-py connection options (e.g. ``ssl_ca_certs``).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
import redis.exceptions
from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import URL_QUERY_ARGUMENT_PARSERS
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import AbstractBackoff, ExponentialWithJitterBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import (
    AskError,
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    AuthorizationError,
    BusyLoadingError,
    ClusterCrossSlotError,
    ClusterDownError,
    DataError,
    ExecAbortError,
    LockError,
    MasterDownError,
    MovedError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    PubSubError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
    WatchError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._errors import BusMisconfigured, BusUnavailable, CancelBusError, InvalidArgument

T = TypeVar("T")
Client = Redis | RedisCluster  # a command client, of one server or a cluster
Script = AsyncScript  # a registered Lua script (EVALSHA, loaded again after NOSCRIPT)
RETRYABLE: tuple[type[Exception], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    BusyLoadingError,
    ReadOnlyError,
    TryAgainError,
    ClusterDownError,
    SlotNotCoveredError,
)
_REDIS_RETRY = tuple(e for e in RETRYABLE if issubclass(e, RedisError))
_SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")
# URL options redis-py's connections take as text (the typed ones are URL_QUERY_ARGUMENT_PARSERS)
_TEXT_OPTIONS = frozenset(
    {
        "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_path", "ssl_ca_data",
        "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_ciphers", *_SENTINEL_OPTIONS,
    }
)  # fmt: skip
_CERT_REQS = ("none", "optional", "required")
CLUSTER_NEEDS = (8, 0)  # redis-py's asyncio PubSub has ssubscribe from 8.0 on


def backoff(base: float, cap: float) -> AbstractBackoff:
    """Jittered exponential: a rest of up to ``base * 2**failures``, at most ``cap`` seconds."""
    return ExponentialWithJitterBackoff(cap=cap, base=base)


@dataclass(frozen=True, slots=True)
class Topology:
    """The command client, and how to get a client for subscribing to a channel."""

    client: Redis | RedisCluster
    cluster: bool

    @property
    def pub_command(self) -> str:
        """How a node channel is published to: sharded pub/sub on a cluster."""
        return "SPUBLISH" if self.cluster else "PUBLISH"

    async def subscriber(self, channel: str) -> tuple[Redis, bool]:
        """A client to (s)subscribe ``channel`` with, and whether it is a dedicated one (to close
        after use). On a cluster: the primary serving the channel's slot, looked up afresh."""
        if not isinstance(self.client, RedisCluster):
            return self.client, False
        with translated("find the channel's shard"):
            await self.client.initialize()
            node: ClusterNode | None = self.client.get_node_from_key(channel)
        if node is None:
            raise BusUnavailable(f"no cluster node serves {channel}")
        pool = ConnectionPool(connection_class=node.connection_class, **node.connection_kwargs)
        return Redis.from_pool(pool), True

    async def aclose(self) -> None:
        await self.client.aclose()


# the attribute redis-py's get_connection_count() tells a pool's connections apart by
_CONNECTION_STATE = "db.client.connection.state"


def pool_counts(client: Client) -> dict[str, int]:
    """The command pool's connections by state (``idle``, ``used``), as redis-py counts them;
    empty on a cluster (a pool per shard) or with a redis-py that does not count."""
    pool = getattr(client, "connection_pool", None)
    counts = getattr(pool, "get_connection_count", None)
    if counts is None:
        return {}
    return {str(attributes[_CONNECTION_STATE]): int(count) for count, attributes in counts()}


async def info_of(client: Client, key: str) -> dict[str, Any]:
    """``INFO`` of the server that holds ``key`` (on a cluster: the primary of its slot)."""
    if isinstance(client, RedisCluster):
        await client.initialize()  # its map of the slots, once
        return await client.info(target_nodes=client.get_node_from_key(key))
    return await client.info()


def connect(
    url: str,
    *,
    client_name: str,
    retries: int = 3,
    socket_timeout: float = 5.0,
    max_connections: int = 64,
) -> Topology:
    """Clients with an explicit retry policy (jittered exponential backoff, bounded attempts),
    health checks and keepalive, answering ``str``. A URL that cannot work is an
    :class:`InvalidArgument` whose message holds no password."""
    try:
        return _connect(url, client_name, retries, socket_timeout, max_connections)
    except (ValueError, TypeError) as exc:
        if isinstance(exc, InvalidArgument):
            raise
        where, userinfo = _redacted(url)
        reason = (
            "check the host, port and database; percent-encode # / ? @ : in the user name and "
            "password"
            if userinfo
            else str(exc)
        )  # redis-py's words may quote the password: not shown when the URL has one
        raise InvalidArgument(f"invalid Redis URL {where}: {reason}") from None


def _redacted(url: str) -> tuple[str, bool]:
    """The URL with its user name and password as ``***``; whether it had any."""
    scheme, separator, rest = url.partition("://")
    _, at, host = rest.rpartition("@")
    return (f"{scheme}{separator}***@{host}", True) if at else (url, False)


def _connect(
    url: str, client_name: str, retries: int, socket_timeout: float, max_connections: int
) -> Topology:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    query = _query_options(parts.query)  # checked for every scheme: redis-py takes any name
    if not scheme.endswith("+sentinel") and query.keys() & set(_SENTINEL_OPTIONS):
        raise InvalidArgument("sentinel_username and sentinel_password need a redis+sentinel URL")
    options: dict[str, Any] = {
        "decode_responses": True,
        "client_name": client_name,
        "retry": Retry(ExponentialWithJitterBackoff(cap=0.5, base=0.02), retries, _REDIS_RETRY),
        "retry_on_error": list(RETRYABLE),
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": min(socket_timeout, 2.0),
        "socket_keepalive": True,
        "health_check_interval": 30,
        "max_connections": max_connections,
    }
    if scheme in ("redis", "rediss", "unix"):
        if scheme == "unix":
            options.pop("socket_keepalive")  # a TCP option: a Unix socket's connection refuses it
        # a busy node waits for a free connection instead of failing with "too many connections"
        pool = BlockingConnectionPool.from_url(url, timeout=socket_timeout, **options)
        return Topology(Redis.from_pool(pool), cluster=False)
    base, _, kind = scheme.partition("+")
    if base not in ("redis", "rediss") or kind not in ("sentinel", "cluster"):
        raise InvalidArgument(f"unsupported Redis URL scheme {parts.scheme!r}")
    hosts = _hosts(parts.netloc.rpartition("@")[2])
    options.update(query)
    options["ssl"] = base == "rediss"
    if parts.username:
        options["username"] = unquote(parts.username)
    if parts.password:
        options["password"] = unquote(parts.password)
    if kind == "cluster":
        _require_sharded_pubsub()
        options.pop("health_check_interval")  # PubSub-style pings do not apply to a cluster
        nodes = [ClusterNode(host, port) for host, port in hosts]
        return Topology(RedisCluster(startup_nodes=nodes, **options), cluster=True)
    path = [segment for segment in parts.path.split("/") if segment]
    if not path:
        raise InvalidArgument("a redis+sentinel URL needs the service name: .../<service>/<db>")
    options["db"] = int(path[1]) if len(path) > 1 else 0
    sentinel_options = {key[9:]: options.pop(key) for key in _SENTINEL_OPTIONS if key in options}
    sentinel_options.update(
        {key: value for key, value in options.items() if key.startswith("ssl")},
        socket_timeout=options["socket_timeout"],
    )  # the sentinels are reached like the data nodes: same TLS settings
    sentinel = Sentinel(hosts, sentinel_kwargs=sentinel_options, **options)
    return Topology(sentinel.master_for(path[0], redis_class=Redis), cluster=False)


def _require_sharded_pubsub(version: str | None = None) -> None:
    """A Cluster's node channels are sharded (``SSUBSCRIBE``): redis-py 8.0 or later."""
    version = version or redis.__version__
    major_minor = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    if major_minor < CLUSTER_NEEDS:
        raise InvalidArgument(
            f"a redis+cluster URL needs redis-py {'.'.join(map(str, CLUSTER_NEEDS))} or later "
            f"(sharded pub/sub in asyncio); installed: {version}"
        )


def _query_options(query: str) -> dict[str, Any]:
    """URL query parameters as redis-py options, typed the way redis-py types them; a name
    redis-py does not take is refused here (redis-py would fail at the first connection)."""
    options: dict[str, Any] = {}
    for name, value in parse_qsl(query):
        if name not in URL_QUERY_ARGUMENT_PARSERS and name not in _TEXT_OPTIONS:
            known = ", ".join(sorted({*URL_QUERY_ARGUMENT_PARSERS, *_TEXT_OPTIONS}))
            raise InvalidArgument(f"unknown Redis URL option {name!r} (known: {known})")
        if name == "ssl_cert_reqs" and value not in _CERT_REQS:
            raise InvalidArgument(f"the URL option ssl_cert_reqs is one of {', '.join(_CERT_REQS)}")
        parser = URL_QUERY_ARGUMENT_PARSERS.get(name)
        try:
            options[name] = parser(value) if parser else value
        except (TypeError, ValueError):
            raise InvalidArgument(f"invalid value for the URL option {name}: {value!r}") from None
    return options


def _hosts(netloc: str) -> list[tuple[str, int]]:
    hosts = []
    for item in netloc.split(","):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidArgument(f"a host:port list is expected, got {item!r}")
        hosts.append((host.strip("[]"), int(port)))
    return hosts


class Failure(StrEnum):
    """What a Redis failure means for the bus (every error reply and connection failure is one)."""

    UNAVAILABLE = "unavailable"  # retry later: what waits for Redis keeps waiting
    MISCONFIGURED = "misconfigured"  # refused until an operator acts
    DEFECT = "defect"  # a bug, ours or of whatever wrote into the namespace's keys


# Error replies by their code (the reply's first word). Anything not listed is a defect.
REPLY_CODES: dict[str, Failure] = {
    **dict.fromkeys(
        ("OOM", "LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY",
         "MISCONF", "NOREPLICAS", "MOVED", "ASK", "NOSCRIPT"),
        Failure.UNAVAILABLE,
    ),
    **dict.fromkeys(("NOPERM", "NOAUTH", "WRONGPASS", "NOPROTO"), Failure.MISCONFIGURED),
}  # fmt: skip
# redis-py strips the code of the replies it maps to a class (before 8.1 it keeps no
# ``status_code``): the class names the code again. Subclasses first.
_CLASS_CODES: tuple[tuple[type[ResponseError], str], ...] = (
    (OutOfMemoryError, "OOM"), (ReadOnlyError, "READONLY"), (TryAgainError, "TRYAGAIN"),
    (MasterDownError, "MASTERDOWN"), (ClusterDownError, "CLUSTERDOWN"), (MovedError, "MOVED"),
    (AskError, "ASK"), (NoPermissionError, "NOPERM"), (ExecAbortError, "EXECABORT"),
    (NoScriptError, "NOSCRIPT"), (ClusterCrossSlotError, "CROSSSLOT"),
)  # fmt: skip
# ERR replies that name a misconfiguration: a command renamed away or disabled, a cluster URL to
# a server without cluster support
_MISCONFIGURED_ERR = re.compile(r"^(unknown (sub)?command|.*cluster support disabled)", re.I)
# a script's error as older servers wrap it: "ERR Error running script ...: -OOM command ..."
_WRAPPED_CODE = re.compile(r"-([A-Z]{2,}) ")
_ACCESS_REFUSED: tuple[type[RedisError], ...] = (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    AuthorizationError,
    getattr(redis.exceptions, "ExternalAuthProviderError", AuthenticationError),  # redis-py 7+
)
# raised by redis-py before anything reached Redis: a bad call of ours
_LOCAL_DEFECTS = (DataError, WatchError, LockError, PubSubError)


def reply_code(exc: ResponseError) -> tuple[str, str]:
    """An error reply's code, and the rest of its text."""
    for kind, code in _CLASS_CODES:
        if isinstance(exc, kind):
            return code, str(exc)
    code, _, rest = str(exc).partition(" ")
    if getattr(exc, "status_code", None) == code or code.isupper():
        return code, rest
    return "ERR", str(exc)  # redis-py stripped the ERR


def reply_failure(code: str, text: str) -> Failure:
    """What an error reply means, by its code (and, for ``ERR``, its words)."""
    if code == "ERR":
        wrapped = _WRAPPED_CODE.search(text)
        if wrapped is not None and wrapped.group(1) in REPLY_CODES:
            return REPLY_CODES[wrapped.group(1)]
        return Failure.MISCONFIGURED if _MISCONFIGURED_ERR.match(text) else Failure.DEFECT
    return REPLY_CODES.get(code, Failure.DEFECT)


def failure_of(exc: BaseException) -> Failure | None:
    """What ``exc`` means for the bus if it is a Redis (or connection) failure, else None."""
    if isinstance(exc, _ACCESS_REFUSED):
        return Failure.MISCONFIGURED
    if isinstance(exc, ResponseError):
        return reply_failure(*reply_code(exc))
    if isinstance(exc, _LOCAL_DEFECTS):
        return Failure.DEFECT
    if isinstance(exc, RedisError | RedisClusterException | OSError) or is_closed_transport(exc):
        return Failure.UNAVAILABLE  # connections, timeouts, a cluster out of reach, garbage
    return None


@contextlib.contextmanager
def translated(action: str) -> Iterator[None]:
    """Translate what redis-py raises into the cancel-bus error tree (``raise ... from exc``):
    :class:`BusUnavailable`, :class:`BusMisconfigured`, or :class:`CancelBusError` (a defect)."""
    try:
        yield
    except Exception as exc:
        failure = failure_of(exc)
        if failure is None:
            raise
        raise error_for(failure, action, exc) from exc


def error_for(failure: Failure, action: str, exc: BaseException) -> CancelBusError:
    """The cancel-bus error that says ``action`` failed with ``exc`` (one line, no secrets)."""
    code: str | None = None
    if isinstance(exc, ResponseError):
        code, text = reply_code(exc)
        what = f"{code} {text}"
    else:
        what = f"{type(exc).__name__}: {exc}"
    if failure is Failure.UNAVAILABLE:
        return BusUnavailable(f"{action}: Redis unavailable ({what})", code)
    if failure is Failure.MISCONFIGURED:
        return BusMisconfigured(f"{action}: Redis refused access ({what})", code)
    return CancelBusError(f"{action}: Redis error: {what}")


async def within(timeout: float, call: Awaitable[T], doubt: str = "") -> T:
    """The call's answer, or :class:`BusUnavailable` if Redis gives none within ``timeout``
    (``doubt``: what the caller cannot know then)."""
    try:
        async with asyncio.timeout(timeout):
            return await call
    except TimeoutError as exc:
        raise BusUnavailable(f"no answer from Redis within the timeout{doubt}") from exc


def translate(action: str, exc: BaseException) -> BaseException:
    """What :func:`translated` raises for ``exc`` (an error a future carried)."""
    failure = failure_of(exc)
    return exc if failure is None else error_for(failure, action, exc)


def is_closed_transport(exc: BaseException) -> bool:
    """uvloop reports a write on a connection the peer reset as a RuntimeError, not an OSError
    (MagicStack/uvloop#506); redis-py has already discarded the connection when it surfaces."""
    return isinstance(exc, RuntimeError) and "handler is closed" in str(exc)

"""What every peer's script shares (it runs in the peer's own venv: the standard library and
redis-py, which every peer depends on, only).

A peer script is ``python -m benchmarks.peers.<peer> worker`` or ``... client N OUT``, with the
Redis URL in ``BENCH_REDIS_URL`` (the peers' CLIs import the module: it configures itself at
import). The worker runs the peer's own worker. The client measures N cancels, one at a time,
the way the cancel-bus benchmark does:

1. enqueue a job given a fresh token; the job signals ``started`` (its pid and time) on the
   Redis list ``bench:started:<token>``, then loops (a tight loop that yields);
2. wait a random 0-1 s (a job is cancelled at a random moment of its first second: a peer that
   polls is measured at a random phase of its poll), then ``t0 = time.time_ns()``, the peer's
   public cancel call, its public way of learning the job ended (its result or state), ``t1``:
   confirmed = t1 - t0;
3. observed = when the work stopped, minus t0: the job's own ``time.time_ns()`` where the peer
   raises in the job (pushed to ``bench:observed:<token>``), or where the peer kills the job's
   process, the moment that process exited (a pidfd watched by a thread of the client).

The client takes ``WARMUP + N`` samples and writes the last N as
``{"observed_ns": [...], "confirmed_ns": [...]}`` to OUT.
"""

from __future__ import annotations

import json
import os
import random
import select
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import redis

URL = os.environ["BENCH_REDIS_URL"]
STARTED = "bench:started:"
OBSERVED = "bench:observed:"
WAIT = 30.0  # the bound of every wait of a client
WARMUP = 3  # samples taken first and left out
MAX_DELAY = 1.0  # seconds between a job's start and its cancel: uniform in [0, MAX_DELAY)

Sample = tuple[int, int]  # (observed, confirmed) in ns


def connect() -> redis.Redis:
    """A plain client of the peer's server."""
    return redis.Redis.from_url(URL, socket_timeout=WAIT + 5)


class Signals:
    """A job's start and the moment it observed the cancel, told to the client on Redis lists."""

    def __init__(self, client: redis.Redis | None = None) -> None:
        self.client = client if client is not None else connect()

    def started(self, token: str) -> None:
        """Called by the job when it starts."""
        self.client.rpush(STARTED + token, json.dumps({"pid": os.getpid(), "at": time.time_ns()}))

    def observed(self, token: str) -> None:
        """Called by the job where the peer's cancel raised in it."""
        self.client.rpush(OBSERVED + token, str(time.time_ns()))

    def wait_started(self, token: str) -> int:
        """Block until the job signalled its start, then a random delay; -> the job's pid."""
        pid = int(json.loads(self._pop(STARTED + token))["pid"])
        time.sleep(random.uniform(0, MAX_DELAY))
        return pid

    def wait_observed(self, token: str) -> int:
        """When the job observed its cancel (``time.time_ns()``)."""
        return int(self._pop(OBSERVED + token))

    def _pop(self, key: str) -> str:
        reply = self.client.blpop([key], timeout=WAIT)
        if reply is None:
            raise TimeoutError(f"nothing on {key} within {WAIT}s")
        value = reply[1]
        return value.decode() if isinstance(value, bytes) else str(value)


class ExitWatcher:
    """Records when a process (not our child) exits: a thread polls its pidfd."""

    def __init__(self, pid: int) -> None:
        self._fd = os.pidfd_open(pid)
        self.exited_ns: int | None = None
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        if poller.poll(WAIT * 1000):
            self.exited_ns = time.time_ns()

    def wait(self) -> int:
        self._thread.join(WAIT)
        os.close(self._fd)
        if self.exited_ns is None:
            raise TimeoutError(f"the job's process did not exit within {WAIT}s")
        return self.exited_ns


def tokens(n: int) -> Iterator[str]:
    """A fresh job token for each of the ``WARMUP + n`` samples."""
    for _ in range(WARMUP + n):
        yield uuid.uuid4().hex


def write_samples(samples: list[Sample], out: Path) -> None:
    """Write (observed, confirmed) samples, the first ``WARMUP`` left out."""
    kept = samples[WARMUP:]
    out.write_text(
        json.dumps({"observed_ns": [s[0] for s in kept], "confirmed_ns": [s[1] for s in kept]})
    )


def main(worker: Callable[[], None], client: Callable[[int, Path], None]) -> None:
    """``worker`` or ``client N OUT``."""
    if sys.argv[1] == "worker":
        worker()
    else:
        client(int(sys.argv[2]), Path(sys.argv[3]))

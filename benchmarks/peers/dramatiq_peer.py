"""dramatiq + dramatiq-abort: ``abort(message_id)`` (the ``Abortable`` middleware with its Redis
event backend; defaults otherwise). The worker's watcher thread raises ``Abort`` in the actor's
thread, which observes it. Confirmed: the failure the ``Results`` middleware stores, read with
``Message.get_result(block=True)`` (a blocking BRPOPLPUSH). The worker is the ``dramatiq`` CLI
with one process and one thread."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import ResultFailure, Results
from dramatiq.results.backends import RedisBackend
from dramatiq_abort import Abort, Abortable, abort
from dramatiq_abort.backends import RedisBackend as AbortBackend

from ._peer import URL, WAIT, Sample, Signals, connect, main, tokens, write_samples

MODULE = "benchmarks.peers.dramatiq_peer"
lists = Signals()
results = RedisBackend(client=connect())
broker = RedisBroker(url=URL)
broker.add_middleware(Results(backend=results))
broker.add_middleware(Abortable(backend=AbortBackend(client=connect())))
dramatiq.set_broker(broker)


@dramatiq.actor(max_retries=0, store_results=True, time_limit=int(WAIT * 1000))
def job(token: str) -> None:
    lists.started(token)
    try:
        while True:
            time.sleep(0)
    except Abort:
        lists.observed(token)
        raise


def worker() -> None:
    argv = [sys.executable, "-m", "dramatiq", MODULE, "--processes", "1", "--threads", "1"]
    os.execv(sys.executable, argv)


def client(n: int, out: Path) -> None:
    def sample(token: str) -> Sample:
        message = job.send(token)
        lists.wait_started(token)
        started = time.time_ns()
        abort(message.message_id)
        try:
            message.get_result(backend=results, block=True, timeout=int(WAIT * 1000))
        except ResultFailure:
            pass
        else:
            raise AssertionError("the aborted job returned a result")
        confirmed = time.time_ns() - started
        return lists.wait_observed(token) - started, confirmed

    write_samples([sample(token) for token in tokens(n)], out)


if __name__ == "__main__":
    main(worker, client)

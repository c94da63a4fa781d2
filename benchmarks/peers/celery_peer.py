"""Celery: ``AsyncResult.revoke(terminate=True)`` (prefork pool, one child; the revoke is
broadcast to the workers, which send SIGTERM to the child running the task). Observed: that
child's exit; confirmed: ``AsyncResult.get()`` raising ``TaskRevokedError`` (the worker stores
the REVOKED state and publishes it). Redis is the broker and the result backend. A terminated
child is replaced before the next task runs: a sample takes ~3.4 s here, its delay included."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from celery import Celery
from celery.exceptions import TaskRevokedError

from ._peer import URL, WAIT, ExitWatcher, Sample, Signals, main, tokens, write_samples

MODULE = "benchmarks.peers.celery_peer"
app = Celery("bench", broker=URL, backend=URL)
app.conf.update(worker_prefetch_multiplier=1, broker_connection_retry_on_startup=True)
lists = Signals()


@app.task(name="bench.job")
def job(token: str) -> None:
    lists.started(token)
    while True:
        time.sleep(0)


def worker() -> None:
    argv = [sys.executable, "-m", "celery", "-A", MODULE, "worker", "--pool", "prefork"]
    argv += ["--concurrency", "1", "--loglevel", "warning", "--without-gossip", "--without-mingle"]
    os.execv(sys.executable, argv)


def client(n: int, out: Path) -> None:
    def sample(token: str) -> Sample:
        result = job.delay(token)
        exit_watcher = ExitWatcher(lists.wait_started(token))
        started = time.time_ns()
        result.revoke(terminate=True)
        try:
            result.get(timeout=WAIT)
        except TaskRevokedError:
            pass
        else:
            raise AssertionError("the revoked task returned a result")
        confirmed = time.time_ns() - started
        return exit_watcher.wait() - started, confirmed

    write_samples([sample(token) for token in tokens(n)], out)


if __name__ == "__main__":
    main(worker, client)

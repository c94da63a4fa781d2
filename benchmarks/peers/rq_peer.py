"""RQ: ``send_stop_job_command()`` (the fork-per-job ``Worker``; the command reaches the worker
over pub/sub and it SIGKILLs the work horse). Observed: the horse's exit; confirmed: the failed
result the worker records, read with ``Job.latest_result(timeout=...)`` (a blocking XREAD)."""

from __future__ import annotations

import time
from pathlib import Path

from rq import Queue, Worker, get_current_job
from rq.command import send_stop_job_command
from rq.results import Result

from ._peer import WAIT, ExitWatcher, Sample, Signals, connect, main, tokens, write_samples

QUEUE = "bench"
JOB = "benchmarks.peers.rq_peer.job"  # by name: RQ refuses functions of __main__


def job(token: str) -> None:
    current = get_current_job()
    assert current is not None
    Signals(current.connection).started(token)
    while True:
        time.sleep(0)


def worker() -> None:
    connection = connect()
    Worker([Queue(QUEUE, connection=connection)], connection=connection).work()


def client(n: int, out: Path) -> None:
    lists = Signals()
    queue = Queue(QUEUE, connection=lists.client)

    def sample(token: str) -> Sample:
        rq_job = queue.enqueue(JOB, token, job_timeout=int(WAIT))
        exit_watcher = ExitWatcher(lists.wait_started(token))
        started = time.time_ns()
        send_stop_job_command(lists.client, rq_job.id)
        result = rq_job.latest_result(timeout=int(WAIT))
        confirmed = time.time_ns() - started
        assert result is not None and result.type == Result.Type.FAILED, result
        return exit_watcher.wait() - started, confirmed

    write_samples([sample(token) for token in tokens(n)], out)


if __name__ == "__main__":
    main(worker, client)

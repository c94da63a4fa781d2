"""The HTTP floor: a bare FastAPI app whose only route is the node's ``GET /healthz`` (the same
handler: no Redis, a constant JSON body), served by uvicorn with the node's own options
(``node/cli.py``: ``uvicorn.Config`` defaults, so uvloop and httptools where installed; log
level warning and no access log, as the benchmark's node services run), on
``127.0.0.1:--port``. What the node adds over it (middleware, routers, its
bus) is the node's own cost.

``python -m benchmarks._bare_app --port N``
"""

from __future__ import annotations

import argparse

import uvicorn
from fastapi import FastAPI

app = FastAPI(title="bare app (the HTTP floor)")


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._bare_app")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=args.port,
        log_level="warning",  # as the benchmark's node services (CANCEL_BUS_LOG_LEVEL)
        timeout_graceful_shutdown=5,
        access_log=False,
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()

"""`helm test`: the Service answers ready, auth is enforced, and (with the chart's generated ops
token) the live nodes are listed. Runs with the app image's Python (httpx is installed)."""

import os
import sys
import time

import httpx

url = os.environ["SERVICE_URL"]
with httpx.Client(base_url=url, timeout=10) as client:
    deadline = time.monotonic() + 60
    while True:
        try:
            answer = client.get("/readyz")
            if answer.status_code == 200:
                break
            last = f"{answer.status_code} {answer.text}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        if time.monotonic() > deadline:
            sys.exit(f"{url}/readyz never answered 200: {last}")
        time.sleep(1)
    denied = client.get("/v1/runs")
    if denied.status_code != 401:
        sys.exit(
            f"auth is not enforced: GET /v1/runs without a token answered {denied.status_code}"
        )
    token = os.environ.get("OPS_TOKEN")
    if token:
        answer = client.get("/v1/nodes", headers={"Authorization": f"Bearer {token}"})
        answer.raise_for_status()
        nodes = [node["node_id"] for node in answer.json()["nodes"]]
        if not nodes:
            sys.exit("no live node is registered in Redis")
        print(f"{len(nodes)} live node(s): {', '.join(nodes)}")
print(f"ok: {url} is ready and requires a token")

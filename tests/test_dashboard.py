"""The ops dashboard in a real headless Chromium: a run appears live, cancel stops it."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.embedded import EmbeddedServer

from .node_cluster import Cluster

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium on this machine (Debian package 'chromium')"
)


@pytest.fixture(scope="module")
def cluster(
    redis_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    running = Cluster(redis_server.url, 2, tmp_path_factory.mktemp("dash")).start()
    yield running
    running.stop()


def test_run_appears_live_and_the_cancel_button_stops_it(cluster: Cluster, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    owner, viewer = cluster.nodes
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{viewer.url}/")
            expect(page.locator("#status")).to_have_text("live", timeout=10_000)
            expect(page.locator("#nodes tbody tr")).to_have_count(2, timeout=10_000)

            body = {
                "app_name": "dash",
                "user_id": "u",
                "session_id": uuid.uuid4().hex,
                "agent": {"tokens": 100_000, "token_interval_ms": 10},
            }
            with owner.client() as client:
                run = client.post("/v1/runs", json=body).json()
            row = page.locator(f'tr[data-run-id="{run["run_id"]}"]')
            expect(row).to_be_visible(timeout=10_000)  # no reload: the feed brought it
            expect(row.locator("td").nth(2)).to_have_text("node-1")
            page.screenshot(path=str(tmp_path / "dashboard.png"))

            row.locator("button.cancel").click()
            expect(row).to_have_count(0, timeout=10_000)  # stopped: gone from active runs
            with viewer.client() as client:
                final = client.get(f"/v1/runs/{run['run_id']}").json()
            assert final["status"] == "cancelled"
            assert final["cancel_reason"] == "cancelled from the dashboard"
        finally:
            browser.close()

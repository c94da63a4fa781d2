"""The ops dashboard in a real headless Chromium, against real nodes with API tokens: filter,
open a run's detail, cancel one (confirmed, with mode and reason, the outcome shown), cancel
every matching run (a preview, a tombstone, its removal), a run's tree, leak and checkpoint
profile, rows that keep their place, a narrow screen and a user token, a dying node flagged
before its lease runs out, and the API docs offline. Screenshots are kept under
``.cache/artifacts/dashboard/`` (``CANCEL_BUS_ARTIFACTS`` elsewhere)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from node.embedded import EmbeddedServer

from ..node_cluster import Cluster, NodeProcess

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
ARTIFACTS = (
    Path(os.environ.get("CANCEL_BUS_ARTIFACTS", Path(__file__).parents[2] / ".cache" / "artifacts"))
    / "dashboard"
)
OPS = "ops-" + uuid.uuid4().hex
ALICE = "alice-" + uuid.uuid4().hex
LONG = {"tokens": 100_000, "token_interval_ms": 20}
WAIT = 10_000  # ms, the bound of every wait on the page

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium on this machine (Debian package 'chromium')"
)


@pytest.fixture(scope="module")
def cluster(
    redis_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    tokens = {OPS: {"role": "ops"}, ALICE: {"role": "user", "user_id": "alice"}}
    running = Cluster(
        redis_server.url,
        2,
        tmp_path_factory.mktemp("dash"),
        api_tokens=json.dumps(tokens),
        lease_ttl="6",  # a heartbeat every 2 s: "late" shows for 3 s before the lease expires
        profile_checkpoints="true",
    ).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _page(browser: Any, node: NodeProcess, token: str, hash_: str = "", width: int = 1280) -> Any:
    """A fresh page of ``node``'s dashboard, the token given through its form."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": width, "height": 900})
    page.goto(f"{node.url}/#{hash_}")
    page.get_by_label("Bearer token").fill(token)
    page.get_by_role("button", name="Use token").click()
    expect(page.locator("#status")).to_have_text("live", timeout=WAIT)
    return page


def _start(
    node: NodeProcess, token: str, app: str, user: str, expect: int = 201, **extra: Any
) -> dict[str, Any]:
    body = {"app_name": app, "user_id": user, "session_id": uuid.uuid4().hex, "agent": LONG}
    with node.client(token) as client:
        response = client.post("/v1/runs", json={**body, **extra})
    assert response.status_code == expect, response.text
    run: dict[str, Any] = response.json()
    return run


def _row(page: Any, run: dict[str, Any]) -> Any:
    return page.locator(f'#runs tr[data-run-id="{run["run_id"]}"]')


def _shown_runs(page: Any) -> list[str]:
    ids: list[str] = page.eval_on_selector_all(
        "#runs tbody tr", "rows => rows.map(r => r.dataset.runId)"
    )
    return ids


def _shot(page: Any, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_filter_open_the_detail_and_cancel_one(cluster: Cluster, browser: Any) -> None:
    owner, viewer = cluster.nodes
    shop, bank = f"shop-{uuid.uuid4().hex[:6]}", f"bank-{uuid.uuid4().hex[:6]}"
    ann = _start(owner, OPS, shop, "ann")
    bob = _start(owner, OPS, bank, "bob")
    done = _start(owner, OPS, shop, "cat", agent={"tokens": 2, "token_interval_ms": 1})
    page = _page(browser, viewer, OPS)
    try:
        _filter(page, shop, ann, bob, done)
        _detail_by_keyboard(page, ann)
        _cancel_confirmed(page, viewer, ann)
    finally:
        page.close()
        with owner.client(OPS) as client:
            client.post(f"/v1/runs/{bob['run_id']}/cancel", json={"wait": False})


def _filter(
    page: Any, shop: str, ann: dict[str, Any], bob: dict[str, Any], done: dict[str, Any]
) -> None:
    """By app, then status, then id prefix; the view is in the URL."""
    from playwright.sync_api import expect

    expect(_row(page, ann)).to_be_visible(timeout=WAIT)  # the feed brought it, no reload
    expect(_row(page, bob)).to_be_visible()
    page.get_by_label("App").fill(shop)
    expect(_row(page, bob)).to_have_count(0, timeout=WAIT)
    expect(_row(page, ann)).to_be_visible()
    expect(_row(page, done)).to_have_count(0)  # finished: not active
    page.get_by_label("Status").select_option("all")
    expect(_row(page, done).locator(".status")).to_have_text("succeeded", timeout=WAIT)
    assert f"app_name={shop}" in page.url and "status=all" in page.url  # a shareable view
    _shot(page, "filtered")
    page.get_by_label("App").fill("")
    page.get_by_label("Run id starts with").fill(bob["run_id"][:10])
    expect(page.locator("#runs tbody tr")).to_have_count(1, timeout=WAIT)
    expect(_row(page, bob)).to_be_visible()
    page.get_by_role("button", name="Clear filters").click()
    page.get_by_label("App").fill(shop)
    page.get_by_label("Status").select_option("all")
    expect(page.locator("#runs tbody tr")).to_have_count(2, timeout=WAIT)


def _detail_by_keyboard(page: Any, run: dict[str, Any]) -> None:
    """Enter opens a run's detail, Escape closes it, the focus comes back."""
    from playwright.sync_api import expect

    opener = _row(page, run).get_by_role("button", name=f"Details of run {run['run_id']}")
    opener.focus()
    page.keyboard.press("Enter")
    detail = page.locator("#detail")
    expect(detail).to_be_visible(timeout=WAIT)
    expect(detail.locator("#d-events")).to_contain_text("run.started")
    expect(detail.locator("#d-phases")).to_have_text("no cancel was requested")
    page.keyboard.press("Escape")
    expect(detail).to_be_hidden()
    expect(opener).to_be_focused()


def _cancel_confirmed(page: Any, node: NodeProcess, run: dict[str, Any]) -> None:
    """Confirmed, with a mode and a reason; the outcome is said, the row keeps its place, and
    the detail shows the cancel phase by phase."""
    from playwright.sync_api import expect

    order = _shown_runs(page)
    _row(page, run).get_by_role("button", name=f"Cancel run {run['run_id']}").click()
    confirm = page.locator("#confirm")
    expect(confirm).to_be_visible()
    expect(confirm).to_contain_text(run["run_id"])
    confirm.get_by_label("immediate").check()
    confirm.get_by_label("Reason").fill("runaway")
    _shot(page, "confirm")
    confirm.get_by_role("button", name="Cancel the run").click()
    notice = page.locator("#notice")
    expect(notice).to_have_attribute("data-outcome", "cancelled", timeout=WAIT)
    expect(notice).to_contain_text(f"Run {run['run_id']}: cancelled — it stopped")
    expect(_row(page, run).locator(".status")).to_have_text("cancelled", timeout=WAIT)
    assert _shown_runs(page) == order  # it ended (the most recent now), and kept its place
    with node.client(OPS) as client:
        final = client.get(f"/v1/runs/{run['run_id']}").json()
    assert final["cancel_mode"] == "immediate" and final["cancel_reason"] == "runaway"

    _row(page, run).get_by_role("button", name=f"Details of run {run['run_id']}").click()
    detail = page.locator("#detail")
    for phase in ("delivered", "observed", "finished"):
        expect(detail.locator(f'#d-phases li[data-phase="{phase}"]')).to_contain_text("+")
    expect(detail.locator("#d-fields")).to_contain_text("runaway")
    expect(detail.locator("#d-output")).to_contain_text("User cancel the agent execution.")
    _shot(page, "detail")


def test_cancel_every_matching_run_after_a_preview(cluster: Cluster, browser: Any) -> None:
    """The filters are the selector; the button says why when they cannot be one; a preview
    with the count and the ids, then the outcome; the tombstone shown, and removed."""
    from playwright.sync_api import expect

    owner, viewer = cluster.nodes
    app = f"bulk-{uuid.uuid4().hex[:6]}"
    chosen = [_start(owner, OPS, app, "ann"), _start(owner, OPS, app, "ben")]
    spared = _start(owner, OPS, f"{app}-other", "ann")
    page = _page(browser, viewer, OPS, f"app_name={app}")
    try:
        expect(page.locator("#runs tbody tr")).to_have_count(2, timeout=WAIT)
        _bulk_only_for_a_selector(page)
        _bulk_confirmed(page, app, chosen)
        _tombstone_shown_and_removed(page, owner, app)
    finally:
        page.close()
    with owner.client(OPS) as client:
        for run in chosen:
            final = client.get(f"/v1/runs/{run['run_id']}").json()
            assert final["status"] == "cancelled" and final["cancel_reason"] == "bulk"
        assert client.get(f"/v1/runs/{spared['run_id']}").json()["status"] == "running"
        client.post(f"/v1/runs/{spared['run_id']}/cancel", json={"wait": False})


def _bulk_only_for_a_selector(page: Any) -> None:
    """Enabled for filters a cancel takes; otherwise disabled, saying why."""
    from playwright.sync_api import expect

    bulk = page.get_by_role("button", name="Cancel all matching…")
    why = page.locator("#bulk-why")
    expect(bulk).to_be_enabled()
    page.get_by_label("Phase").fill("llm")
    expect(bulk).to_be_disabled(timeout=WAIT)
    expect(why).to_contain_text("The phase filter cannot select runs to cancel")
    page.get_by_label("Phase").fill("")
    page.get_by_label("Status").select_option("all")
    expect(why).to_contain_text("set Status to active", timeout=WAIT)
    page.get_by_label("Status").select_option("active")
    expect(bulk).to_be_enabled(timeout=WAIT)
    expect(why).to_have_text("")


def _bulk_confirmed(page: Any, app: str, chosen: list[dict[str, Any]]) -> None:
    """The preview (count, ids), a reason and a tombstone, then the outcome."""
    from playwright.sync_api import expect

    page.get_by_role("button", name="Cancel all matching…").click()
    confirm = page.locator("#confirm")
    expect(confirm).to_be_visible(timeout=WAIT)
    expect(confirm).to_contain_text(f"2 active run(s) match app={app}")
    for run in chosen:
        expect(confirm.locator("#confirm-ids")).to_contain_text(run["run_id"])
    confirm.get_by_label("Reason").fill("bulk")
    confirm.get_by_label("Also cancel matching runs started in the next").check()
    confirm.get_by_label("Seconds the tombstone holds").fill("30")
    _shot(page, "bulk-confirm")
    confirm.get_by_role("button", name="Cancel 2 run(s)").click()
    notice = page.locator("#notice")
    expect(notice).to_have_attribute("data-outcome", "bulk", timeout=WAIT)
    expect(notice).to_contain_text(f"2 run(s) of app={app} matched: 2 cancelled.")
    expect(page.locator("#runs tbody tr")).to_have_count(0, timeout=WAIT)


def _tombstone_shown_and_removed(page: Any, owner: NodeProcess, app: str) -> None:
    from playwright.sync_api import expect

    tombstones = page.locator("#tombstones-section")
    expect(tombstones).to_be_visible(timeout=WAIT)
    row = tombstones.locator("tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text(f"app={app}")
    expect(row).to_contain_text("bulk")
    _shot(page, "bulk-done")
    _start(owner, OPS, app, "cat", expect=409)  # held: cancelled at its start
    row.get_by_role("button", name="Remove").click()
    expect(page.locator("#notice")).to_have_attribute(
        "data-outcome", "tombstone-removed", timeout=WAIT
    )
    expect(tombstones).to_be_hidden(timeout=WAIT)
    free = _start(owner, OPS, app, "cat")  # no longer held
    with owner.client(OPS) as client:
        client.post(f"/v1/runs/{free['run_id']}/cancel", json={"wait": False})


def test_a_run_tree_its_leak_and_its_checkpoint_profile(cluster: Cluster, browser: Any) -> None:
    """The detail links a run's parent and children, the cancel says what happened below it,
    a child started after the end shows as a leak, and the slowest checkpoint sites show."""
    from playwright.sync_api import expect

    owner, viewer = cluster.nodes
    app = f"tree-{uuid.uuid4().hex[:6]}"
    parent = _start(owner, OPS, app, "u")
    child = _start(viewer, OPS, app, "u", parent=parent["run_id"])
    page = _page(browser, viewer, OPS, f"status=all&app_name={app}")
    detail = page.locator("#detail")
    try:
        expect(page.locator("#nodes tbody tr .probe").first).to_contain_text(" ms · ", timeout=WAIT)
        _row(page, parent).get_by_role("button", name=f"Details of run {parent['run_id']}").click()
        expect(detail).to_be_visible(timeout=WAIT)
        fields = detail.locator("#d-fields")
        expect(fields).to_contain_text(f"{child['run_id']} (running)", timeout=WAIT)
        slowest = detail.locator("#d-slow")
        expect(slowest).to_be_visible(timeout=WAIT)
        expect(slowest).to_contain_text("node/agent.py:")  # the simulated agent's checkpoint
        fields.get_by_role("button", name=f"Details of run {child['run_id']}").click()
        expect(detail.locator("#d-id")).to_have_text(child["run_id"], timeout=WAIT)
        fields.get_by_role("button", name=f"Details of run {parent['run_id']}").click()
        expect(detail.locator("#d-id")).to_have_text(parent["run_id"], timeout=WAIT)

        detail.get_by_role("button", name="Cancel run…").click()
        page.locator("#confirm").get_by_role("button", name="Cancel the run").click()
        notice = page.locator("#notice")
        expect(notice).to_have_attribute("data-outcome", "cancelled", timeout=WAIT)
        expect(notice).to_contain_text("1 run(s) below it: 1 cancelled.")
        expect(fields).to_contain_text(f"{child['run_id']} (cancelled)", timeout=WAIT)
        _start(owner, OPS, app, "u", expect=409, parent=parent["run_id"])  # never starts...
        detail.locator(".close").first.click()  # ... and its parent's code leaked it: reopen
        _row(page, parent).get_by_role("button", name=f"Details of run {parent['run_id']}").click()
        expect(fields).to_contain_text("child_started 1", timeout=WAIT)
        _shot(page, "tree-detail")
    finally:
        page.close()


def test_live_rows_keep_their_place(cluster: Cluster, browser: Any) -> None:
    from playwright.sync_api import expect

    owner, viewer = cluster.nodes
    app = f"live-{uuid.uuid4().hex[:6]}"
    first, second = _start(owner, OPS, app, "u"), _start(owner, OPS, app, "u")
    page = _page(browser, viewer, OPS, f"status=all&app_name={app}")
    try:
        expect(page.locator("#runs tbody tr")).to_have_count(2, timeout=WAIT)
        assert _shown_runs(page) == [second["run_id"], first["run_id"]]  # the newest on top
        third = _start(owner, OPS, app, "u")
        expect(page.locator("#runs tbody tr")).to_have_count(3, timeout=WAIT)
        assert _shown_runs(page) == [third["run_id"], second["run_id"], first["run_id"]]
        with owner.client(OPS) as client:  # now the most recent, by its end, for the server
            client.post(f"/v1/runs/{first['run_id']}/cancel")
        expect(_row(page, first).locator(".status")).to_have_text("cancelled", timeout=WAIT)
        assert _shown_runs(page) == [third["run_id"], second["run_id"], first["run_id"]]
        nodes = page.eval_on_selector_all(
            "#nodes tbody tr", "rows => rows.map(r => r.dataset.nodeId)"
        )
        assert nodes == sorted(nodes) == ["node-1", "node-2"]
    finally:
        page.close()
        with owner.client(OPS) as client:
            for run in (second, third):
                client.post(f"/v1/runs/{run['run_id']}/cancel", json={"wait": False})


def test_a_narrow_screen_and_a_user_token(cluster: Cluster, browser: Any) -> None:
    from playwright.sync_api import expect

    owner, viewer = cluster.nodes
    run = _start(owner, ALICE, f"narrow-{uuid.uuid4().hex[:6]}", "alice")
    page = _page(browser, viewer, ALICE, width=420)
    try:
        row = _row(page, run)
        expect(row).to_be_visible(timeout=WAIT)
        cancel = row.get_by_role("button", name=f"Cancel run {run['run_id']}")
        box = cancel.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 420, box
        assert page.evaluate("document.documentElement.scrollWidth") <= 420
        expect(page.get_by_role("button", name="Cancel all matching…")).to_be_enabled()  # its own
        note = page.locator("#nodes-note")
        expect(note).to_contain_text("listed for ops tokens only")
        expect(note).to_contain_text("user alice")
        expect(page.locator("#nodes-wrap")).to_be_hidden()
        _shot(page, "narrow-user")
        cancel.click()
        page.locator("#confirm").get_by_role("button", name="Cancel the run").click()
        expect(page.locator("#notice")).to_have_attribute("data-outcome", "cancelled", timeout=WAIT)
        expect(row).to_have_count(0, timeout=WAIT)  # ended: gone from the active runs
        _shot(page, "narrow-cancelled")
    finally:
        page.close()


def test_a_dying_node_is_flagged_before_its_lease_expires(
    cluster: Cluster, browser: Any, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    viewer = cluster.nodes[1]
    env = {k: v for k, v in viewer.env.items() if k.startswith("CANCEL_BUS_")}
    doomed = NodeProcess(f"doomed-{uuid.uuid4().hex[:4]}", env, tmp_path).start().wait_ready()
    try:
        run = _start(doomed, OPS, f"doomed-{uuid.uuid4().hex[:6]}", "u")
        page = _page(browser, viewer, OPS, f"status=all&node_id={doomed.name}")
        row = page.locator(f'#nodes tr[data-node-id="{doomed.name}"]')
        expect(row).to_have_attribute("data-state", "alive", timeout=WAIT)
        doomed.signal(signal.SIGKILL)
        expect(row).to_have_attribute("data-state", "late", timeout=WAIT)
        expect(row).to_contain_text("lease expiring")
        _shot(page, "node-late")
        expect(row).to_have_count(0, timeout=WAIT)  # expired, then reaped by a live node
        status = _row(page, run).locator(".status")
        expect(status).to_have_text("failed · owner_lost", timeout=WAIT)
        _shot(page, "node-dead")
        page.close()
    finally:
        doomed.stop()


@pytest.mark.parametrize(
    ("path", "shows"), [("/docs", ".swagger-ui .info .title"), ("/redoc", "h1")]
)
def test_the_api_docs_render_offline(cluster: Cluster, browser: Any, path: str, shows: str) -> None:
    from playwright.sync_api import expect

    node = cluster.nodes[0]
    page = browser.new_page()
    requested: list[str] = []
    blocked: list[str] = []  # by the page's own policy: they never leave the browser
    page.on("request", lambda request: requested.append(request.url))
    page.on(
        "requestfailed",
        lambda request: request.failure == "csp" and blocked.append(request.url),
    )
    try:
        page.goto(f"{node.url}{path}")
        expect(page.locator(shows).first).to_contain_text("cancel-bus node", timeout=WAIT)
        if path == "/docs":
            expect(page.get_by_role("button", name="Authorize")).to_be_visible()  # the bearer
        _shot(page, path.strip("/"))
    finally:
        page.close()
    elsewhere = [url for url in requested if not url.startswith((node.url, f"blob:{node.url}"))]
    assert requested and elsewhere == blocked, (requested, blocked)


def test_the_page_loads_only_its_own_files(cluster: Cluster, browser: Any) -> None:
    node = cluster.nodes[0]
    page = browser.new_page()
    answers: dict[str, int] = {}
    page.on("response", lambda response: answers.__setitem__(response.url, response.status))
    try:
        page.goto(f"{node.url}/")
        page.wait_for_load_state("load")
        icon = page.locator('link[rel="icon"]').get_attribute("href")
    finally:
        page.close()
    assert answers.get(f"{node.url}/dashboard.js") == 200
    assert answers.get(f"{node.url}/dashboard.css") == 200
    assert icon == "/favicon.svg" and httpx.get(f"{node.url}/favicon.svg").status_code == 200
    assert all(url.startswith(node.url) for url in answers), answers

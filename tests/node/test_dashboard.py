"""The ops dashboard in a real headless Chromium, against real nodes with API tokens: filter,
open a run's detail, cancel one (confirmed, with mode and reason, the outcome shown), cancel
every matching run (a preview, a tombstone, its removal), a run's tree, leak and checkpoint
profile, rows that keep their place, a narrow screen and a user token, a dying node flagged
before its lease runs out, and the API docs offline. Screenshots are kept under
``.cache/artifacts/dashboard/`` (``CANCEL_BUS_ARTIFACTS`` elsewhere)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from node.dashboard import ASSETS
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


def _page(
    browser: Any,
    node: NodeProcess,
    token: str,
    hash_: str = "",
    width: int = 1280,
    scheme: str = "dark",
) -> Any:
    """A fresh page of ``node``'s dashboard, the token given through its form; the system's
    colour scheme ``scheme``."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": width, "height": 900}, color_scheme=scheme)
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


def test_a_double_text_links_the_replaced_run_and_its_successor(
    cluster: Cluster, browser: Any
) -> None:
    """A follow-up on another node interrupts the session's run: each detail names the other
    ("replaced by", "replaced"), and the links go back and forth."""
    from playwright.sync_api import expect

    first_node, second_node = cluster.nodes
    app = f"dt-{uuid.uuid4().hex[:6]}"
    first = _start(first_node, OPS, app, "u")
    session = {"session_id": first["session_id"]}
    second = _start(second_node, OPS, app, "u", multitask_strategy="interrupt", **session)
    page = _page(browser, first_node, OPS, f"status=all&app_name={app}")
    detail, fields = page.locator("#detail"), page.locator("#d-fields")
    try:
        _row(page, first).get_by_role("button", name=f"Details of run {first['run_id']}").click()
        expect(detail).to_be_visible(timeout=WAIT)
        expect(fields).to_contain_text(f"replaced by{second['run_id']}", timeout=WAIT)
        fields.get_by_role("button", name=f"Details of run {second['run_id']}").click()
        expect(detail.locator("#d-id")).to_have_text(second["run_id"], timeout=WAIT)
        expect(fields).to_contain_text(f"replaced{first['run_id']}", timeout=WAIT)
        expect(fields).not_to_contain_text("replaced by")
        fields.get_by_role("button", name=f"Details of run {first['run_id']}").click()
        expect(detail.locator("#d-id")).to_have_text(first["run_id"], timeout=WAIT)
        expect(fields).to_contain_text(f"replaced by{second['run_id']}", timeout=WAIT)
        expect(detail.locator("#d-phases")).to_contain_text("finished", timeout=WAIT)
        _shot(page, "double-text-detail")
        detail.locator(".close").first.click()
    finally:
        page.close()
    with second_node.client(OPS) as client:
        assert client.post(f"/v1/runs/{second['run_id']}/cancel").status_code == 200


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
    """Its script and every module it imports (and the theme script) come from the node, with
    no error in the console: the policy lets nothing else run."""
    from playwright.sync_api import expect

    node = cluster.nodes[0]
    page = browser.new_page()
    answers: dict[str, int] = {}
    errors: list[str] = []
    page.on("response", lambda response: answers.__setitem__(response.url, response.status))
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.add_init_script(f"sessionStorage.setItem('cancel-bus-token', {json.dumps(OPS)})")
    try:
        page.goto(f"{node.url}/")  # the tab's token: no 401 to log
        expect(page.locator("#status")).to_have_text("live", timeout=WAIT)
        icon = page.locator('link[rel="icon"]').get_attribute("href")
    finally:
        page.close()
    assert {path: answers.get(f"{node.url}{path}") for path in ASSETS} == dict.fromkeys(ASSETS, 200)
    assert icon == "/favicon.svg" and httpx.get(f"{node.url}/favicon.svg").status_code == 200
    assert all(url.startswith(node.url) for url in answers), answers
    assert errors == []


# -- what a run is doing: live output, links, trees (issue 29) ---------------------------------


def _grows_past(page: Any, chars: int) -> None:
    """Wait until the detail's output holds more than ``chars`` characters."""
    page.wait_for_function(
        "n => document.querySelector('#d-output').textContent.length > n", arg=chars, timeout=WAIT
    )


def _chars(page: Any) -> int:
    shown: int = page.evaluate("document.querySelector('#d-output').textContent.length")
    return shown


def test_a_running_runs_output_streams_live_and_follow_pauses_it(
    cluster: Cluster, browser: Any
) -> None:
    """The detail of a running run streams its output (from its first chunk) through the node
    serving the page; "Follow live" off closes the stream and the text stays; on again, it
    catches up; once the run ends, its recorded output, and no toggle."""
    from playwright.sync_api import expect

    owner, viewer = cluster.nodes
    run = _start(owner, OPS, f"live-out-{uuid.uuid4().hex[:6]}", "u")
    page = _page(browser, viewer, OPS, f"app_name={run['app_name']}")
    detail, output = page.locator("#detail"), page.locator("#d-output")
    try:
        _row(page, run).get_by_role("button", name=f"Details of run {run['run_id']}").click()
        expect(detail.locator("#d-live")).to_have_text("live", timeout=WAIT)
        follow = detail.get_by_label("Follow live")
        expect(follow).to_be_checked()
        expect(output).to_contain_text("the agent thinks about your question", timeout=WAIT)
        assert output.text_content().startswith("the agent thinks")  # from its first chunk
        _grows_past(page, _chars(page))  # live: it grows while we look
        expect(detail.locator("#d-output-size")).to_contain_text("chars so far")
        _shot(page, "detail-live-output")

        with page.expect_event("requestfailed", lambda r: "/stream" in r.url, timeout=WAIT):
            follow.uncheck()  # the stream is closed...
        paused = _chars(page)
        expect(detail.locator("#d-live")).to_have_text(
            f"paused: {paused} chars shown; follow again to catch up"
        )
        age = _row(page, run).locator(".age")
        seen = age.text_content()
        expect(age).not_to_have_text(seen, timeout=WAIT)  # a feed tick later, the run still going
        assert _chars(page) == paused  # ... and the text stays as it was

        with page.expect_request(lambda r: r.url.endswith("/stream?from_start=true")):
            follow.check()
        _grows_past(page, paused)  # caught up, and on
        detail.get_by_role("button", name="Cancel run…").click()
        page.locator("#confirm").get_by_role("button", name="Cancel the run").click()
        expect(output).to_contain_text("User cancel the agent execution.", timeout=WAIT)
        expect(follow).to_be_hidden()
        expect(detail.locator("#d-output-size")).not_to_contain_text("so far")
        assert output.text_content().startswith("the agent thinks")  # the recorded output
    finally:
        page.close()


def test_every_detail_has_a_url_and_back_and_forward_go_through_them(
    cluster: Cluster, browser: Any
) -> None:
    """A link names the filters and the run: opened afresh (the token asked first), it shows
    that run's detail over those filters; opening and closing details adds history entries
    that Back and Forward go through; a hash typed in changes the view."""
    from playwright.sync_api import expect

    owner, viewer = cluster.nodes
    app = f"url-{uuid.uuid4().hex[:6]}"
    parent = _start(owner, OPS, app, "u")
    child = _start(viewer, OPS, app, "u", parent=parent["run_id"])
    page = _page(browser, viewer, OPS, f"status=all&app_name={app}&run={child['run_id']}")
    detail, shown_id = page.locator("#detail"), page.locator("#d-id")
    try:
        expect(detail).to_be_visible(timeout=WAIT)
        expect(shown_id).to_have_text(child["run_id"])
        expect(detail.locator("#d-fields")).to_contain_text(parent["run_id"], timeout=WAIT)
        expect(page.get_by_label("App")).to_have_value(app)
        expect(page.get_by_label("Status")).to_have_value("all")
        _shot(page, "linked-detail")
        page.keyboard.press("Escape")
        expect(detail).to_be_hidden()
        expect(page.locator("#runs tbody tr")).to_have_count(2, timeout=WAIT)
        expect(page).to_have_url(re.compile(f"#status=all&app_name={app}$"))

        _row(page, parent).get_by_role("button", name=f"Details of run {parent['run_id']}").click()
        expect(shown_id).to_have_text(parent["run_id"], timeout=WAIT)
        expect(page).to_have_url(re.compile(f"&run={parent['run_id']}$"))
        link = detail.locator("#d-fields").get_by_role(
            "button", name=f"Details of run {child['run_id']}"
        )
        node = link.element_handle(timeout=WAIT)
        before = detail.locator("#d-fields").text_content()
        expect(detail.locator("#d-fields")).not_to_have_text(before, timeout=WAIT)  # a refresh
        assert node.evaluate("el => el.isConnected")  # the link was left alone: a click holds
        link.click()
        expect(shown_id).to_have_text(child["run_id"], timeout=WAIT)
        expect(page).to_have_url(re.compile(f"&run={child['run_id']}$"))

        page.go_back()
        expect(shown_id).to_have_text(parent["run_id"], timeout=WAIT)
        expect(detail).to_be_visible()
        page.go_back()
        expect(detail).to_be_hidden(timeout=WAIT)
        expect(page).to_have_url(re.compile(f"#status=all&app_name={app}$"))
        page.go_forward()
        expect(detail).to_be_visible(timeout=WAIT)
        expect(shown_id).to_have_text(parent["run_id"])

        page.evaluate("hash => { location.hash = hash }", f"app_name={app}-none")
        expect(detail).to_be_hidden(timeout=WAIT)
        expect(page.get_by_label("App")).to_have_value(f"{app}-none")
        expect(page.get_by_label("Status")).to_have_value("active")
        expect(page.locator("#no-runs")).to_be_visible(timeout=WAIT)
        expect(page.locator("#runs tbody tr")).to_have_count(0)
    finally:
        page.close()
        with owner.client(OPS) as client:
            client.post(f"/v1/runs/{parent['run_id']}/cancel", json={"wait": False})


def _id_left(page: Any, run: dict[str, Any]) -> float:
    box = _row(page, run).locator("button.id").bounding_box()
    assert box is not None
    return float(box["x"])


def test_trees_in_the_list_and_in_the_detail_with_each_runs_outcome(
    cluster: Cluster, browser: Any
) -> None:
    """The list puts a run's children under it, indented, foldable; the detail draws the
    whole tree from its root, each run with its outcome, the run shown marked."""
    owner, viewer = cluster.nodes
    app = f"forest-{uuid.uuid4().hex[:6]}"
    root = _start(owner, OPS, app, "u")
    first = _start(viewer, OPS, app, "u", parent=root["run_id"])
    second = _start(owner, OPS, app, "u", parent=root["run_id"])
    grandchild = _start(viewer, OPS, app, "u", parent=first["run_id"])
    lone = _start(owner, OPS, app, "u")
    page = _page(browser, viewer, OPS, f"status=all&app_name={app}")
    try:
        _tree_in_the_list(page, owner, [lone, root, second, first, grandchild])
        _tree_in_the_detail(page, root, first, second, grandchild)
    finally:
        page.close()
        with owner.client(OPS) as client:
            for run in (root, lone):
                client.post(f"/v1/runs/{run['run_id']}/cancel", json={"wait": False})


def _tree_in_the_list(page: Any, owner: NodeProcess, order: list[dict[str, Any]]) -> None:
    """``order``: lone, root, second, first (root's children), grandchild (first's): the newest
    first, each run's children right under it, indented; a fold hides them."""
    from playwright.sync_api import expect

    lone, root, second, first, grandchild = order
    expect(page.locator("#runs tbody tr")).to_have_count(5, timeout=WAIT)
    assert _shown_runs(page) == [run["run_id"] for run in order]
    depths = page.eval_on_selector_all("#runs tbody tr", "rows => rows.map(r => r.dataset.depth)")
    assert depths == ["0", "0", "1", "1", "2"]
    assert _id_left(page, root) < _id_left(page, first) < _id_left(page, grandchild)
    assert _id_left(page, first) == _id_left(page, second)

    fold = _row(page, root).get_by_role("button", name=f"Hide the runs below {root['run_id']}")
    fold.click()
    expect(fold).to_have_attribute("aria-expanded", "false")
    for run in (first, second, grandchild):
        expect(_row(page, run)).to_be_hidden()
    expect(_row(page, lone)).to_be_visible()
    fold.click()
    expect(_row(page, grandchild)).to_be_visible()

    with owner.client(OPS) as client:
        client.post(f"/v1/runs/{second['run_id']}/cancel", json={"reason": "one branch"})
    expect(_row(page, second).locator(".status")).to_have_text("cancelled", timeout=WAIT)
    assert _shown_runs(page) == [run["run_id"] for run in order]  # it ended in its place
    _shot(page, "tree-list")


def _tree_in_the_detail(
    page: Any,
    root: dict[str, Any],
    first: dict[str, Any],
    second: dict[str, Any],
    grandchild: dict[str, Any],
) -> None:
    """From the grandchild's detail: the whole tree, each run's outcome, the run shown marked;
    from the root's, its cancel reaches every run below it."""
    from playwright.sync_api import expect

    tree = page.locator("#d-tree")
    name = f"Details of run {grandchild['run_id']}"
    _row(page, grandchild).get_by_role("button", name=name).click()
    expect(tree.locator("li")).to_have_count(4, timeout=WAIT)
    expect(tree.locator("li").first).to_have_attribute("data-run-id", root["run_id"])
    nested = f'li[data-run-id="{first["run_id"]}"] li[data-run-id="{grandchild["run_id"]}"]'
    expect(tree.locator(nested)).to_have_count(1)
    branch = tree.locator(f'li[data-run-id="{second["run_id"]}"]')
    expect(branch).to_have_attribute("data-status", "cancelled", timeout=WAIT)
    expect(branch.locator(".pill")).to_have_text("cancelled")
    expect(tree.locator(f'li[data-run-id="{first["run_id"]}"]')).to_have_attribute(
        "data-status", "running"
    )
    expect(tree.locator('[aria-current="true"]')).to_have_text(grandchild["run_id"])
    _shot(page, "tree-detail")

    tree.get_by_role("button", name=f"Details of run {root['run_id']}").click()
    expect(page.locator("#d-id")).to_have_text(root["run_id"], timeout=WAIT)
    page.locator("#d-cancel").click()
    page.locator("#confirm").get_by_role("button", name="Cancel the run").click()
    for run in (root, first, grandchild):
        expect(tree.locator(f'li[data-run-id="{run["run_id"]}"]')).to_have_attribute(
            "data-status", "cancelled", timeout=WAIT
        )
    expect(tree.locator('[aria-current="true"]')).to_have_text(root["run_id"])
    _shot(page, "tree-detail-cancelled")


# -- a draining node, a gone one (issue 29) -----------------------------------------------------


def test_a_draining_node_then_a_gone_one_are_said_and_turn_the_actions_off(
    cluster: Cluster, browser: Any, tmp_path: Path
) -> None:
    """The page of a node that drains says so in a banner (with when its runs are cancelled),
    shows it ``draining`` in the nodes, and turns every cancel off with the reason; once the
    node has left, the banner says it does not answer, and they stay off."""
    from playwright.sync_api import expect

    viewer = cluster.nodes[1]
    env = {k: v for k, v in viewer.env.items() if k.startswith("CANCEL_BUS_")}
    env["CANCEL_BUS_DRAIN_TIMEOUT"] = "30"  # a second signal ends it sooner
    drainer = NodeProcess(f"drainer-{uuid.uuid4().hex[:4]}", env, tmp_path).start().wait_ready()
    page = None
    try:
        run = _start(drainer, OPS, f"drain-{uuid.uuid4().hex[:6]}", "u")
        page = _page(browser, drainer, OPS, f"app_name={run['app_name']}")
        banner, bulk_why = page.locator("#banner"), page.locator("#bulk-why")
        cancel = _row(page, run).get_by_role("button", name=f"Cancel run {run['run_id']}")
        bulk = page.get_by_role("button", name="Cancel all matching…")
        expect(cancel).to_be_enabled(timeout=WAIT)
        expect(bulk).to_be_enabled()
        expect(banner).to_be_hidden()

        drainer.signal(signal.SIGTERM)
        expect(banner).to_contain_text(f"Node {drainer.name} is draining", timeout=WAIT)
        expect(banner).to_contain_text("the runs it still holds are cancelled at")
        node_row = page.locator(f'#nodes tr[data-node-id="{drainer.name}"]')
        expect(node_row).to_have_attribute("data-state", "draining")
        expect(page.locator("#status")).to_have_text("draining")
        expect(cancel).to_be_disabled()
        expect(cancel).to_have_attribute("title", re.compile("is draining"))
        expect(bulk).to_be_disabled()
        expect(bulk_why).to_contain_text("the node serving this page is draining")
        _shot(page, "node-draining")

        _row(page, run).get_by_role("button", name=f"Details of run {run['run_id']}").click()
        detail = page.locator("#detail")
        expect(detail.locator("#d-cancel")).to_be_disabled(timeout=WAIT)
        expect(detail.locator("#d-cancel-why")).to_contain_text("is draining")
        expect(detail.locator("#d-live")).to_contain_text("stopped streaming the run (it drains)")
        _shot(page, "node-draining-detail")
        page.keyboard.press("Escape")

        drainer.signal(signal.SIGTERM)  # the second: its runs are cancelled now; it leaves
        assert drainer.wait_exit(15) == 0
        expect(banner).to_contain_text(f"Node {drainer.name} does not answer", timeout=WAIT)
        expect(cancel).to_be_disabled()
        expect(cancel).to_have_attribute("title", re.compile("does not answer"))
        expect(bulk_why).to_contain_text("the node serving this page does not answer")
        _shot(page, "node-gone")
        with viewer.client(OPS) as client:
            final = client.get(f"/v1/runs/{run['run_id']}").json()
        assert final["status"] == "cancelled" and final["cancel_cause"] == "node_shutdown"
    finally:
        if page is not None:
            page.close()
        drainer.stop()


# -- themes and a narrow screen (issue 29) ------------------------------------------------------

DARK_BACKGROUND, LIGHT_BACKGROUND = "rgb(15, 17, 21)", "rgb(246, 247, 249)"


def test_the_theme_follows_the_system_and_the_toggle(cluster: Cluster, browser: Any) -> None:
    """Light for a system that prefers it, dark otherwise; the toggle switches and the choice
    is kept across a reload; switched back to the system's, nothing is kept."""
    from playwright.sync_api import expect

    node = cluster.nodes[0]
    app = f"light-{uuid.uuid4().hex[:6]}"
    parent = _start(node, OPS, app, "u")
    child = _start(node, OPS, app, "u", parent=parent["run_id"])
    page = _page(browser, node, OPS, f"app_name={app}", scheme="light")
    body, toggle = page.locator("body"), page.get_by_role("button", name="Light theme")
    try:
        expect(body).to_have_css("background-color", LIGHT_BACKGROUND)
        expect(toggle).to_have_attribute("aria-pressed", "true")
        expect(page.locator("#runs-section")).to_have_css("background-color", "rgb(255, 255, 255)")
        expect(_row(page, child)).to_be_visible(timeout=WAIT)
        _shot(page, "light")
        _row(page, child).get_by_role("button", name=f"Details of run {child['run_id']}").click()
        expect(page.locator("#d-live")).to_have_text("live", timeout=WAIT)
        expect(page.locator("#d-tree li")).to_have_count(2, timeout=WAIT)
        _shot(page, "light-detail")
        page.keyboard.press("Escape")
        toggle.click()
        expect(toggle).to_have_attribute("aria-pressed", "false")
        expect(body).to_have_css("background-color", DARK_BACKGROUND)
        page.reload()
        expect(page.locator("#status")).to_have_text("live", timeout=WAIT)  # the tab's token
        expect(toggle).to_have_attribute("aria-pressed", "false")
        expect(body).to_have_css("background-color", DARK_BACKGROUND)
        toggle.click()
        expect(body).to_have_css("background-color", LIGHT_BACKGROUND)
        assert page.evaluate("localStorage.getItem('cancel-bus-theme')") is None
    finally:
        page.close()
    page = _page(browser, node, OPS, scheme="dark")
    try:
        expect(page.locator("body")).to_have_css("background-color", DARK_BACKGROUND)
        toggle = page.get_by_role("button", name="Light theme")
        expect(toggle).to_have_attribute("aria-pressed", "false")
        toggle.click()
        expect(page.locator("body")).to_have_css("background-color", LIGHT_BACKGROUND)
        assert page.evaluate("localStorage.getItem('cancel-bus-theme')") == "light"
    finally:
        page.close()
        with node.client(OPS) as client:
            client.post(f"/v1/runs/{parent['run_id']}/cancel", json={"wait": False})


# Each element the selector finds, shown whole: not cut by its own box (an ellipsis) nor by an
# ancestor that clips or scrolls, nor by the window. The elements that are not: their text.
CUT_OFF = """selector => [...document.querySelectorAll(selector)].filter((e) => {
  const r = e.getBoundingClientRect();
  if (!r.width) return false;
  if (e.clientWidth && e.scrollWidth > e.clientWidth + 1) return true;
  if (r.left < -1 || r.right > innerWidth + 1) return true;
  for (let a = e.parentElement; a; a = a.parentElement) {
    const style = getComputedStyle(a);
    if (style.overflowX === "visible") continue;
    const box = a.getBoundingClientRect();
    if (r.left < box.left - 1 || r.right > box.right + 1) return true;
    if (a.scrollWidth > a.clientWidth + 1) return true;
  }
  return false;
}).map((e) => e.textContent.slice(0, 60))"""


def test_at_420_px_ids_and_the_timeline_are_shown_whole(cluster: Cluster, browser: Any) -> None:
    from playwright.sync_api import expect

    owner, viewer = cluster.nodes
    app = f"narrow-{uuid.uuid4().hex[:6]}"
    parent = _start(owner, OPS, app, "u")
    child = _start(viewer, OPS, app, "u", parent=parent["run_id"])
    reason = "a reason long enough that the timeline's data column has to wrap it " * 2
    with owner.client(OPS) as client:
        answer = client.post(f"/v1/runs/{parent['run_id']}/cancel", json={"reason": reason})
    assert answer.json()["outcome"] == "cancelled"
    page = _page(browser, viewer, OPS, f"status=all&app_name={app}", width=420)
    try:
        expect(page.locator("#runs tbody tr")).to_have_count(2, timeout=WAIT)
        expect(_row(page, child).locator(".status")).to_have_text("cancelled", timeout=WAIT)
        assert page.evaluate(CUT_OFF, "#runs tbody .id, #runs tbody .status") == []
        assert page.evaluate("document.documentElement.scrollWidth") <= 420
        _shot(page, "narrow-tree")

        _row(page, parent).get_by_role("button", name=f"Details of run {parent['run_id']}").click()
        detail = page.locator("#detail")
        expect(detail.locator("#d-events")).to_contain_text(reason.strip(), timeout=WAIT)
        expect(detail.locator("#d-tree li")).to_have_count(2, timeout=WAIT)
        whole = "#d-id, #d-fields dd, #d-events td, #d-tree .id, #d-phases li, #d-output"
        assert page.evaluate(CUT_OFF, whole) == []
        rows = detail.locator("#d-events tbody tr")
        assert rows.count() >= 4  # started, cancel requested, delivered, ..., finished
        _shot(page, "narrow-detail")
        rows.last.scroll_into_view_if_needed()
        _shot(page, "narrow-timeline")
    finally:
        page.close()

"""The dashboard at /ui in a real browser, against a real proxy process that has run real
turns through the fake provider."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from playwright.sync_api import expect

from tests.conftest import ProxyProcess, StartProxyProcess, proxy_env
from tests.fakeprovider import FakeProvider, Reply
from tests.helpers import SESSION_HEADER
from tests.ui.conftest import VIEWPORTS, Tab

MODEL = "gpt-4o-mini"  # priced by genai-prices, so the ledger has costs and baselines
HOSTILE = '<img src=x onerror="window.__pwned=1">'


def envelope(patch: dict, action: str) -> str:
    return f"Working on it.\n```json\n{json.dumps({'state_patch': patch, 'action': action})}\n```"


def turn(client: openai.OpenAI, session: str, history: list[dict], observation: str) -> None:
    history.append({"role": "user", "content": observation})
    r = client.chat.completions.create(
        model=MODEL, messages=history, extra_headers={SESSION_HEADER: session}
    )
    history.append({"role": "assistant", "content": r.choices[0].message.content or ""})


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """A proxy with: session build-42 (7 transitions: valid, an invalid answer re-asked,
    one with hostile text), support-7, and 26 more sessions so the list has two pages."""
    tmp = tmp_path_factory.mktemp("ui-proxy")
    fake = FakeProvider().start()
    argv = ["--port", "0", "--data-dir", str(tmp / "data"), "--upstream", fake.url + "/v1"]
    argv += ["--schema", "goal,files,tests,notes,step"]
    proxy = ProxyProcess(argv, proxy_env(SKILLSTATE_API_KEY="sk-upstream"), tmp)
    try:
        client = openai.OpenAI(base_url=proxy.v1, api_key="k", max_retries=0)
        usage = {"prompt_tokens": 1200, "completion_tokens": 80}
        history: list[dict] = [{"role": "system", "content": "You are a coding agent."}]
        script = [
            ({"goal": "fix the login bug", "step": 1}, "read the issue"),
            ({"files": ["src/auth.py"], "step": 2}, "open src/auth.py"),
            ({"tests": {"failing": ["test_login_expired"]}, "step": 3}, "run the tests"),
            ({"notes": f"token expiry compared in local time {HOSTILE}", "step": 4}, HOSTILE),
        ]
        for patch, action in script:
            fake.enqueue(Reply(text=envelope(patch, action), usage=usage))
            turn(client, "build-42", history, f"observation for {action}: " + "log line " * 300)
        # An answer with an unknown key is re-asked once, then accepted.
        fake.enqueue(
            Reply(text=envelope({"secret": 1}, "bad"), usage=usage),
            Reply(text=envelope({"tests": {"failing": []}, "step": 5}, "rerun"), usage=usage),
        )
        turn(client, "build-42", history, "patched")
        fake.enqueue(Reply(text=envelope({"files": None, "step": 6}, "open a PR"), usage=usage))
        turn(client, "build-42", history, "tests pass")
        fake.enqueue(Reply(text=envelope({"goal": "refund ticket"}, "triage"), usage=usage))
        turn(client, "support-7", [], "Customer asks for a refund")
        for i in range(26):
            fake.enqueue(Reply(text=envelope({"step": i}, "batch"), usage=usage))
            turn(client, f"batch-{i:02d}", [], "go")
        yield proxy
    finally:
        proxy.stop()
        fake.stop()


@pytest.fixture
def tab(open_tab: Callable[[str], Tab]) -> Callable[[str], Tab]:
    return open_tab


def check_clean(t: Tab, name: str) -> None:
    t.shot(name)
    assert t.overflow() == 0, f"{name}: horizontal overflow of {t.overflow()} px"
    assert t.errors == [], f"{name}: console errors {t.errors}"
    assert t.page.evaluate("() => window.__pwned === undefined"), "hostile text was run as HTML"


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
def test_overview(proxy: ProxyProcess, tab: Callable[[str], Tab], viewport: str) -> None:
    t = tab(viewport)
    t.page.goto(proxy.url + "/ui")  # the redirect to /ui/ is part of the check
    assert t.page.url == proxy.url + "/ui/"
    expect(t.page.locator("table td.strong", has_text="default")).to_be_visible()
    expect(t.page.locator(".badge", has_text="closed")).to_be_visible()
    # 34 turns ran in the last hour: 33 requests plus the re-asked one is 1 rollback-retry.
    stat = t.page.locator(".stat", has_text="Requests, last hour").locator(".stat-value")
    expect(stat).to_have_text("33")
    reasks = t.page.locator(".stat", has_text="Failed attempts").locator(".stat-note")
    expect(reasks).to_have_text("1 re-ask")
    # The chart is drawn on the animation frame after its box is laid out (ResizeObserver),
    # after the stats above: wait for it as a user would (count() alone raced it).
    expect(t.page.locator("svg.chart rect.bar")).to_have_count(36)
    check_clean(t, f"overview-{viewport}")


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
def test_sessions_search_and_pages(
    proxy: ProxyProcess, tab: Callable[[str], Tab], viewport: str
) -> None:
    t = tab(viewport)
    t.page.goto(proxy.url + "/ui/#/sessions")
    rows = t.page.locator("table.sessions tbody tr")
    expect(rows).to_have_count(25)
    check_clean(t, f"sessions-{viewport}")
    t.page.get_by_role("button", name="Older →").click()
    expect(rows).to_have_count(3)
    t.page.get_by_role("button", name="← Newer").click()
    t.page.get_by_label("Search sessions").fill("build")
    expect(rows).to_have_count(1)
    t.page.get_by_role("link", name="build-42").click()
    expect(t.page.locator("h1.session-id")).to_have_text("build-42")
    assert t.errors == []


def tree_text(t: Tab) -> str:
    return t.page.locator("[data-testid=state-tree]").inner_text()


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
def test_session_tree_timeline_and_history(
    proxy: ProxyProcess, tab: Callable[[str], Tab], viewport: str
) -> None:
    t = tab(viewport)
    t.page.goto(proxy.url + "/ui/#/session/build-42")
    state = proxy.state("build-42")["state"]
    assert state["step"] == 6 and "files" not in state
    tree = tree_text(t)
    for value in ('goal: "fix the login bug"', "failing: []", "step: 6"):
        assert value in tree
    assert json.dumps(HOSTILE)[1:-1] in tree  # shown as text, never parsed as HTML
    items = t.page.locator("li.t-item")
    expect(items).to_have_count(6)
    # Newest first. Step 6 deleted `files` and set step 5 -> 6.
    newest = items.nth(0)
    expect(newest.locator(".badge")).to_have_text("valid")
    expect(newest.locator(".t-action")).to_have_text("open a PR")
    expect(newest.locator("tr.d-removed .d-path")).to_have_text("files")
    expect(newest.locator("tr.d-removed del")).to_have_text('["src/auth.py"]')
    step_row = newest.locator("tr.d-changed", has_text="step")
    expect(step_row.locator("del")).to_have_text("5")
    expect(step_row.locator("ins")).to_have_text("6")
    expect(newest.locator(".t-cost")).to_contain_text("$")
    # Step 5 needed a re-ask: its cost window holds the retry.
    expect(items.nth(1).locator(".t-cost .badge")).to_have_text("1 retry")
    expect(items.nth(2).locator(".t-action")).to_have_text(HOSTILE)
    check_clean(t, f"session-{viewport}")

    # Step back: after step 2 the state had files but no tests yet.
    t.page.get_by_role("button", name="Previous step").click()
    for _ in range(3):
        t.page.get_by_role("button", name="Previous step").click()
    expect(t.page.locator(".state-card h2")).to_have_text("State after step 2")
    tree = tree_text(t)
    assert "src/auth.py" in tree and "test_login_expired" not in tree
    assert "notes: (initial)" in tree  # set later; before that, whatever initial_state held
    t.shot(f"session-history-{viewport}")
    assert t.errors == []


def test_operator_patch_form(proxy: ProxyProcess, tab: Callable[[str], Tab]) -> None:
    t = tab("desktop")
    t.page.goto(proxy.url + "/ui/#/session/support-7")
    area = t.page.get_by_label("State patch (JSON merge patch)")
    apply = t.page.get_by_role("button", name="Apply patch")
    msg = t.page.locator(".form-msg")

    area.fill("{not json")
    apply.click()
    expect(msg).to_contain_text("Not valid JSON")
    expect(area).to_have_attribute("aria-invalid", "true")

    area.fill('{"refund_reason": "x"}')  # not in the schema: the proxy refuses it
    apply.click()
    expect(msg).to_contain_text("refund_reason")
    assert proxy.state("support-7")["step"] == 1
    t.shot("session-patch-error-desktop")
    # The refused PATCH is the only failed request, and Chromium logs it: expected here.
    assert len(t.errors) == 1 and "400" in t.errors[0], t.errors
    t.errors.clear()

    area.fill('{"notes": "refund approved by <b>ops</b>"}')
    apply.click()
    expect(msg).to_have_text(re.compile(r"Committed as step 2"))
    got = proxy.state("support-7")
    assert got["step"] == 2 and got["state"]["notes"] == "refund approved by <b>ops</b>"
    newest = t.page.locator("li.t-item").nth(0)
    expect(newest.locator(".badge")).to_have_text("operator")
    # What `notes` held before is the session's initial value: not in the recorded history.
    notes = newest.locator("tr", has_text="notes")
    expect(notes.locator(".d-before")).to_have_text("(initial)")
    expect(notes.locator("ins")).to_have_text('"refund approved by <b>ops</b>"')
    check_clean(t, "session-patched-desktop")


def test_reset_asks_first(proxy: ProxyProcess, tab: Callable[[str], Tab]) -> None:
    t = tab("mobile")
    t.page.goto(proxy.url + "/ui/#/session/batch-00")
    t.page.get_by_role("button", name="Reset…").click()
    dialog = t.page.locator("dialog.confirm")
    expect(dialog).to_be_visible()
    t.shot("session-reset-confirm-mobile")
    dialog.get_by_role("button", name="Cancel").click()
    assert proxy.get("/state", params={"session": "batch-00"}).status_code == 200
    t.page.get_by_role("button", name="Reset…").click()
    t.page.locator("dialog.confirm").get_by_role("button", name="Reset session").click()
    expect(t.page).to_have_url(re.compile(r"#/sessions$"))
    assert proxy.get("/state", params={"session": "batch-00"}).status_code == 404
    assert t.errors == []


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
def test_cost(proxy: ProxyProcess, tab: Callable[[str], Tab], viewport: str) -> None:
    t = tab(viewport)
    t.page.goto(proxy.url + "/ui/#/cost")
    expect(t.page.locator("table td.strong", has_text=MODEL)).to_be_visible()
    totals = httpx.get(proxy.url + "/cost", params={"since": "7d"}).json()["totals"]
    requests = t.page.locator(".stat", has_text="Requests").locator(".stat-value")
    expect(requests).to_have_text(str(totals["requests"]))
    # one day: baseline and actual (drawn on the frame after layout: waited for)
    expect(t.page.locator("svg.chart rect.bar")).to_have_count(2)
    t.page.get_by_role("button", name="Upstream").click()
    expect(t.page.locator("table td.strong", has_text="default")).to_be_visible()
    t.page.get_by_role("button", name="Day", exact=True).click()
    expect(t.page.locator("table td.strong").first).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d$"))
    check_clean(t, f"cost-{viewport}")


def make_key(data: Path, *args: str) -> str:
    """`skillstate keys create ...` on the data dir ``data``, in a process of its own (the
    browser's event loop runs in this one); the new key."""
    argv = [sys.executable, "-m", "skillstate", "keys", "--data-dir", str(data)]
    done = subprocess.run([*argv, "create", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_an_admin_opens_each_keys_sessions_and_those_made_before_the_first_key(
    fake: FakeProvider,
    start_proxy_process: StartProxyProcess,
    tmp_path: Path,
    tab: Callable[[str], Tab],
) -> None:
    proxy = start_proxy_process(fake.url + "/v1", "--schema", "goal", config={"auth_cache_ttl": 0})
    fake.enqueue(Reply(text=envelope({"goal": "before keys"}, "go")))
    turn(openai.OpenAI(base_url=proxy.v1, api_key="k", max_retries=0), "early", [], "start")
    alice = make_key(tmp_path / "data", "--name", "alice")
    root = make_key(tmp_path / "data", "--name", "root", "--admin")
    fake.enqueue(Reply(text=envelope({"goal": "alice's"}, "go")))
    turn(openai.OpenAI(base_url=proxy.v1, api_key=alice, max_retries=0), "mine", [], "start")
    t = tab("desktop")
    t.page.goto(proxy.url + "/ui/#/sessions")
    t.page.get_by_label("Admin key").fill(root)
    t.page.get_by_role("button", name="Use key").click()
    rows = t.page.locator("table.sessions tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.filter(has_text="early")).to_contain_text("(none)")
    expect(rows.filter(has_text="mine")).to_contain_text("alice")
    # The 401 before the key was given is logged by Chromium: expected here.
    assert len(t.errors) == 1 and "401" in t.errors[0], t.errors
    t.errors.clear()
    for session, goal in (("mine", "alice's"), ("early", "before keys")):
        t.page.goto(proxy.url + "/ui/#/sessions")
        t.page.get_by_role("link", name=session, exact=True).click()
        expect(t.page.locator("h1.session-id")).to_have_text(session)
        expect(t.page.locator("[data-testid=state-tree]")).to_contain_text(f'goal: "{goal}"')
    # Reset deletes the session the page shows, the one made before any key.
    t.page.get_by_role("button", name="Reset…").click()
    t.page.locator("dialog.confirm").get_by_role("button", name="Reset session").click()
    expect(t.page).to_have_url(re.compile(r"#/sessions$"))
    expect(rows).to_have_count(1)
    admin = {"authorization": f"Bearer {root}"}
    gone = proxy.get("/state", params={"session": "early", "key": "(none)"}, headers=admin)
    assert gone.status_code == 404
    assert t.errors == []

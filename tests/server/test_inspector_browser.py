"""The inspector in a real headless Chromium (Debian's ``chromium``, driven by Playwright): sign in with a key,
load every page and check what it shows. ``AGENTMEM_UPDATE_SCREENSHOTS=1`` also writes docs/inspector-*.png."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import httpx
import openai
import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DOCS = Path(__file__).resolve().parents[2] / "docs"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed (.ci/run installs it)")
        pytest.skip("chromium is not installed")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(tmp_path_factory.mktemp("chromium-profile")),
                                                   executable_path=CHROMIUM, headless=True, args=FLAGS,
                                                   viewport={"width": 1280, "height": 900})
        yield ctx
        ctx.close()


@pytest.fixture(scope="module")
def activity(server):
    """Entries with tags and TTLs, and chat requests in a session, so every page has something to show."""
    with server.client(server.key_u1) as c:
        c.post("/v1/memories", json={"text": "I moved to Lyon last May.", "user_id": "u1", "tags": ["profile"],
                                     "ttl": 7200})
        c.post("/v1/memories", json={"text": "My sister is called Inès.", "user_id": "u1", "tags": ["family"]})
        c.post("/v1/memories", json={"text": "The project deadline is Friday.", "user_id": "u3"})
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.key_u1, max_retries=0, timeout=120)
    # questions their memories answer (scores over the 0.3 mount threshold), so requests have mounts to show
    for q in ("Which city did I move to last May?", "What is my sister called?"):
        client.chat.completions.create(model="x", user="u1", max_tokens=6, extra_headers={"X-AgentMem-Session":
                                                                                         "insp-s1"},
                                       messages=[{"role": "user", "content": q}])
    client.chat.completions.create(model="x", user="u1", max_tokens=6,
                                   messages=[{"role": "user",
                                              "content": "What is my sister called? Tell me about my family."}])
    deadline = time.time() + 90  # the fidelity monitor (share 1.0 here) scores in the background
    while time.time() < deadline:
        m = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {server.key_u1}"}, timeout=120)
        if "agentmem_fidelity_kl_count 0.0" not in m.text:
            break
        time.sleep(0.5)


def _shot(page, name: str, tmp_path: Path) -> None:
    page.screenshot(path=str(tmp_path / f"inspector-{name}.png"), full_page=True)
    if os.environ.get("AGENTMEM_UPDATE_SCREENSHOTS") == "1":
        page.screenshot(path=str(DOCS / f"inspector-{name}.png"), full_page=True)


def test_inspector_pages_in_chromium(server, browser, activity, tmp_path):
    page = browser.new_page()
    page.goto(f"{server.url}/inspector")
    assert page.url.endswith("/inspector/login")  # no key yet
    page.fill("#key", "am_bad_key")
    page.click("#sign-in")
    assert "unknown or revoked key" in page.inner_text("#login-error")
    _shot(page, "login", tmp_path)
    page.fill("#key", server.key_u1)
    page.click("#sign-in")
    page.wait_for_url(f"{server.url}/inspector")

    users = page.inner_text("#users")
    assert "u1" in users and "u3" in users and "u2" not in users  # the key's tenants only
    assert "insp-s1" in users and "hot" in users
    assert page.locator(".request-row").count() >= 3
    # every recent request lists what it mounted as "id @position +tokens (score)", session turns included
    session_mounts = 0
    for row in page.locator(".request-row").all():
        cells = row.locator("td").all_inner_texts()
        mounts = re.findall(r"@(\d+) \+(\d+) \(([0-9.e+-]+)\)", cells[6])
        assert mounts or cells[6].strip() == "none", cells
        assert all(int(pos) > 0 and int(tokens) > 0 for pos, tokens, _ in mounts), cells
        session_mounts += len(mounts) if cells[2] == "insp-s1" else 0
    assert session_mounts >= 1
    assert page.inner_text("#kv-hit-rate").endswith("%")
    assert page.locator("#fidelity-line").count() == 1  # drawn by the page's script
    assert "latest KL" in page.inner_text("#fidelity-summary")
    _shot(page, "overview", tmp_path)

    page.locator(".request-row a").first.click()
    page.wait_for_selector("#mounted")
    assert page.locator(".mounted-row").count() >= 1
    assert "family" in page.inner_text("#request").lower() or page.locator(".recalled-row").count() >= 1
    cells = page.locator(".mounted-row").first.locator("td").all_inner_texts()
    assert int(cells[3]) > 0 and int(cells[4]) > 0  # tokens and position of a mounted memory
    assert "KL" in page.inner_text("#request-fidelity")
    _shot(page, "request", tmp_path)

    page.goto(f"{server.url}/inspector")  # a session turn's page: positions after the preamble, back to back
    page.locator(".request-row", has_text="insp-s1").first.locator("a").click()
    page.wait_for_selector("#mounted")
    rows = [r.locator("td").all_inner_texts() for r in page.locator(".mounted-row").all()]
    spans = [(int(c[4]), int(c[3])) for c in rows]  # (position, tokens)
    assert spans and all(p > 0 and n > 0 for p, n in spans)
    assert all(a + n == b for (a, n), (b, _) in zip(spans, spans[1:]))
    _shot(page, "request-session", tmp_path)

    page.goto(f"{server.url}/inspector/users/u1")
    rows = page.locator(".entry-row")
    assert rows.count() >= 2 and "Lyon" in page.inner_text("#entries") and "profile" in page.inner_text("#entries")
    assert "h left" in page.inner_text("#entries")  # the TTL
    page.fill("#entry-filter", "lyon")
    visible = [r for r in rows.all() if r.is_visible()]
    assert visible and all("Lyon" in r.inner_text() for r in visible)
    page.fill("#entry-filter", "")
    assert "insp-s1" in page.inner_text("#sessions")
    _shot(page, "user", tmp_path)

    response = page.goto(f"{server.url}/inspector/users/u2")
    assert response.status == 403
    page.close()


def _sign_in(page, server) -> None:
    page.goto(f"{server.url}/inspector/login")
    page.fill("#key", server.key_u1)
    page.click("#sign-in")
    page.wait_for_url(f"{server.url}/inspector")


def _row(page, entry_id: str):
    return page.locator(f'.entry-row[data-id="{entry_id}"]')


def test_inspector_search_edit_forget_in_chromium(server, browser, activity, tmp_path):
    with server.client(server.key_u1) as c:
        locker = c.post("/v1/memories", json={"text": "My gym locker number is 5521.", "user_id": "u1"}).json()
        other = c.post("/v1/memories", json={"text": "I water the basil on Sundays.", "user_id": "u1"}).json()
    browser.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)
    page = browser.new_page()
    _sign_in(page, server)

    page.goto(f"{server.url}/inspector/users/u1")
    row = _row(page, locker["id"])
    assert row.locator("code.entry-id").inner_text() == locker["id"]  # the full id, not a prefix
    row.locator("button.copy").click()
    page.wait_for_function("id => document.querySelector(`.entry-row[data-id='${id}'] button.copy`)"
                           ".textContent === 'copied'", arg=locker["id"])
    assert page.evaluate("navigator.clipboard.readText()") == locker["id"]

    page.fill("#search-q", "which locker is mine at the gym?")
    page.click("#search-go")
    page.wait_for_selector(".entry-row .score")
    first = page.locator(".entry-row").first
    assert first.get_attribute("data-id") == locker["id"]  # the user's recall, best first, with its score
    assert 0.0 <= float(first.locator(".score").inner_text()) <= 1.0

    page.goto(f"{server.url}/inspector/users/u1")
    row = _row(page, locker["id"])
    row.locator("details.edit summary").click()
    row.locator("textarea").fill("My gym locker number is 6612.")
    _shot(page, "user-edit", tmp_path)
    row.locator("button.save").click()
    page.wait_for_selector("#done")
    assert "saved a new version" in page.inner_text("#done")
    assert "6612" in _row(page, locker["id"]).inner_text() and "5521" not in page.inner_text("#entries")
    with server.client(server.key_u1) as c:
        history = c.get(f"/v1/memories/{locker['id']}/history").json()["versions"]
    assert [(v["op"], v["text"]) for v in history] == [("add", "My gym locker number is 5521."),
                                                       ("update", "My gym locker number is 6612.")]

    page.once("dialog", lambda dialog: dialog.dismiss())  # "cancel" in the confirmation keeps the entry
    _row(page, other["id"]).locator("button.forget").click()
    assert _row(page, other["id"]).count() == 1
    page.once("dialog", lambda dialog: dialog.accept())
    _row(page, other["id"]).locator("button.forget").click()
    page.wait_for_selector("#done")
    assert f"forgot {other['id']}" in page.inner_text("#done") and _row(page, other["id"]).count() == 0
    with server.client(server.key_u1) as c:
        assert c.get(f"/v1/memories/{other['id']}").status_code == 404
    page.close()


def test_inspector_forms_refuse_cross_site_and_other_tenants(server, browser, activity):
    with server.client(server.key_u1) as c:
        mine = c.post("/v1/memories", json={"text": "My bike is blue.", "user_id": "u1"}).json()
    with server.client(server.key_u2) as c:
        theirs = c.post("/v1/memories", json={"text": "u2's bike is red.", "user_id": "u2"}).json()
    page = browser.new_page()
    _sign_in(page, server)
    page.goto(f"{server.url}/inspector/users/u1")
    token = _row(page, mine["id"]).locator("input[name=csrf]").first.get_attribute("value")
    cookies = {c["name"]: c["value"] for c in browser.cookies(f"{server.url}/inspector/users/u1")}
    assert {"agentmem_key", "agentmem_csrf"} <= set(cookies)  # signed in, with a CSRF session
    url = f"{server.url}/inspector/users/u1/entries/{mine['id']}/update"
    with httpx.Client(timeout=120) as http:
        # a forged form (another site's page) has the signed-in cookie but not the token, or a wrong one
        for forged in ({"text": "hijacked"}, {"text": "hijacked", "csrf": "0" * 64}):
            assert http.post(url, data=forged, cookies=cookies).status_code == 403
        # the token is bound to this browser's session cookie: another session's cookie does not carry it
        other_session = {**cookies, "agentmem_csrf": "someone-else"}
        assert http.post(url, data={"text": "hijacked", "csrf": token}, cookies=other_session).status_code == 403
        # another tenant's entry, through u1's path or u2's, is not reachable with u1's key
        for user, entry in (("u1", theirs["id"]), ("u2", theirs["id"])):
            r = http.post(f"{server.url}/inspector/users/{user}/entries/{entry}/forget", data={"csrf": token},
                          cookies=cookies)
            assert r.status_code in (403, 404), (user, r.status_code)
        ok = http.post(url, data={"text": "My bike is green.", "csrf": token}, cookies=cookies)
        assert ok.status_code == 303  # the real form's token works
    with server.client(server.key_u1) as c:
        assert c.get(f"/v1/memories/{mine['id']}").json()["text"] == "My bike is green."
    with server.client(server.key_u2) as c:
        assert c.get(f"/v1/memories/{theirs['id']}").json()["text"] == "u2's bike is red."
    page.close()


def test_request_page_shows_full_ids_scores_threshold_and_why_dropped(server, browser, activity, tmp_path):
    page = browser.new_page()
    _sign_in(page, server)
    page.locator(".request-row a").first.click()
    page.wait_for_selector("#mounted")
    assert "mount threshold in force" in page.inner_text("#threshold")
    for row in page.locator(".mounted-row, .dropped-row, .recalled-row").all():
        entry_id = row.locator("code.entry-id").inner_text()
        assert re.fullmatch(r"[0-9a-f-]{36}", entry_id), entry_id  # full uuid, copyable
    mounted = page.locator(".mounted-row").first.locator(".score").inner_text()
    assert 0.0 <= float(mounted.split()[0]) <= 1.0
    for reason in page.locator(".dropped-row .reason").all_inner_texts():
        assert reason.strip()  # every dropped memory says why
    page.close()

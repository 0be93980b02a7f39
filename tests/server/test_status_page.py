"""The status page: its files and ``GET /v1/status`` (fast), and the page itself in a headless
Chromium against a running server with two users' work in flight (marker ``browser``).

The browser test needs Debian's ``chromium`` and ``chromium-driver`` (``apt-get install -y
chromium chromium-driver``) and selenium (the ``[test]`` extra); it is skipped, saying which is
missing, without them. Its screenshot goes to ``$RMSERVE_TEST_ARTIFACTS`` when set, else to the
test's tmp folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import threading
import urllib.request
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from testkit.auth_stub import user_header_middleware
from testkit.fakes import FAKE_MODEL, FakeEngine, FakeRenderer, ReloadableFakeEngine, write_fake_checkpoint
from testkit.servers import ThreadedServer
from rmserve.server.app import STATE_KEY, ServerConfig, create_app
from rmserve.server.users import User

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture
def make_client(aiohttp_client):
    async def make(engine: FakeEngine, **config):
        app = create_app(ServerConfig(port=0, **config), engine, FakeRenderer())
        client = await aiohttp_client(app)
        await app[STATE_KEY].settled.wait()
        return client

    return make


async def test_page_and_its_files_are_served(make_client):
    client = await make_client(FakeEngine())
    async with client.get("/") as resp:
        assert resp.status == 200
        assert resp.content_type == "text/html"
        html = await resp.text()
    assert '<body data-refresh-s="3">' in html
    assert '<script src="/static/status.js"></script>' in html
    for name, kind in (("status.js", "text/javascript"), ("status.css", "text/css")):
        async with client.get(f"/static/{name}") as resp:
            assert (resp.status, resp.content_type) == (200, kind)
            assert len(await resp.read()) > 100
    async with client.get("/static/index.html") as resp:  # only the listed files
        assert resp.status == 404
    async with client.get("/static/..%2Fstatus_page.py") as resp:
        assert resp.status == 404


async def test_page_files_ship_in_the_package():
    from importlib import resources

    static = resources.files("rmserve.server").joinpath("static")
    assert {p.name for p in static.iterdir()} >= {"index.html", "status.js", "status.css"}
    text = Path(__file__).parents[2].joinpath("pyproject.toml").read_text()
    assert '"rmserve.server" = ["static/*.html", "static/*.js", "static/*.css"]' in text


async def test_status_reports_prefix_cache_counters_from_the_metrics(make_client):
    # Prompt "hi" = 5 tokens, answers "yo" / "ya" = 4 each: 9 + 9 = 18 tokens; "ya" shares 7
    # tokens with "yo", 4 of them in whole blocks of 4 → 4 hit tokens (engine and replies).
    engine = FakeEngine()
    client = await make_client(engine)
    async with client.post("/v1/score", json={"groups": [{"id": "g", "prompt": "hi", "responses": ["yo", "ya"]}]}) as r:
        assert r.status == 200
    async with client.get("/v1/status") as resp:
        assert resp.status == 200
        body = orjson.loads(await resp.read())
    assert (body["status"], body["fair_share"], body["groups_scored"]) == ("ready", True, 1)
    # no load yet: nobody holds a lease; the request was not pinned, and is answered anyway
    assert body["leases"] == [{"model": "fake-rm", "fingerprint": FAKE_MODEL.fingerprint, "holder": None,
                               "since": None, "expires_in_s": None, "pinned": []}]
    assert body["engine_prefix_cache"] == {"query_tokens": 18, "hit_tokens": 4, "hit_rate": 4 / 18}
    assert body["served_prefix_cache"] == {"query_tokens": 18, "hit_tokens": 4, "hit_rate": 4 / 18}
    assert body["uptime_s"] >= 0


async def test_status_before_any_scoring_has_no_hit_rate(make_client):
    client = await make_client(FakeEngine())
    async with client.get("/v1/status") as resp:
        body = orjson.loads(await resp.read())
    assert body["engine_prefix_cache"] == {"query_tokens": 0, "hit_tokens": 0, "hit_rate": None}
    assert body["served_prefix_cache"]["hit_rate"] is None


# --- the page in a real browser ----------------------------------------------------------------

USERS = {"alice": User("alice"), "bob": User("bob", weight=2.0)}


user_from_test_header = user_header_middleware(USERS)


def _post(url: str, user: str, n_groups: int, first: int, out: list[int]) -> None:
    groups = [{"id": f"{user}{i}", "prompt": "hi", "responses": ["ya", "yb"]} for i in range(first, first + n_groups)]
    body = {"groups": groups, "fingerprint": FAKE_MODEL.fingerprint}  # pinned, as the client sends it
    request = urllib.request.Request(
        f"{url}/v1/score", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-Test-User": user}, method="POST",
    )
    with urllib.request.urlopen(request, timeout=120) as resp:
        out.append(resp.status)


def _browser_missing() -> str | None:
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            return f"{path} not found: apt-get install -y chromium chromium-driver (Debian package {package})"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install '.[test]')"
    return None


def _artifacts(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("RMSERVE_TEST_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _require_browser() -> None:
    """Skip when Chromium, its driver or selenium is missing; fail instead under
    ``RMSERVE_REQUIRE_BROWSER=1`` (CI installs them: a skip there would hide the test)."""
    missing = _browser_missing()
    if missing:
        if os.environ.get("RMSERVE_REQUIRE_BROWSER") == "1":
            pytest.fail(missing)
        pytest.skip(missing)


@contextlib.contextmanager
def _chromium(tmp_path: Path, name: str):
    """A headless Chromium driver (1400×1000); on a failure inside, the screenshot and page
    source go to the artifacts folder as ``NAME_failure.png`` / ``.html``; always quit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    except BaseException:
        folder = _artifacts(tmp_path)
        driver.save_screenshot(str(folder / f"{name}_failure.png"))
        (folder / f"{name}_failure.html").write_text(driver.page_source)
        raise
    finally:
        driver.quit()


@pytest.mark.browser
def test_status_page_in_chromium_shows_two_users_work_in_flight(tmp_path):
    _require_browser()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    engine = FakeEngine(score_gate=asyncio.Event())

    def make_app() -> web.Application:
        app = create_app(ServerConfig(port=0, engine_concurrency_groups=1), engine, FakeRenderer())
        app.middlewares.append(user_from_test_header)
        return app

    statuses: list[int] = []
    with ThreadedServer(make_app) as server:
        url = server.url
        # alice: 3 groups, one reaches the (stalled) engine, 2 wait; bob: 2 groups, both wait.
        # A group: prompt "hi" (5 tokens) + answers "ya"/"yb" (4 each) → 2 × 9 = 18 tokens.
        posts = [threading.Thread(target=_post, args=(url, "alice", 3, 0, statuses))]
        posts.append(threading.Thread(target=_post, args=(url, "bob", 2, 0, statuses)))
        posts[0].start()
        try:
            with _chromium(tmp_path, "status_page") as driver:
                WebDriverWait(driver, 30).until(lambda d: engine.calls)  # alice's first group is at the engine
                posts[1].start()
                driver.get(url + "/")
                first = WebDriverWait(driver, 30).until(
                    lambda d: int(d.find_element(By.TAG_NAME, "body").get_attribute("data-refreshes") or 0)
                )

                def queued(user: str) -> str:
                    return driver.find_element(By.CSS_SELECTOR, f'#queue tr[data-user="{user}"] td.queued-groups').text

                def both_shown(d) -> bool:  # after a later refresh, with bob's groups queued
                    refreshes = int(d.find_element(By.TAG_NAME, "body").get_attribute("data-refreshes") or 0)
                    rows = d.find_elements(By.CSS_SELECTOR, "#queue tbody tr")
                    return refreshes > first and len(rows) == 3 and queued("bob") == "2"

                WebDriverWait(driver, 30).until(both_shown)
                assert queued("alice") == "2"
                # the viewer (the anonymous admin of a server without users) is listed with zeros
                users = [row.get_attribute("data-user") for row in driver.find_elements(By.CSS_SELECTOR, "#queue tbody tr")]
                assert users == ["alice", "anonymous", "bob"]
                assert queued("anonymous") == "0"
                assert driver.find_element(By.CSS_SELECTOR, '#queue tr[data-user="bob"] td.queued-tokens').text == "36"
                assert driver.find_element(
                    By.CSS_SELECTOR, '#queue tr[data-user="alice"] td.inflight-groups').text == "1"
                assert driver.find_element(By.CSS_SELECTOR, '#queue tr[data-user="bob"] td.weight').text == "2"
                model_row = driver.find_element(By.CSS_SELECTOR, f'#models tr[data-model="{FAKE_MODEL.name}"]')
                assert model_row.find_element(By.CSS_SELECTOR, "td.name").text == "fake-rm"
                assert model_row.find_element(By.CSS_SELECTOR, "td.fingerprint").text.startswith("fp-fake")
                assert model_row.find_element(By.CSS_SELECTOR, "td.swaps").text == "0"
                assert driver.find_element(By.ID, "engine-status").text == "ready"
                assert "1 of 1 engine slots busy, 4 groups queued" in driver.find_element(By.ID, "queue-summary").text
                lease_row = driver.find_element(By.CSS_SELECTOR, f'#leases tr[data-model="{FAKE_MODEL.name}"]')
                assert lease_row.find_element(By.CSS_SELECTOR, "td.holder").text == "nobody"
                assert lease_row.find_element(By.CSS_SELECTOR, "td.pinned").text == "alice: 3 groups, bob: 2 groups"
                assert lease_row.find_element(By.CSS_SELECTOR, "td.fingerprint").text == FAKE_MODEL.fingerprint
                assert driver.find_element(By.ID, "leases-summary").text.startswith("Nobody holds a lease")
                assert driver.find_element(By.ID, "error").get_attribute("hidden") is not None
                shot = _artifacts(tmp_path) / "status_page.png"
                assert driver.save_screenshot(str(shot))
                assert shot.stat().st_size > 1000
        finally:
            server._loop.call_soon_threadsafe(engine.score_gate.set)
            for post in posts:
                if post.is_alive() or post.ident is not None:
                    post.join(60)
    assert statuses == [200, 200]


SWAP_USERS = {"alice": User("alice"), "root": User("root", role="admin")}
ADMIN_TOKEN = "status-page-admin-token"


def _load(url: str, user: str, body: dict) -> int:
    request = urllib.request.Request(
        f"{url}/v1/models/load", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "X-Test-User": user, "Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        return resp.status


@pytest.mark.browser
def test_status_page_in_chromium_shows_recent_swaps_newest_first(tmp_path):
    _require_browser()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from rmserve.fingerprint import model_fingerprint

    root = tmp_path / "ckpts"
    step0, step1 = write_fake_checkpoint(root / "step-0", 0.0), write_fake_checkpoint(root / "step-1", 10.0)
    fp0, fp1 = model_fingerprint(step0, None), model_fingerprint(step1, None)
    stub = user_header_middleware(SWAP_USERS)

    def make_app() -> web.Application:
        config = ServerConfig(port=0, admin_token=ADMIN_TOKEN, checkpoint_roots=(str(root),))
        app = create_app(config, ReloadableFakeEngine(checkpoint_dir=str(step0)), FakeRenderer())
        app.middlewares.append(stub)
        return app

    with ThreadedServer(make_app) as server:
        url = server.url
        assert _load(url, "alice", {"name": "step-1", "path": str(step1)}) == 200
        # alice holds the lease: root's load goes through only because it is forced
        assert _load(url, "root", {"name": "step-0", "path": str(step0), "force": True}) == 200
        with _chromium(tmp_path, "status_page_swaps") as driver:
            driver.get(url + "/")
            WebDriverWait(driver, 30).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#swaps tbody tr")) == 2)
            rows = driver.find_elements(By.CSS_SELECTOR, "#swaps tbody tr")

            def cells(row) -> list[str]:
                return [row.find_element(By.CSS_SELECTOR, f"td.{name}").text
                        for name in ("user", "model", "old-fingerprint", "new-fingerprint", "forced", "overridden")]

            assert cells(rows[0]) == ["root", "step-0", fp1, fp0, "yes", "none"]
            assert cells(rows[1]) == ["alice", "step-1", FAKE_MODEL.fingerprint, fp1, "no", "none"]  # as it started
            assert driver.find_element(By.ID, "swaps-summary").text == "2 swaps, newest first."
            model_row = driver.find_element(By.CSS_SELECTOR, '#models tr[data-model="step-0"]')
            assert model_row.find_element(By.CSS_SELECTOR, "td.swaps").text == "2"
            lease_row = driver.find_element(By.CSS_SELECTOR, '#leases tr[data-model="step-0"]')
            assert lease_row.find_element(By.CSS_SELECTOR, "td.holder").text == "root"
            shot = _artifacts(tmp_path) / "status_page_swaps.png"
            assert driver.save_screenshot(str(shot))

"""The status page: its files and ``GET /v1/status`` (fast), and the page itself in a headless
Chromium against a running server with two users' work in flight, after swaps, and with
two users' history charted (marker ``browser``).

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
import threading
import urllib.request
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from testkit.app_client import fake_app_client
from testkit.auth_stub import user_header_middleware
from testkit.fakes import FAKE_MODEL, FakeEngine, FakeRenderer, ReloadableFakeEngine, write_fake_checkpoint
from testkit.servers import ThreadedServer
from rmserve.server.http.app import ServerConfig, create_app
from rmserve.server.sharing.users import User

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture
def make_client(aiohttp_client):
    async def make(engine: FakeEngine, **config):
        return await fake_app_client(aiohttp_client, ServerConfig(port=0, **config), engine)

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


EXPECTED_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


async def test_the_page_and_its_files_are_served_with_the_hardening_headers(make_client):
    client = await make_client(FakeEngine())
    for path, status in (("/", 200), ("/static/status.js", 200), ("/static/status.css", 200),
                         ("/static/missing.css", 404)):
        async with client.get(path) as resp:
            assert resp.status == status, path
            assert {name: resp.headers.get(name) for name in EXPECTED_PAGE_HEADERS} == EXPECTED_PAGE_HEADERS, path


async def test_every_json_reply_is_nosniff_and_only_the_page_has_its_policy(make_client):
    client = await make_client(FakeEngine())
    requests = [
        ("GET", "/health", None, 200), ("GET", "/v1/models", None, 200), ("GET", "/v1/status", None, 200),
        ("GET", "/v1/queue", None, 200), ("GET", "/metrics", None, 200),
        ("POST", "/v1/score", {"groups": [{"id": "g", "prompt": "hi", "responses": ["yo"]}]}, 200),
        ("POST", "/v1/score", {"groups": []}, 400), ("GET", "/nowhere", None, 404), ("GET", "/v1/score", None, 405),
        ("POST", "/v1/models/load", {"name": "x", "path": "/x"}, 403),
    ]
    for method, path, body, status in requests:
        async with client.request(method, path, json=body) as resp:
            assert resp.status == status, path
            assert resp.headers["X-Content-Type-Options"] == "nosniff", path
            assert "Content-Security-Policy" not in resp.headers, path


def test_the_page_needs_nothing_its_policy_forbids():
    """No inline script or style, no event-handler attributes, no eval or markup from strings:
    the page works under ``default-src 'self'`` (the browser tests below prove it in Chromium)."""
    import re
    from importlib import resources

    static = resources.files("rmserve.server").joinpath("static")
    html = static.joinpath("index.html").read_text()
    assert re.findall(r"<script\b[^>]*>", html) == ['<script src="/static/status.js">']
    assert "<style" not in html and " style=" not in html
    assert re.findall(r"\son[a-z]+\s*=", html) == []
    script = static.joinpath("status.js").read_text()
    for forbidden in ("eval(", "new Function", "innerHTML", "outerHTML", "insertAdjacentHTML", "document.write",
                      ".style", "setAttribute(\"style", "javascript:"):
        assert forbidden not in script, forbidden


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


async def test_status_names_the_replica_only_when_the_server_is_one(make_client):
    label = "team/1 on node 10.0.0.2, GPUs 0"
    for config, expected in (({}, None), ({"replica": label}, label)):
        client = await make_client(FakeEngine(), **config)
        async with client.get("/v1/status") as resp:
            assert orjson.loads(await resp.read())["replica"] == expected


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


VIOLATION_RECORDER = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push(e.violatedDirective + " " + (e.blockedURI || "inline"));
});
"""
"""Installed in every document before its own scripts (CDP ``Page.addScriptToEvaluateOnNewDocument``):
records each Content-Security-Policy violation the page causes."""


def csp_violations(driver) -> list[str]:
    """Every CSP violation of the current page: those its ``securitypolicyviolation`` events
    recorded (:data:`VIOLATION_RECORDER`) and every browser console line that names the
    Content Security Policy (Chromium logs each refusal there)."""
    recorded = driver.execute_script("return window.__cspViolations || [];")
    console = [entry["message"] for entry in driver.get_log("browser") if "Content Security Policy" in entry["message"]]
    return [*recorded, *console]


@contextlib.contextmanager
def _chromium(tmp_path: Path, name: str):
    """A headless Chromium driver (1400×1000) that keeps the browser console
    (``driver.get_log("browser")``) and records CSP violations (:func:`csp_violations`); on a
    failure inside, the screenshot and page source go to the artifacts folder as
    ``NAME_failure.png`` / ``.html``; always quit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": VIOLATION_RECORDER})
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
                # nobody holds the lease, but pinned work is in flight: a load is not free for all
                assert driver.find_element(By.ID, "leases-summary").text == (
                    "Only admins load checkpoints. Loads into fake-rm are blocked by the pinned work in flight on it "
                    "(alice: 3 groups, bob: 2 groups): a load by any other user is refused until it is done. An admin "
                    "may force a load, which stops those pinned runs; they keep what they scored and resume once "
                    "their checkpoint is served again.")
                assert driver.find_element(By.ID, "error").get_attribute("hidden") is not None
                assert csp_violations(driver) == []  # the page works under its policy
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
            assert csp_violations(driver) == []
            shot = _artifacts(tmp_path) / "status_page_swaps.png"
            assert driver.save_screenshot(str(shot))


@pytest.mark.browser
def test_status_page_in_chromium_names_the_replica(tmp_path):
    """A replica's page says which replica of which set it is; a plain server's says nothing."""
    _require_browser()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    label = "team/1 on node 10.0.0.2, GPUs 0"
    for replica in (label, None):
        def make_app(replica=replica) -> web.Application:
            return create_app(ServerConfig(port=0, replica=replica), FakeEngine(), FakeRenderer())

        with ThreadedServer(make_app) as server, _chromium(tmp_path, "status_page_replica") as driver:
            driver.get(server.url + "/")
            WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "engine-status").text == "ready")
            shown = driver.find_element(By.ID, "replica")
            if replica is None:
                assert not shown.is_displayed()
                continue
            assert shown.is_displayed()
            assert shown.text == f"Replica {label} of a Ray replica set (rmserve cluster status lists the others)."
            assert csp_violations(driver) == []
            assert driver.save_screenshot(str(_artifacts(tmp_path) / "status_page_replica.png"))


PROBE_PAGE = b"""<!doctype html><html><head><style>body { color: red; }</style></head>
<body data-ran="no"><script>document.body.dataset.ran = "yes";</script>
<p style="color: blue">probe</p></body></html>"""
"""A page with an inline style sheet, an inline script and a style attribute: all three are
what the status page's policy forbids."""


@pytest.mark.browser
def test_the_violation_check_sees_what_the_page_policy_blocks(tmp_path):
    """The check the browser tests above rely on reports a page that breaks the policy: the
    probe page, served with the status page's headers, has its inline script and styles
    refused, and each refusal is reported."""
    _require_browser()
    from selenium.webdriver.common.by import By

    from rmserve.server.http.status_page import PAGE_HEADERS

    async def probe(request: web.Request) -> web.Response:
        return web.Response(body=PROBE_PAGE, content_type="text/html", headers=PAGE_HEADERS)

    def make_app() -> web.Application:
        app = create_app(ServerConfig(port=0), FakeEngine(), FakeRenderer())
        app.router.add_get("/csp-probe", probe)
        return app

    with ThreadedServer(make_app) as server, _chromium(tmp_path, "csp_probe") as driver:
        driver.get(server.url + "/csp-probe")
        assert driver.find_element(By.TAG_NAME, "body").get_attribute("data-ran") == "no"  # the script was refused
        violations = csp_violations(driver)
        recorded = [v for v in violations if "Content Security Policy" not in v]
        assert sorted(v.split()[0] for v in recorded) == ["script-src-elem", "style-src-attr", "style-src-elem"]
        assert len(violations) == 6  # and each is also a console line


# --- the charts of the last 15 minutes --------------------------------------------------------

CHART_T0 = 1_700_000_000.0
"""Unix time of the charts test's first sample (2023-11-14 22:13:20 UTC)."""

ALICE_BLUE, BOB_RED = (0x1F, 0x77, 0xB4), (0xD6, 0x27, 0x28)
"""The first two colours of the page's palette (``COLORS`` in status.js): users in name order."""


def _series_pixels(png: Path, box: dict, colour: tuple[int, int, int]) -> int:
    """Pixels of the screenshot ``png`` inside ``box`` (CSS pixels: x, y, width, height, with
    the page's device pixel ratio ``dpr``) within 60 (sum of channel differences) of ``colour``."""
    from PIL import Image

    image = Image.open(png).convert("RGB")
    scale = box["dpr"]
    crop = image.crop((round(box["x"] * scale), round(box["y"] * scale),
                       round((box["x"] + box["width"]) * scale), round((box["y"] + box["height"]) * scale)))
    data = crop.tobytes()
    return sum(1 for i in range(0, len(data), 3)
               if abs(data[i] - colour[0]) + abs(data[i + 1] - colour[1]) + abs(data[i + 2] - colour[2]) <= 60)


CHART_FACTS = """
const text = (root, selector) => Array.from(root.querySelectorAll(selector), (el) => el.textContent);
const chart = (id) => {
  const figure = document.getElementById(id);
  const empty = figure.querySelector("text.empty");
  return {
    lines: Array.from(figure.querySelectorAll("polyline.series"), (line) => ({
      series: line.dataset.series, stroke: line.getAttribute("stroke"),
      points: line.getAttribute("points").split(" ").filter((p) => p).length })),
    names: text(figure, ".legend li .name"), notes: text(figure, ".legend li .note"),
    empty: empty ? empty.textContent : null,
    x_title: text(figure, "text.x-title")[0], y_title: text(figure, "text.y-title")[0],
    x_ticks: text(figure, "text.x-tick"), y_ticks: text(figure, "text.y-tick"),
  };
};
return { throughput: chart("throughput-chart"), queue: chart("queue-chart"),
         summary: document.getElementById("history-summary").textContent };
"""
"""What the charts show, read in one script (the page redraws them every refresh)."""


def _queue_counts(url: str) -> tuple[int, int]:
    """``GET /v1/queue``'s groups queued and in flight (all users)."""
    with urllib.request.urlopen(f"{url}/v1/queue", timeout=10) as resp:
        body = json.load(resp)
    return body["queued_groups"], body["inflight_groups"]


@pytest.mark.browser
def test_status_page_in_chromium_charts_two_users_throughput_and_the_queue(tmp_path):
    """Two users' traffic over 5 minutes of samples the test takes itself (the history's clock
    seam; its sampler takes only the first), then the page's charts: one line per user, the
    legend naming them with the last interval's rates, axis titles with units, the queue's
    depth; the screenshot shows each user's line in its colour, and none before any traffic
    (the empty state)."""
    _require_browser()
    from selenium.webdriver.support.ui import WebDriverWait

    from rmserve.server.http.status_history import HISTORY_KEY, HistoryBuffer, take_sample

    async def never(seconds: float) -> None:
        await asyncio.Event().wait()

    now = [CHART_T0]
    engine = FakeEngine(score_gate=asyncio.Event())

    def make_app() -> web.Application:
        config = ServerConfig(port=0, engine_concurrency_groups=1, result_cache_groups=0)
        app = create_app(config, engine, FakeRenderer())
        app.middlewares.append(user_from_test_header)
        app[HISTORY_KEY] = HistoryBuffer(clock=lambda: now[0], sleep=never)
        return app

    def sample_at(server: ThreadedServer, t: float) -> None:
        async def take() -> None:
            take_sample(server.app)

        now[0] = t
        asyncio.run_coroutine_threadsafe(take(), server._loop).result(10)

    def chart_box(driver, figure: str) -> dict:
        return driver.execute_script(
            "const el = document.querySelector(arguments[0] + ' svg.chart'); el.scrollIntoView();"
            "const r = el.getBoundingClientRect();"
            "return {x: r.x, y: r.y, width: r.width, height: r.height, dpr: window.devicePixelRatio};", figure)

    def chart_facts(driver) -> dict:  # read in one script: a refresh never lands between two reads
        return driver.execute_script(CHART_FACTS)

    statuses: list[int] = []
    folder = _artifacts(tmp_path)
    with ThreadedServer(make_app) as server:
        url = server.url
        server._loop.call_soon_threadsafe(engine.score_gate.set)
        buffer = server.app[HISTORY_KEY]
        WebDriverWait(None, 10).until(lambda _: len(buffer) == 1)  # the sampler's first, at CHART_T0
        sample_at(server, CHART_T0 + 5)  # no traffic yet
        held: threading.Thread | None = None
        try:
            with _chromium(tmp_path, "status_page_charts") as driver:
                driver.get(url + "/")
                WebDriverWait(driver, 30).until(lambda d: chart_facts(d)["throughput"]["empty"])
                facts = chart_facts(driver)
                assert facts["throughput"]["empty"] == "no traffic in the last 15 min"
                assert facts["throughput"]["lines"] == [] and facts["throughput"]["names"] == []
                empty_shot = folder / "status_page_charts_empty.png"
                box = chart_box(driver, "#throughput-chart")
                assert driver.save_screenshot(str(empty_shot))
                assert _series_pixels(empty_shot, box, ALICE_BLUE) == 0
                assert _series_pixels(empty_shot, box, BOB_RED) == 0

                # 59 more samples, 5 s apart; a group = 18 prompt tokens. alice sends 1-4 groups
                # before each, bob 2 groups before samples 20-39 only.
                step = 0
                for step in range(1, 59):
                    _post(url, "alice", 1 + step % 4, 100 * step, statuses)
                    if 20 <= step < 40:
                        _post(url, "bob", 2, 100 * step, statuses)
                    sample_at(server, CHART_T0 + 5 + 5 * step)
                # the last interval: alice 2 groups (36 tokens / 5 s = 7.2 tokens/s, 0.4 groups/s),
                # bob 1 (3.6 tokens/s, 0.2 groups/s); then alice's 3 more groups wait at the closed
                # engine (1 slot): 1 in flight, 2 queued at the last sample
                _post(url, "alice", 2, 10_000, statuses)
                _post(url, "bob", 1, 10_000, statuses)
                server._loop.call_soon_threadsafe(engine.score_gate.clear)
                held = threading.Thread(target=_post, args=(url, "alice", 3, 20_000, statuses))
                held.start()
                WebDriverWait(driver, 30).until(lambda _: _queue_counts(url) == (2, 1))
                sample_at(server, CHART_T0 + 5 + 5 * (step + 1))
                assert len(buffer) == 61

                def drawn(d) -> bool:
                    facts = chart_facts(d)
                    return len(facts["throughput"]["lines"]) == 2 and facts["queue"]["notes"][:1] == ["now 2"]

                WebDriverWait(driver, 30).until(drawn)
                facts = chart_facts(driver)
                throughput, queue = facts["throughput"], facts["queue"]
                assert [line["series"] for line in throughput["lines"]] == ["alice", "bob"]
                assert [line["stroke"] for line in throughput["lines"]] == ["#1f77b4", "#d62728"]
                assert [line["points"] for line in throughput["lines"]] == [60, 60]  # one per interval
                assert throughput["names"] == ["alice", "bob"]
                assert throughput["notes"] == [
                    "last 5.0 s: 7.2 tokens/s, 0.4 groups/s", "last 5.0 s: 3.6 tokens/s, 0.2 groups/s"]
                assert throughput["empty"] is None
                # the last sample at CHART_T0 + 300 s = 22:18:20 UTC
                assert throughput["y_title"] == "prompt tokens/s"
                assert throughput["x_title"] == "minutes before 2023-11-14 22:18:20 UTC"
                assert throughput["x_ticks"] == ["0", "−5", "−10", "−15"]
                # y axis: alice's highest rate, 4 groups in 5 s = 14.4 tokens/s, under 20
                assert throughput["y_ticks"] == ["0", "5", "10", "15", "20"]
                assert queue["y_title"] == "groups"
                assert [line["series"] for line in queue["lines"]] == ["queued", "in flight"]
                assert [line["points"] for line in queue["lines"]] == [61, 61]
                assert queue["names"] == ["queued", "in flight"]
                assert queue["notes"] == ["now 2", "now 1"]
                assert facts["summary"] == (
                    "One sample every 5 s, the last 180 kept (15 min); 61 samples so far. "
                    "Rates are over each interval between two samples.")
                assert csp_violations(driver) == []
                shot = folder / "status_page_charts.png"
                box = chart_box(driver, "#throughput-chart")
                assert driver.save_screenshot(str(shot))
                # each user's line is drawn in its colour (measured: about 3,300 px of alice's
                # zig-zag over 5 min, about 500 of bob's; none of either before any traffic)
                assert _series_pixels(shot, box, ALICE_BLUE) > 1000
                assert _series_pixels(shot, box, BOB_RED) > 250
        finally:
            server._loop.call_soon_threadsafe(engine.score_gate.set)
            if held is not None:
                held.join(60)
    assert statuses == [200] * (len(statuses)) and len(statuses) == 58 + 20 + 2 + 1

"""Any bytes in the ``Authorization`` header get a 401 (or the route's own answer), never a 500,
in every authentication mode: no users file and no admin token, an admin token only, a users
file.

The requests are written byte for byte on a raw socket (``Connection: close``), so the header
holds exactly the bytes under test: ``Bearer t\\xf6k\\xe9n`` is what Python's ``http.client``
sends for ``"Bearer tökén"`` (it encodes header values as Latin-1; one case below goes through
``http.client`` to show it), ``Bearer \\xff\\xfe`` is no text in any encoding. aiohttp hands
such bytes to the app as surrogate escapes; the one token check
(:func:`rmserve.server.sharing.auth.check_token`) turns them back into the bytes sent.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json

import pytest
from testkit.app_client import fake_app_client, metric_samples
from testkit.fakes import ReloadableFakeEngine, write_fake_checkpoint

from rmserve.server.http.app import ServerConfig
from rmserve.server.sharing.auth import add_user

ADMIN_TOKEN = "tökén"
"""The admin token of the admin-token mode: its UTF-8 bytes are ``t\\xc3\\xb6k\\xc3\\xa9n``."""

NOT_UTF8 = (
    "malformed Authorization header: the token is not UTF-8 (a client that sends a token with non-ASCII "
    "characters as Latin-1?)"
)
NOT_BEARER = (
    "malformed Authorization header: expected 'Bearer <token>' (one token, no spaces) or Basic credentials "
    "whose password is the token"
)
UNKNOWN_USER = "unknown token: no user of this server has it"
WRONG_ADMIN = (
    "wrong admin token: it is not the token this server was started with (--admin-token-file or RMSERVE_ADMIN_TOKEN)"
)
DISABLED = (
    "is disabled: the server was started without a users file and without an admin token "
    "(--admin-token-file or RMSERVE_ADMIN_TOKEN)"
)

# (raw header value, reason, message with a users file, message with an admin token)
BAD_HEADERS = [
    (b"Bearer t\xf6k\xe9n", "malformed", NOT_UTF8, NOT_UTF8),
    (b"Bearer \xff\xfe", "malformed", NOT_UTF8, NOT_UTF8),
    (b"Bearer \x80abc", "malformed", NOT_UTF8, NOT_UTF8),
    (b"\xff\xfe", "malformed", NOT_BEARER, NOT_BEARER),
    (b"B\xe9arer token", "malformed", NOT_BEARER, NOT_BEARER),
    (b"Bearer t\xc3\xb6k\xc3\xa9x", "unknown", UNKNOWN_USER, WRONG_ADMIN),  # UTF-8, but no one's token
]
IDS = ["latin1-tokén", "ff-fe", "80abc", "no-scheme", "latin1-scheme", "utf8-unknown"]

SCORE_BODY = json.dumps({"groups": [{"id": "g0", "prompt": "hi", "responses": ["yo", "ya"]}]}).encode()

ROUTES = [
    ("POST", "/v1/score", SCORE_BODY),
    ("GET", "/v1/models", b""),
    ("GET", "/v1/queue", b""),
    ("GET", "/v1/status", b""),
    ("GET", "/metrics", b""),
    ("POST", "/v1/models/load", b'{"name": "x", "path": "/nowhere"}'),
    ("POST", "/v1/models/release", b'{"name": "fake-rm"}'),
]
"""Every route that takes a token in some mode (``/health``, ``/`` and ``/static/…`` never do)."""

SWAP_ROUTES = {"/v1/models/load", "/v1/models/release"}


async def raw_request(client, method: str, path: str, authorization: bytes, body: bytes = b"") -> tuple[int, dict, dict]:
    """Send one request with the header ``Authorization: <authorization>`` exactly as given;
    returns (status, headers with lower-case names, JSON body)."""
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
    ).encode()
    writer.write(head + b"Authorization: " + authorization + b"\r\n\r\n" + body)
    await writer.drain()
    reply = await reader.read()
    writer.close()
    await writer.wait_closed()
    head, _, payload = reply.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, json.loads(payload) if payload.startswith(b"{") else {}


@pytest.fixture
def root(tmp_path):
    """A checkpoint root holding the served fake checkpoint (written outside the event loop)."""
    root = tmp_path / "ckpts"
    write_fake_checkpoint(root / "step-0", 0.0)
    return root


@pytest.fixture
def users_config(tmp_path, root) -> tuple[ServerConfig, str]:
    """A config with a users file (read outside the event loop) and the token of its user."""
    path = tmp_path / "users.jsonl"
    token, _ = add_user(path, "alice", role="admin")
    return ServerConfig(port=0, users_file=str(path), checkpoint_roots=(str(root),)), token


@pytest.fixture
def start(aiohttp_client, root):
    async def make(config: ServerConfig | None = None, **options):
        config = config or ServerConfig(port=0, checkpoint_roots=(str(root),), **options)
        engine = ReloadableFakeEngine(checkpoint_dir=str(root / "step-0"))
        return await fake_app_client(aiohttp_client, config, engine)

    return make


async def rejections(client, headers: dict[str, str] | None = None) -> dict[str, float]:
    """``rmserve_auth_rejections_total`` by reason."""
    async with client.get("/metrics", headers=headers or {}) as resp:
        assert resp.status == 200
        samples = metric_samples(await resp.text())
    return {dict(labels)["reason"]: value for (name, labels), value in samples.items()
            if name == "rmserve_auth_rejections_total"}


@pytest.mark.parametrize(("raw", "reason", "users_message", "admin_message"), BAD_HEADERS, ids=IDS)
async def test_with_a_users_file_every_route_answers_401(start, users_config, raw, reason, users_message, admin_message):
    config, token = users_config
    client = await start(config)
    for method, path, body in ROUTES:
        status, headers, reply = await raw_request(client, method, path, raw, body)
        assert (status, reply["error"]["type"]) == (401, "unauthorized"), path
        assert reply["error"]["message"] == users_message, path
        assert headers["www-authenticate"] == 'Bearer realm="rmserve"'
    counted = await rejections(client, {"Authorization": f"Bearer {token}"})
    assert counted == {"missing": 0, "malformed": 0, "unknown": 0, "expired": 0, "forbidden": 0, reason: len(ROUTES)}


@pytest.mark.parametrize(("raw", "reason", "users_message", "admin_message"), BAD_HEADERS, ids=IDS)
async def test_with_an_admin_token_the_swap_routes_answer_401_and_the_rest_ignore_the_header(
    start, raw, reason, users_message, admin_message
):
    client = await start(admin_token=ADMIN_TOKEN)
    expected_open = {"/v1/score": 200, "/v1/models": 200, "/v1/queue": 200, "/v1/status": 200, "/metrics": 200}
    for method, path, body in ROUTES:
        status, headers, reply = await raw_request(client, method, path, raw, body)
        if path in SWAP_ROUTES:
            assert (status, reply["error"]["type"], reply["error"]["message"]) == (401, "unauthorized", admin_message)
            assert headers["www-authenticate"] == 'Bearer realm="rmserve"'
        else:
            assert status == expected_open[path], path
    counted = await rejections(client)
    assert counted == {"missing": 0, "malformed": 0, "unknown": 0, "expired": 0, "forbidden": 0, reason: 2}


async def test_with_an_admin_token_its_utf8_bytes_pass_and_its_latin1_bytes_do_not(start):
    client = await start(admin_token=ADMIN_TOKEN)
    load = b'{"name": "x", "path": "/nowhere"}'
    status, _, reply = await raw_request(client, "POST", "/v1/models/load", b"Bearer t\xc3\xb6k\xc3\xa9n", load)
    # past the token: the swap's own checks answer (the path is not under a checkpoint root)
    assert (status, reply["error"]["type"], reply["error"]["field"]) == (403, "forbidden", "path")
    status, _, reply = await raw_request(client, "POST", "/v1/models/release", b"bearer  t\xc3\xb6k\xc3\xa9n ",
                                         b'{"name": "fake-rm"}')
    assert (status, reply["error"]["type"]) == (409, "conflict")  # nobody holds a lease
    status, _, reply = await raw_request(client, "POST", "/v1/models/load", b"Bearer t\xf6k\xe9n", load)
    assert (status, reply["error"]["message"]) == (401, NOT_UTF8)


async def test_http_client_sends_latin1_and_gets_401(start):
    """What ``http.client`` does with a non-ASCII header value: Latin-1 bytes, answered 401."""
    client = await start(admin_token=ADMIN_TOKEN)

    def post() -> tuple[int, dict]:
        conn = http.client.HTTPConnection(client.server.host, client.server.port, timeout=10)
        try:
            conn.request("POST", "/v1/models/load", body=b'{"name": "x", "path": "/nowhere"}',
                         headers={"Authorization": "Bearer tökén", "Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    status, reply = await asyncio.to_thread(post)
    assert (status, reply["error"]["type"], reply["error"]["message"]) == (401, "unauthorized", NOT_UTF8)


@pytest.mark.parametrize(("raw", "reason", "users_message", "admin_message"), BAD_HEADERS, ids=IDS)
async def test_without_users_or_admin_token_the_swap_routes_are_403_and_the_rest_ignore_the_header(
    start, raw, reason, users_message, admin_message
):
    client = await start()
    for method, path, body in ROUTES:
        status, _, reply = await raw_request(client, method, path, raw, body)
        if path in SWAP_ROUTES:
            assert (status, reply["error"]["type"]) == (403, "forbidden"), path
            assert reply["error"]["message"] == f"POST {path} {DISABLED}"
        else:
            assert status == 200, path


def test_bearer_token_returns_the_bytes_sent():
    from rmserve.server.sharing.auth import AuthRejected, bearer_token

    # aiohttp's view of the bytes b"Bearer t\xc3\xb6k" (UTF-8) and b"Bearer t\xf6k" (Latin-1)
    assert bearer_token("Bearer tök") == b"t\xc3\xb6k"
    assert bearer_token("  bearer\tabc-_.~  ") == b"abc-_.~"
    with pytest.raises(AuthRejected) as refused:
        bearer_token("Bearer t\udcf6k")
    assert (refused.value.reason, refused.value.message) == ("malformed", NOT_UTF8)
    with pytest.raises(AuthRejected) as refused:
        bearer_token("Bearer \ud800")  # a lone surrogate no wire bytes give
    assert refused.value.reason == "malformed"
    # Basic credentials (RFC 7617): the password is the token, the name is not checked
    assert bearer_token("Basic " + base64.b64encode(b"trainer:abc-_").decode()) == b"abc-_"
    assert bearer_token("basic " + base64.b64encode(b":t:\xc3\xb6k").decode()) == b"t:\xc3\xb6k"
    with pytest.raises(AuthRejected) as refused:
        bearer_token("Basic " + base64.b64encode(b"trainer:t\xf6k").decode())
    assert (refused.value.reason, refused.value.message) == ("malformed", NOT_UTF8)
    for credentials in (b"trainer", b"trainer:"):
        with pytest.raises(AuthRejected) as refused:
            bearer_token("Basic " + base64.b64encode(credentials).decode())
        assert refused.value.message.endswith("need the token as the password (NAME:TOKEN, e.g. "
                                              "http://NAME:TOKEN@host:8000/… in a client's URL)"), credentials
    for header, reason in ((None, "missing"), ("   ", "missing"), ("Bearer", "malformed"), ("Token abc", "malformed"),
                           ("Basic", "malformed"), ("Basic !!notbase64", "malformed")):
        with pytest.raises(AuthRejected) as refused:
            bearer_token(header)
        assert refused.value.reason == reason, header


@pytest.fixture
def node_configs(users_config, root) -> dict[str, tuple[ServerConfig, dict[str, ServerConfig]]]:
    """The three modes' configs for a server of two models: (node config, model name → model
    app config), built outside the event loop (a users file is read)."""
    import dataclasses

    modes = {
        "users file": users_config[0],
        "admin token": ServerConfig(port=0, admin_token=ADMIN_TOKEN, checkpoint_roots=(str(root),)),
        "no auth": ServerConfig(port=0, checkpoint_roots=(str(root),)),
    }
    return {mode: (config, {name: dataclasses.replace(config, served_model_name=name) for name in ("a", "b")})
            for mode, config in modes.items()}


async def test_a_server_of_two_models_checks_tokens_the_same_way(aiohttp_client, node_configs):
    import msgspec
    from testkit.fakes import FAKE_MODEL, FakeEngine, FakeRenderer

    from rmserve.server.http.app import STATE_KEY, create_app
    from rmserve.server.http.node import create_node_app, model_states

    expected = {  # mode → {path: status} for the header b"Bearer t\xf6k\xe9n"
        "users file": {path: 401 for _, path, _ in ROUTES},
        "admin token": {**{path: 200 for _, path, _ in ROUTES}, "/v1/models/load": 401, "/v1/models/release": 401},
        "no auth": {**{path: 200 for _, path, _ in ROUTES}, "/v1/models/load": 403, "/v1/models/release": 403},
    }
    for mode, (config, model_configs) in node_configs.items():
        apps = [(name, create_app(model_config,
                                  FakeEngine(model=msgspec.structs.replace(FAKE_MODEL, name=name, fingerprint=f"fp-{name}")),
                                  FakeRenderer()))
                for name, model_config in model_configs.items()]
        client = await aiohttp_client(create_node_app(config, apps))
        async with asyncio.timeout(10):
            while any(state.status != "ready" for state in model_states(client.server.app)):
                await asyncio.sleep(0.01)
        seen = {}
        for method, path, body in ROUTES:
            if path == "/v1/score":
                body = json.dumps({**json.loads(body), "model": "a"}).encode()
            status, _, reply = await raw_request(client, method, path, b"Bearer t\xf6k\xe9n", body)
            seen[path] = status
            if status == 401:
                assert reply["error"]["message"] == NOT_UTF8
        assert seen == expected[mode], mode
        assert all(app[STATE_KEY].status == "ready" for _, app in apps)

"""Who is asking: the users file, bearer tokens, roles, the loopback rule, per-user metrics and logs.

A real aiohttp server (``aiohttp_client``) over the fake engine; expected numbers follow the
fakes' rules (see ``tests/server/test_app.py``): the group ``VALID`` (prompt "hi", responses
"yo", "ya") is 9 + 9 tokens with rewards 4.55 and 4.41.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import logging

import orjson
import pytest
from testkit.app_client import fake_app_client, metric_samples
from testkit.fakes import FakeEngine, FakeRenderer
from typer.testing import CliRunner

from rmserve.cli import app as cli_app
from rmserve.schema import ScoreResponse, decode
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from rmserve.server.sharing.auth import AuthRejected, UserRegistry, UsersFileError, add_user, parse_users, read_users_file, remove_user
from rmserve.server.sharing.users import CURRENT_USER, RequestUserLogFilter, User

VALID = {"groups": [{"id": "g0", "prompt": "hi", "responses": ["yo", "ya"]}]}
REASONS = ("missing", "malformed", "unknown", "expired", "forbidden")


@pytest.fixture
def users(tmp_path):
    """A users file with two scorers (alice, bob), an admin (root) and an expired scorer (old);
    returns (path, name → token)."""
    path = tmp_path / "users.jsonl"
    tokens = {}
    tokens["alice"], _ = add_user(path, "alice")
    tokens["bob"], _ = add_user(path, "bob", weight=2.0)
    tokens["root"], _ = add_user(path, "root", role="admin")
    tokens["old"], _ = add_user(path, "old", expires=dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc))
    return path, tokens


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def make_client(aiohttp_client, engine):
    async def make(config: ServerConfig):
        return await fake_app_client(aiohttp_client, config, engine)

    return make


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def scrape(client) -> dict[tuple[str, tuple], float]:
    async with client.get("/metrics", headers=client.metrics_headers) as resp:
        assert resp.status == 200
        text = await resp.text()
    return metric_samples(text)


@pytest.fixture
def config(users, tmp_path) -> ServerConfig:
    """Built outside the event loop: it reads the users file."""
    return ServerConfig(port=0, users_file=str(users[0]), checkpoint_roots=(str(tmp_path),))


@pytest.fixture
async def served(make_client, users, config):
    client = await make_client(config)
    client.metrics_headers = bearer(users[1]["alice"])
    return client, users[1]


# --- the users file ----------------------------------------------------------------------------


def test_users_add_prints_the_token_once_and_the_file_keeps_only_its_salted_hash(tmp_path):
    path = tmp_path / "users.jsonl"
    result = CliRunner().invoke(cli_app, [
        "users", "add", "alice", "--users-file", str(path), "--role", "admin", "--weight", "3",
        "--max-inflight-groups", "8", "--tokens-per-minute", "5000", "--expires", "2031-05-01T12:00:00Z",
    ])
    assert result.exit_code == 0, result.output
    token = result.stdout.strip()
    assert result.stdout == token + "\n"  # stdout holds the token alone, once
    assert len(token) == 43  # 32 random bytes, URL-safe base64 without padding
    text = path.read_text()
    assert token not in text
    (line,) = [json.loads(raw) for raw in text.splitlines()]
    assert line["token_sha256"] == hashlib.sha256(bytes.fromhex(line["salt"]) + token.encode()).hexdigest()
    assert {k: v for k, v in line.items() if k not in ("token_sha256", "salt")} == {
        "name": "alice", "role": "admin", "weight": 3.0, "max_inflight_groups": 8, "tokens_per_minute": 5000,
        "expires": "2031-05-01T12:00:00Z",
    }
    assert path.stat().st_mode & 0o777 == 0o600
    registry = UserRegistry(read_users_file(path))
    assert registry.authenticate(f"Bearer {token}", now_s=0.0) == User(
        name="alice", role="admin", weight=3.0, max_inflight_groups=8, tokens_per_minute=5000
    )

    listed = CliRunner().invoke(cli_app, ["users", "list", "--users-file", str(path)])
    assert listed.exit_code == 0, listed.output
    assert listed.stdout.splitlines()[1] == "alice\tadmin\t3\t8\t5000\t2031-05-01T12:00:00+00:00"
    assert token not in listed.stdout and line["token_sha256"] not in listed.stdout

    again = CliRunner().invoke(cli_app, ["users", "add", "alice", "--users-file", str(path)])
    assert again.exit_code == 2
    assert "already has a user 'alice'" in again.output


def test_users_remove_keeps_comments_and_other_users(tmp_path):
    path = tmp_path / "users.jsonl"
    path.write_text("# team users\n")
    add_user(path, "alice")
    add_user(path, "bob")
    result = CliRunner().invoke(cli_app, ["users", "remove", "alice", "--users-file", str(path)])
    assert result.exit_code == 0, result.output
    lines = path.read_text().splitlines()
    assert lines[0] == "# team users"
    assert [json.loads(raw)["name"] for raw in lines[1:]] == ["bob"]
    with pytest.raises(UsersFileError, match=r"has no user 'alice' \(users: bob\)"):
        remove_user(path, "alice")


def test_users_file_errors_name_the_file_line_and_field(tmp_path):
    good = json.dumps({"name": "a", "token_sha256": "0" * 64, "salt": "1" * 32})
    with pytest.raises(UsersFileError, match=r"users file 'F', line 3, field 'role': .*"):
        parse_users(f"# comment\n{good}\n" + json.dumps({"name": "b", "token_sha256": "0" * 64, "salt": "1" * 32,
                                                          "role": "root"}), "F")
    with pytest.raises(UsersFileError, match=r"line 2, field 'tokens_per_minute': Expected `int` >= 1"):
        parse_users(good + "\n" + json.dumps({"name": "b", "token_sha256": "0" * 64, "salt": "1" * 32,
                                              "tokens_per_minute": 0}), "F")
    with pytest.raises(UsersFileError, match=r"line 1, field 'token'"):
        parse_users(json.dumps({"name": "b", "token": "plain", "token_sha256": "0" * 64, "salt": "1" * 32}), "F")
    with pytest.raises(UsersFileError, match=r"line 2, field 'name': user 'a' is already on line 1"):
        parse_users(good + "\n" + good, "F")
    with pytest.raises(UsersFileError, match=r"line 1: not a JSON object"):
        parse_users("name = 'a'", "F")
    with pytest.raises(UsersFileError, match=r"line 1, field 'expires'"):  # a time without a zone
        parse_users(json.dumps({"name": "b", "token_sha256": "0" * 64, "salt": "1" * 32,
                                "expires": "2030-01-01T00:00:00"}), "F")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("# nobody yet\n")
    with pytest.raises(UsersFileError, match="holds no user; add one with: rmserve users add NAME"):
        read_users_file(empty)


def test_serve_reports_a_bad_users_file_against_the_option(tmp_path):
    path = tmp_path / "users.jsonl"
    path.write_text('{"name": "a", "salt": "00"}\n')
    result = CliRunner().invoke(cli_app, ["serve", "m", "--users-file", str(path)])
    assert result.exit_code == 2
    assert "Invalid value for '--users-file'" in result.output
    assert "line 1" in result.output


# --- the loopback rule ---------------------------------------------------------------------


def test_a_non_loopback_host_needs_a_users_file_or_insecure_no_auth(users):
    path, _ = users
    with pytest.raises(ValueError) as refused:
        ServerConfig(host="0.0.0.0")
    message = str(refused.value)
    assert message.startswith("ServerConfig.host is '0.0.0.0'")
    assert "--users-file FILE" in message and "--insecure-no-auth" in message
    for host in ("10.1.2.3", "gpu-node.example", "::"):
        with pytest.raises(ValueError, match="no users file"):
            ServerConfig(host=host)
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1"):
        assert ServerConfig(host=host).host == host
    assert ServerConfig(host="0.0.0.0", insecure_no_auth=True).insecure_no_auth
    assert ServerConfig(host="0.0.0.0", users_file=str(path)).users[0].name == "alice"
    with pytest.raises(ValueError, match="give one of --users-file .* or --insecure-no-auth"):
        ServerConfig(host="0.0.0.0", users_file=str(path), insecure_no_auth=True)


def test_serve_refuses_a_remote_host_without_users_naming_host_and_both_fixes():
    result = CliRunner().invoke(cli_app, ["serve", "m", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    flat = " ".join(result.output.split())
    assert "Invalid value for '--host': '0.0.0.0'" in flat
    assert "--users-file FILE" in flat and "--insecure-no-auth" in flat


# --- authentication on a real server ----------------------------------------------------------


async def test_a_valid_token_scores_and_the_reply_is_the_same_as_without_users(served, engine):
    client, tokens = served
    async with client.post("/v1/score", json=VALID, headers=bearer(tokens["alice"])) as resp:
        assert resp.status == 200
        reply = decode(await resp.read(), ScoreResponse)
    assert reply.results[0].rewards == (4.55, 4.41)
    assert len(engine.calls) == 1
    metrics = await scrape(client)
    key = ("rmserve_user_requests_total", (("endpoint", "/v1/score"), ("status", "200"), ("user", "alice")))
    assert metrics[key] == 1
    assert metrics[("rmserve_user_prompt_tokens_total", (("user", "alice"),))] == 18
    assert metrics[("rmserve_user_admitted_groups_total", (("user", "alice"),))] == 1


@pytest.mark.parametrize(
    ("headers", "reason", "message"),
    [
        ({}, "missing", "this server needs a token"),
        ({"Authorization": "Basic YWxpY2U6eA=="}, "unknown", "unknown token"),  # alice:x, the token x
        ({"Authorization": "Basic YWxpY2U="}, "malformed", "need the token as the password"),  # alice, no password
        ({"Authorization": "Digest YWxpY2U6eA=="}, "malformed", "expected 'Bearer <token>'"),
        ({"Authorization": "Bearer"}, "malformed", "expected 'Bearer <token>'"),
        ({"Authorization": "Bearer two words"}, "malformed", "expected 'Bearer <token>'"),
        ({"Authorization": "Bearer not-a-token-of-anyone"}, "unknown", "unknown token"),
        ("old", "expired", "the token of user 'old' expired at 2020-01-01T00:00:00+00:00"),
    ],
)
async def test_a_request_without_a_valid_token_is_401_and_never_reaches_the_engine(
    served, engine, headers, reason, message
):
    client, tokens = served
    if headers == "old":
        headers = bearer(tokens["old"])
    for path, method in (("/v1/score", "POST"), ("/v1/models", "GET"), ("/metrics", "GET"), ("/v1/models/load", "POST")):
        async with client.request(method, path, json=VALID, headers=headers) as resp:
            assert resp.status == 401, path
            assert resp.headers["WWW-Authenticate"] == 'Bearer realm="rmserve"'
            body = orjson.loads(await resp.read())
        assert body["error"]["type"] == "unauthorized"
        assert message in body["error"]["message"]
    assert engine.calls == []
    metrics = await scrape(client)
    for other in REASONS:
        assert metrics[("rmserve_auth_rejections_total", (("reason", other),))] == (4 if other == reason else 0)
    assert metrics[("rmserve_requests_total", (("endpoint", "/v1/score"), ("status", "401")))] == 1
    assert ("rmserve_groups_total", ()) in metrics and metrics[("rmserve_groups_total", ())] == 0


async def test_a_token_is_never_echoed_in_a_reply(served):
    client, tokens = served
    secret = tokens["alice"] + "x"
    async with client.post("/v1/score", json=VALID, headers=bearer(secret)) as resp:
        assert resp.status == 401
        assert secret not in await resp.text()


async def test_a_scorer_may_not_swap_but_an_admin_gets_past_authentication(served, tmp_path):
    client, tokens = served
    (tmp_path / "empty-checkpoint").mkdir()
    load = {"name": "x", "path": str(tmp_path / "empty-checkpoint")}
    async with client.post("/v1/models/load", json=load, headers=bearer(tokens["alice"])) as resp:
        assert resp.status == 403
        error = orjson.loads(await resp.read())["error"]
    assert error["type"] == "forbidden"
    assert error["message"] == "user 'alice' has the role 'scorer'; POST /v1/models/load needs the role 'admin'"
    async with client.post("/v1/models/load", json=load, headers=bearer(tokens["root"])) as resp:
        status = resp.status
        error = orjson.loads(await resp.read())["error"]
    # past authentication and role (no admin token needed with a users file): the swap's own
    # checks answer, here the checkpoint check of an empty folder
    assert (status, error["type"]) == (422, "invalid_checkpoint")
    metrics = await scrape(client)
    assert metrics[("rmserve_auth_rejections_total", (("reason", "forbidden"),))] == 1


async def test_health_status_page_and_static_files_need_no_token(served):
    client, _ = served
    async with client.get("/health") as resp:
        assert resp.status == 200
    for path in ("/", "/static/status.css"):
        async with client.get(path) as resp:
            assert resp.status == 200  # the status page and its files: public, and holding no secret
            assert "WWW-Authenticate" not in resp.headers
    async with client.get("/static/missing.css") as resp:
        assert resp.status == 404  # not refused either: there is no such file
        assert "WWW-Authenticate" not in resp.headers


async def test_without_a_users_file_every_request_is_anonymous(make_client, engine):
    client = await make_client(ServerConfig(port=0))
    client.metrics_headers = {}
    async with client.post("/v1/score", json=VALID) as resp:
        assert resp.status == 200
    metrics = await scrape(client)
    key = ("rmserve_user_requests_total", (("endpoint", "/v1/score"), ("status", "200"), ("user", "anonymous")))
    assert metrics[key] == 1
    assert len(engine.calls) == 1


async def test_log_lines_about_a_request_name_its_user(served, engine, caplog):
    from rmserve.errors import EngineError

    client, tokens = served
    caplog.handler.addFilter(RequestUserLogFilter())
    engine.fail_with = EngineError("the fake engine broke")
    with caplog.at_level(logging.INFO, logger="rmserve"):
        async with client.post("/v1/score", json=VALID, headers=bearer(tokens["bob"])) as resp:
            assert resp.status == 500
        async with client.post("/v1/score", json=VALID, headers=bearer("nobody's")) as resp:
            assert resp.status == 401
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert failed == ["POST /v1/score failed: the fake engine broke [user bob]"]
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and refused[0].startswith("POST /v1/score refused (unknown, 401)")
    assert "nobody's" not in caplog.text


def test_the_log_filter_adds_the_user_inside_a_request_only():
    record = logging.LogRecord("rmserve.server.swaps.swap", logging.INFO, __file__, 1, "loading %s", ("ckpt",), None)
    RequestUserLogFilter().filter(record)
    assert record.getMessage() == "loading ckpt"
    record = logging.LogRecord("rmserve.server.swaps.swap", logging.INFO, __file__, 1, "loading %s", ("ckpt",), None)
    token = CURRENT_USER.set(User(name="carol"))
    try:
        assert RequestUserLogFilter().filter(record) is True
        RequestUserLogFilter().filter(record)  # a second handler adds nothing more
    finally:
        CURRENT_USER.reset(token)
    assert record.getMessage() == "loading ckpt [user carol]"


def test_the_benchmark_bad_tokens_are_refused_for_the_reason_it_counts_them(users):
    """benchmarks/auth_overhead.py sends wrong, expired and malformed tokens in turn; each kind
    must be refused by the server for that reason (else its counts would not add up)."""
    from auth_overhead import bad_header

    path, tokens = users
    registry = UserRegistry(read_users_file(path))
    expected = {"wrong": "unknown", "expired": "expired", "malformed": "malformed"}
    kinds = []
    for i in range(12):
        kind, headers = bad_header(i, tokens["old"])
        kinds.append(kind)
        with pytest.raises(AuthRejected) as refused:
            registry.authenticate(headers["Authorization"], now_s=1.9e9)
        assert refused.value.reason == expected[kind]
    assert kinds == ["wrong", "expired", "malformed"] * 4



@pytest.fixture
def swap_config(users, tmp_path):
    """Built outside the event loop (file writes and the users file): two fake checkpoints
    under a checkpoint root and a config with the users file and no admin token."""
    from testkit.fakes import write_fake_checkpoint

    root = tmp_path / "ckpts"
    original, step = write_fake_checkpoint(root / "step-0", 0.0), write_fake_checkpoint(root / "step-1", 10.0)
    return ServerConfig(port=0, users_file=str(users[0]), checkpoint_roots=(str(root),)), original, step


async def test_with_a_users_file_the_lease_holder_releases_with_its_own_token(aiohttp_client, users, swap_config):
    """No admin token is configured: the users file decides who may swap and release."""
    from testkit.fakes import ReloadableFakeEngine

    tokens = users[1]
    config, original, step = swap_config
    app = create_app(config, ReloadableFakeEngine(checkpoint_dir=str(original)), FakeRenderer())
    client = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    async with client.post("/v1/models/load", json={"name": "step-1", "path": str(step)},
                           headers=bearer(tokens["root"])) as resp:
        assert resp.status == 200, await resp.text()
        assert orjson.loads(await resp.read())["models"][0]["lease_holder"] == "root"
    async with client.post("/v1/models/release", json={"name": "step-1"}, headers=bearer(tokens["alice"])) as resp:
        assert resp.status == 403  # neither the holder nor an admin
        assert "root" in orjson.loads(await resp.read())["error"]["message"]
    async with client.post("/v1/models/release", json={"name": "step-1"}, headers=bearer(tokens["root"])) as resp:
        assert resp.status == 200, await resp.text()
        assert "lease_holder" not in orjson.loads(await resp.read())["models"][0]


@pytest.fixture
def users_edit(users):
    """The users file after the fixture's: bob removed, carol added (built outside the loop)."""
    path, tokens = users
    remove_user(path, "bob")
    carol, _ = add_user(path, "carol", role="admin")
    return path, {**tokens, "carol": carol}


async def test_a_reloaded_users_file_adds_and_removes_users_without_a_restart(users_edit):
    from rmserve.server.sharing.auth import UserRegistry
    from rmserve.server.http.serve import reload_users_file

    path, tokens = users_edit
    registry = UserRegistry([])  # as the server had it: nobody
    assert await reload_users_file(registry, str(path)) is True
    assert list(registry.users) == ["alice", "root", "old", "carol"]
    assert registry.authenticate(f"Bearer {tokens['carol']}", now_s=0).role == "admin"
    with pytest.raises(AuthRejected) as removed:
        registry.authenticate(f"Bearer {tokens['bob']}", now_s=0)
    assert removed.value.reason == "unknown"
    await asyncio.to_thread(lambda: path.write_text(path.read_text() + "{not json\n"))
    assert await reload_users_file(registry, str(path)) is False  # refused: the users stay as they were
    assert list(registry.users) == ["alice", "root", "old", "carol"]

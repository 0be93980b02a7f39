"""``rmserve models list | load | release`` against real aiohttp servers over the reloadable
fake engine (served from a thread, so the command runs its own event loop as it does from a
shell), and ``rmserve serve --lease-idle-s``.

Users come from a real users file (the authentication middleware of the app): alice and bob
are admins, carol a scorer. Lease times come from a fixed wall clock: 1_800_000_000 Unix
seconds is 2027-01-15 08:00:00 UTC.
"""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest
from aiohttp import web
from testkit.fakes import FAKE_MODEL, FakeRenderer, ReloadableFakeEngine, write_fake_checkpoint
from testkit.servers import ThreadedServer
from typer.testing import CliRunner

from rmserve.cli import app as cli_app
from rmserve.cli_common import ADMIN_TOKEN_ENV
from rmserve.cli_models import FORCE_HINT
from rmserve.cli_users import TOKEN_ENV
from rmserve.client.client import RewardClient
from rmserve.fingerprint import model_fingerprint
from rmserve.server.http.app import ServerConfig, create_app
from rmserve.server.sharing.auth import add_user
from rmserve.server.sharing.leases import LEASES_KEY

WALL = 1_800_000_000.0
WALL_ISO = "2027-01-15T08:00:00Z"
WALL_SERVER = "2027-01-15 08:00:00 UTC"  # how the server's messages write the same time
ADMIN_TOKEN = "s3cret-admin-token"
HEADER = "name\tfingerprint\tkind\tlease_holder\tlease_since"


@pytest.fixture(autouse=True)
def server_logs_stay_out_of_the_commands_output(monkeypatch):
    """The server runs in this process (a thread) while CliRunner captures stderr: its log
    records (and any handler another test left on a closed stream) must not reach the
    command's captured output, as they would not from a server in another process."""
    server_logger = logging.getLogger("rmserve.server")
    monkeypatch.setattr(server_logger, "handlers", [logging.NullHandler()])
    monkeypatch.setattr(server_logger, "propagate", False)


@pytest.fixture
def checkpoints(tmp_path):
    root = tmp_path / "ckpts"
    return root, write_fake_checkpoint(root / "step-0", 0.0), write_fake_checkpoint(root / "step-1", 10.0)


@pytest.fixture
def users(tmp_path):
    path = tmp_path / "users.jsonl"
    tokens = {
        "alice": add_user(path, "alice", role="admin")[0],
        "bob": add_user(path, "bob", role="admin")[0],
        "carol": add_user(path, "carol")[0],
    }
    return path, tokens


def _ready(url: str) -> None:
    async def wait() -> None:
        async with RewardClient(url) as client:
            await client.wait_until_ready(30)

    asyncio.run(wait())


def _serve(checkpoints, **config) -> ThreadedServer:
    root, original, _ = checkpoints

    def make_app():
        engine = ReloadableFakeEngine(checkpoint_dir=str(original))
        app = create_app(ServerConfig(port=0, checkpoint_roots=(str(root),), **config), engine, FakeRenderer())
        app[LEASES_KEY].wall = lambda: WALL
        return app

    return ThreadedServer(make_app)


def models(url: str, *extra: str, env: dict[str, str] | None = None):
    """``rmserve models …`` with ``--server url`` appended."""
    return CliRunner().invoke(cli_app, ["models", *extra, "--server", url], env=env)


def _as(tokens: dict[str, str], user: str) -> dict[str, str]:
    return {TOKEN_ENV: tokens[user], ADMIN_TOKEN_ENV: ""}


def test_list_shows_each_model_and_who_holds_its_lease(checkpoints, users):
    users_file, tokens = users
    step1 = checkpoints[2]
    fp1 = model_fingerprint(step1, None)
    with _serve(checkpoints, users_file=str(users_file)) as server:
        _ready(server.url)
        listed = models(server.url, "list", env=_as(tokens, "carol"))
        assert listed.exit_code == 0, listed.output
        assert listed.stdout.splitlines() == [HEADER, f"fake-rm\t{FAKE_MODEL.fingerprint}\tclassifier\t-\t-"]

        loaded = models(server.url, "load", "step", str(step1), env=_as(tokens, "alice"))
        assert loaded.exit_code == 0, loaded.output
        assert loaded.stdout.splitlines() == [
            f"loaded {step1} as step (swap kind reload): fingerprint {fp1}, kind classifier, lease held by alice "
            f"since {WALL_ISO}; swaps since the server started: 1"
        ]

        listed = models(server.url, "list", env=_as(tokens, "carol"))
        assert listed.exit_code == 0, listed.output
        assert listed.stdout.splitlines() == [HEADER, f"step\t{fp1}\tclassifier\talice\t{WALL_ISO}"]

        as_json = models(server.url, "list", "--json", env=_as(tokens, "carol"))
        assert as_json.exit_code == 0, as_json.output
        (entry,) = orjson.loads(as_json.stdout)["models"]
        assert (entry["name"], entry["fingerprint"], entry["lease_holder"], entry["lease_since"]) == (
            "step", fp1, "alice", WALL
        )

        without_token = models(server.url, "list", env={TOKEN_ENV: ""})
        assert without_token.exit_code == 1
        assert "error: unauthorized: this server needs a token" in without_token.stderr


def test_a_load_refused_by_another_users_lease_exits_1_with_the_servers_message_and_force_overrides_it(
    checkpoints, users
):
    users_file, tokens = users
    _, step0, step1 = checkpoints
    fp0, fp1 = model_fingerprint(step0, None), model_fingerprint(step1, None)
    with _serve(checkpoints, users_file=str(users_file)) as server:
        _ready(server.url)
        assert models(server.url, "load", "step", str(step1), env=_as(tokens, "alice")).exit_code == 0

        refused = models(server.url, "load", "other", str(step0), env=_as(tokens, "bob"))
        assert refused.exit_code == 1
        assert refused.stdout == ""
        assert refused.stderr.splitlines() == [
            f"error: conflict: checkpoint swap refused for bob: alice holds the lease on model 'step' (fingerprint "
            f"{fp1}) since {WALL_SERVER}; it ends after 600 s without alice's pinned work in flight, or when alice or "
            "an admin releases it (POST /v1/models/release). An admin may force the swap (force: true): runs "
            "pinned to that fingerprint then stop with 409, keep what they scored and resume once it is served again",
            FORCE_HINT,
        ]
        assert FORCE_HINT == ("an admin may add --force to swap anyway; runs pinned to the served checkpoint then "
                              "stop with a 409, keep what they scored and resume once it is served again")
        listed = models(server.url, "list", env=_as(tokens, "carol"))
        assert listed.stdout.splitlines()[1] == f"step\t{fp1}\tclassifier\talice\t{WALL_ISO}"  # nothing changed

        by_scorer = models(server.url, "load", "other", str(step0), "--force", env=_as(tokens, "carol"))
        assert by_scorer.exit_code == 1
        assert by_scorer.stderr.splitlines() == [
            "error: forbidden: user 'carol' has the role 'scorer'; POST /v1/models/load needs the role 'admin'"
        ]

        forced = models(server.url, "load", "other", str(step0), "--force", env=_as(tokens, "bob"))
        assert forced.exit_code == 0, forced.output
        assert forced.stdout.splitlines() == [
            f"loaded {step0} as other (swap kind reload): fingerprint {fp0}, kind classifier, lease held by bob "
            f"since {WALL_ISO}; swaps since the server started: 2"
        ]
        listed = models(server.url, "list", env=_as(tokens, "alice"))
        assert listed.stdout.splitlines() == [HEADER, f"other\t{fp0}\tclassifier\tbob\t{WALL_ISO}"]


def test_release_ends_the_lease_and_a_second_release_is_refused(checkpoints, tmp_path):
    step1 = checkpoints[2]
    fp1 = model_fingerprint(step1, None)
    admin_file = tmp_path / "admin.token"
    admin_file.write_text(ADMIN_TOKEN + "\n")
    no_env = {TOKEN_ENV: "", ADMIN_TOKEN_ENV: ""}
    with _serve(checkpoints, admin_token=ADMIN_TOKEN) as server:
        _ready(server.url)
        loaded = models(server.url, "load", "step", str(step1), "--admin-token-file", str(admin_file), env=no_env)
        assert loaded.exit_code == 0, loaded.output
        listed = models(server.url, "list", env=no_env)
        assert listed.stdout.splitlines()[1] == f"step\t{fp1}\tclassifier\tanonymous\t{WALL_ISO}"

        released = models(server.url, "release", "step", "--admin-token-file", str(admin_file), env=no_env)
        assert released.exit_code == 0, released.output
        assert released.stdout.splitlines() == [f"released the lease on step (fingerprint {fp1})"]
        listed = models(server.url, "list", env=no_env)
        assert listed.stdout.splitlines() == [HEADER, f"step\t{fp1}\tclassifier\t-\t-"]

        again = models(server.url, "release", "step", env={TOKEN_ENV: "", ADMIN_TOKEN_ENV: ADMIN_TOKEN})
        assert again.exit_code == 1
        assert again.stderr.splitlines() == [
            "error: conflict: no lease is held on model 'step'; nothing to release (field name)"
        ]


def test_the_lease_holder_releases_with_a_users_file(checkpoints, users):
    users_file, tokens = users
    step1 = checkpoints[2]
    fp1 = model_fingerprint(step1, None)
    with _serve(checkpoints, users_file=str(users_file)) as server:
        _ready(server.url)
        assert models(server.url, "load", "step", str(step1), env=_as(tokens, "alice")).exit_code == 0
        released = models(server.url, "release", "step", env=_as(tokens, "alice"))
        assert released.stdout.splitlines() == [f"released the lease on step (fingerprint {fp1})"]
        listed = models(server.url, "list", env=_as(tokens, "carol"))
        assert listed.stdout.splitlines() == [HEADER, f"step\t{fp1}\tclassifier\t-\t-"]


def test_load_and_release_without_any_token_are_refused_before_contacting_the_server():
    url = "http://127.0.0.1:9"  # nothing is contacted: the option check comes first
    for argv in (["load", "step", "/ckpts/step-1"], ["release", "step"]):
        result = models(url, *argv, env={TOKEN_ENV: "", ADMIN_TOKEN_ENV: ""})
        assert result.exit_code == 2
        flat = " ".join(result.output.split())
        assert "Invalid value for '--token-file': no token to send: give --token-file FILE or set $RMSERVE_TOKEN" in flat


class LoadRecorder:
    """A stand-in server answering ``POST /v1/models/load`` with a fixed reply, recording each
    request's body and ``Authorization`` header (what the command sends)."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict, str | None]] = []

    def make_app(self) -> web.Application:
        async def load(request: web.Request) -> web.Response:
            self.requests.append((orjson.loads(await request.read()), request.headers.get("Authorization")))
            reply = {"models": [{"name": "rm-b", "max_model_len": 64, "dtype": "float32", "fingerprint": "fp-b",
                                 "engine": "fake", "swap_count": 3, "kind": "dpo"}], "swap_kind": "restart"}
            return web.json_response(reply)

        app = web.Application()
        app.router.add_post("/v1/models/load", load)
        return app


def test_load_sends_model_only_when_given_and_prefers_the_admin_token():
    recorder = LoadRecorder()
    env = {TOKEN_ENV: "user-token", ADMIN_TOKEN_ENV: "admin-token"}
    with ThreadedServer(recorder.make_app) as server:
        plain = models(server.url, "load", "rm-b", "/ckpts/b", env=env)
        named = models(server.url, "load", "rm-b", "/ckpts/b", "--model", "rm-a", "--force", env=env)
        as_json = models(server.url, "load", "rm-b", "/ckpts/b", "--json", env={TOKEN_ENV: "user-token",
                                                                                  ADMIN_TOKEN_ENV: ""})
    assert plain.exit_code == 0, plain.output
    assert plain.stdout.splitlines() == [
        "loaded /ckpts/b as rm-b (swap kind restart): fingerprint fp-b, kind dpo, no lease held; "
        "swaps since the server started: 3"
    ]
    assert named.exit_code == 0, named.output
    assert as_json.exit_code == 0, as_json.output
    assert orjson.loads(as_json.stdout)["swap_kind"] == "restart"
    assert recorder.requests == [
        ({"name": "rm-b", "path": "/ckpts/b"}, "Bearer admin-token"),
        ({"name": "rm-b", "path": "/ckpts/b", "force": True, "model": "rm-a"}, "Bearer admin-token"),
        ({"name": "rm-b", "path": "/ckpts/b"}, "Bearer user-token"),  # no admin token: the user's own
    ]


# --- rmserve serve --lease-idle-s -------------------------------------------------------------


def test_serve_lease_idle_option_reaches_the_server_config(monkeypatch):
    import rmserve.server.http.serve as serve_module

    calls = []
    monkeypatch.setattr(serve_module, "serve", lambda e, s, *, announce=print: calls.append(s) or 0)
    monkeypatch.setattr(serve_module, "configure_logging", lambda level: None)
    runner = CliRunner()
    result = runner.invoke(cli_app, ["serve", "m", "--lease-idle-s", "90.5"])
    assert result.exit_code == 0, result.output
    assert [c.lease_idle_s for c in calls] == [90.5]
    result = runner.invoke(cli_app, ["serve", "m"])
    assert result.exit_code == 0, result.output
    assert calls[-1].lease_idle_s == 600.0  # the default
    bad = runner.invoke(cli_app, ["serve", "m", "--lease-idle-s", "0"])
    assert bad.exit_code == 2
    assert "Invalid value for '--lease-idle-s': 0.0; it must be > 0 seconds" in " ".join(bad.output.split())
    assert len(calls) == 2


def test_a_load_refused_for_pinned_work_alone_prints_the_server_s_message_and_the_force_hint(monkeypatch):
    from rmserve.errors import Conflict
    from rmserve.server.sharing.leases import swap_refusal

    message = swap_refusal("root", FAKE_MODEL, None, {"alice": 2}, 600.0)  # no lease: pinned work alone blocks it

    async def refused(self, *args, **kwargs):
        raise Conflict(message)

    monkeypatch.setattr(RewardClient, "load_checkpoint_reply", refused)
    result = models("http://127.0.0.1:9", "load", "step", "/ckpts/step-1", env={TOKEN_ENV: "root-token", ADMIN_TOKEN_ENV: ""})
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: conflict: checkpoint swap refused for root: pinned work of 1 other user is in flight on model "
        f"'fake-rm' (fingerprint {FAKE_MODEL.fingerprint}): alice: 2 groups; retry once it is done. An admin may "
        "force the swap (force: true), which stops those pinned runs with 409; they keep what they scored and resume "
        "once that fingerprint is served again",
        FORCE_HINT,
    ]

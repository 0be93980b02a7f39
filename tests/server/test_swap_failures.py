"""``POST /v1/models/load`` when the checkpoint cannot be served: refused from its files
(422, before the engine or the scoring gate is touched) or failing half-way through an
in-place reload (the previous weights are reloaded; nothing is scored meanwhile).

Numbers by hand from ``fakes.py``: for ``VALID`` (prompt "hi", responses "yo"/"ya") the base
rewards are 4.55 and 4.41 (``test_app.py``). For ``FRESH`` (prompt "hi", responses "yes"/"no"):
the prompt part ``[1, 4, 104, 105, 2]`` sums to 216, "yes" adds ``[5, 121, 101, 115, 2]`` = 344
and "no" ``[5, 110, 111, 2]`` = 228, so the rewards are 560 % 1000 / 100 = 5.60 and 444 / 100 =
4.44 on ``step-0`` (offset 0). ``FRESH`` is sent only after a failure, so its rewards cannot
come from the result cache: the engine computes them.
"""

from __future__ import annotations

import asyncio
import math

import msgspec
import pytest
from testkit.fakes import FAKE_MODEL, FAKE_WEIGHTS_FILE, ReloadableFakeEngine, write_fake_checkpoint
from rmserve.server.kinds import classifier
from rmserve.server.swaps.state import STATE_KEY
from rmserve.fingerprint import model_fingerprint
from test_app import VALID, error_of, post_score, scrape, wait_until
from test_swap import BASE_REWARDS, load, make_swap_client, model_info, rewards, roots  # noqa: F401 - fixtures

from rmserve import __version__

FRESH = {"groups": [{"id": "g1", "prompt": "hi", "responses": ["yes", "no"]}]}
FRESH_REWARDS = (5.60, 4.44)

NO_TOKENIZER = ("has no tokenizer files (expected one of tokenizer.json, tokenizer_config.json, "
                "special_tokens_map.json, tokenizer.model, vocab.json, merges.txt, added_tokens.json)")


def _two_labels(root):
    write_fake_checkpoint(root / "two-labels", 1.0, num_labels=2)
    return "two-labels", ("checkpoint 'two-labels/config.json': has 2 labels (num_labels/id2label); rmserve reads "
                          "one reward from them: give --label-index I (0 ≤ I < 2) for one label, or --label-weights "
                          "w1,...,w2 for their weighted sum")


def _no_weights(root):
    (write_fake_checkpoint(root / "no-weights", 1.0) / FAKE_WEIGHTS_FILE).unlink()
    return "no-weights", "checkpoint 'no-weights': has no weight files (*.safetensors or *.bin)"


def _no_tokenizer(root):
    (write_fake_checkpoint(root / "no-tokenizer", 1.0) / "tokenizer.json").unlink()
    return "no-tokenizer", f"checkpoint 'no-tokenizer': {NO_TOKENIZER}"


def _swap_samples(samples) -> dict:
    return {key: value for key, value in samples.items() if key[0].startswith("rmserve_checkpoint_swap")}


def _engine_on(original, **kwargs) -> ReloadableFakeEngine:
    """A reloadable fake on ``original`` that reports that folder's real fingerprint (as the
    real engines do), so "the fingerprint is unchanged" after a restore means something."""
    model = msgspec.structs.replace(FAKE_MODEL, fingerprint=model_fingerprint(original, None))
    return ReloadableFakeEngine(checkpoint_dir=str(original), model=model, **kwargs)


# --- refused from the checkpoint's files --------------------------------------------------


@pytest.mark.parametrize("defect", [_two_labels, _no_weights, _no_tokenizer])
async def test_invalid_checkpoint_is_422_while_scoring_goes_on(make_swap_client, roots, defect):
    """The refusal comes while a scoring request is in flight: no drain was attempted (with
    ``swap_drain_timeout_s=0`` a drain would have answered 503 at once), the request is
    answered 200 with the old rewards, and nothing about the served model or the swap
    counters changed."""
    root, original, _ = roots
    name, message = defect(root)
    score_gate = asyncio.Event()
    client, engine = await make_swap_client(engine=_engine_on(original, score_gate=score_gate),
                                            swap_drain_timeout_s=0.0, swap_wait_s=0.0)
    before = await model_info(client)
    swaps_before = _swap_samples(await scrape(client))

    in_flight = asyncio.create_task(post_score(client, VALID))
    await wait_until(lambda: len(engine.calls) == 1)
    status, body = await load(client, "x", root / name)
    assert (status, error_of(body)) == (422, {"type": "invalid_checkpoint", "message": message, "field": "path"})
    assert client.app[STATE_KEY].serving.is_set() and not in_flight.done()

    score_gate.set()
    status, body = await in_flight
    assert status == 200 and tuple(body["results"][0]["rewards"]) == pytest.approx(BASE_REWARDS)
    assert await rewards(client) == pytest.approx(BASE_REWARDS)
    assert await model_info(client) == before  # name, fingerprint, swap_count 0, last_swap_time None
    assert (before.fingerprint, before.swap_count) == (model_fingerprint(original, None), 0)
    assert engine.reloads == [] and engine.resets == 0
    assert _swap_samples(await scrape(client)) == swaps_before


async def test_scoring_is_answered_while_the_files_are_checked(make_swap_client, roots, monkeypatch):
    """A score request sent while the load's file check runs is answered 200 (with
    ``swap_wait_s=0`` a closed gate would have answered 503 at once)."""
    import threading

    root, original, _ = roots
    name, message = _two_labels(root)
    entered, release = threading.Event(), threading.Event()
    real_check = classifier.check_checkpoint  # the classifier kind's swap rules

    def held_check(folder, kind="classifier", *head):
        entered.set()
        release.wait(30)
        return real_check(folder, kind, *head)

    monkeypatch.setattr(classifier, "check_checkpoint", held_check)
    client, engine = await make_swap_client(engine=_engine_on(original), swap_wait_s=0.0)
    loading = asyncio.create_task(load(client, "x", root / name))
    await wait_until(entered.is_set)
    status, body = await post_score(client, FRESH)
    assert status == 200 and tuple(body["results"][0]["rewards"]) == pytest.approx(FRESH_REWARDS)
    release.set()
    status, body = await loading
    assert (status, error_of(body)["type"], error_of(body)["message"]) == (422, "invalid_checkpoint", message)
    assert engine.reloads == []


# --- a failed in-place reload --------------------------------------------------------------


async def _health(client) -> tuple[int, dict, str | None]:
    async with client.get("/health") as resp:
        return resp.status, await resp.json(), resp.headers.get("Retry-After")


async def test_reload_failing_half_way_restores_the_previous_weights(make_swap_client, roots):
    """The reload to ``step-1`` fails after the weights were half replaced (offset NaN); the
    restore reloads ``step-0``. While it runs, health says ``restoring`` and scoring answers
    503; afterwards every reward is ``step-0``'s and the served model is as before."""
    _, original, second = roots
    first_gate, restore_gate = asyncio.Event(), asyncio.Event()
    engine = _engine_on(original, failing_reloads=1, reload_gate=first_gate)
    client, _ = await make_swap_client(engine=engine)
    before = await model_info(client)
    assert await rewards(client) == pytest.approx(BASE_REWARDS)

    swapping = asyncio.create_task(load(client, "step-1", second))
    await wait_until(engine.reload_entered.is_set)
    engine.reload_entered.clear()
    engine.reload_gate = restore_gate  # the restore waits here
    first_gate.set()
    await wait_until(engine.reload_entered.is_set)
    assert engine.reloads == [str(second.resolve()), str(original.resolve())]
    assert math.isnan(engine.reward_offset)  # half-replaced weights in the engine

    assert await _health(client) == (503, {"status": "restoring", "version": __version__}, "5")
    async with client.post("/v1/score", json=FRESH) as resp:
        assert (resp.status, resp.headers["Retry-After"]) == (503, "5")
        assert error_of(await resp.json()) == {
            "type": "engine_not_ready", "field": None,
            "message": "the engine is not ready (status: restoring): a checkpoint reload failed and the previous "
                       "checkpoint's weights are being loaded again; retry later",
        }
    async with client.get("/v1/models") as resp:
        assert resp.status == 503
    assert len(engine.calls) == 1  # only the request before the swap reached the engine

    restore_gate.set()
    status, body = await swapping
    assert (status, error_of(body)["type"]) == (500, "engine_error")
    assert error_of(body)["message"] == (
        "reloading the weights of checkpoint 'step-1' failed (fake reload of 'step-1' failed half-way); the previous "
        f"checkpoint 'step-0' was reloaded and is served again (fingerprint {model_fingerprint(original, None)})"
    )
    assert await _health(client) == (200, {"status": "ready", "version": __version__}, None)
    assert await model_info(client) == before
    for _ in range(2):
        status, reply = await post_score(client, FRESH)
        assert status == 200 and tuple(reply["results"][0]["rewards"]) == pytest.approx(FRESH_REWARDS)
        assert (reply["model"], reply["fingerprint"]) == ("fake-rm", before.fingerprint)
    assert await rewards(client) == pytest.approx(BASE_REWARDS)
    assert len(engine.calls) == 2  # FRESH was computed by the engine (then cached), not by a stale cache
    assert engine.reward_offset == 0.0 and engine.mixed == 0 and engine.resets == 1
    samples = await scrape(client)
    assert samples[("rmserve_checkpoint_swaps_total", (("kind", "reload"), ("outcome", "error")))] == 1
    assert ("rmserve_checkpoint_swaps_total", (("kind", "reload"), ("outcome", "ok"))) not in samples

    # the lock is free and the restored checkpoint is the reference: the next reload works
    status, body = await load(client, "step-1", second)
    assert (status, body["swap_kind"]) == (200, "reload")
    assert await rewards(client, "step-1") == pytest.approx((14.55, 14.41))


async def test_reload_and_restore_both_failing_serves_nothing(make_swap_client, roots):
    _, original, second = roots
    engine = _engine_on(original, failing_reloads=2)
    client, _ = await make_swap_client(engine=engine)
    status, body = await load(client, "step-1", second)
    assert (status, error_of(body)["type"]) == (500, "engine_error")
    assert error_of(body)["message"] == (
        "reloading the weights of checkpoint 'step-1' failed (fake reload of 'step-1' failed half-way); reloading "
        "the previous checkpoint 'step-0' failed too (fake reload of 'step-0' failed half-way); no model is "
        "served: restart the server"
    )
    assert engine.reloads == [str(second.resolve()), str(original.resolve())]
    assert await _health(client) == (503, {"status": "failed", "version": __version__}, "5")
    status, body = await post_score(client, FRESH)
    assert (status, error_of(body)["type"]) == (503, "engine_not_ready")
    assert len(engine.calls) == 0
    async with client.get("/v1/models") as resp:
        assert resp.status == 503


async def test_failed_reload_from_a_model_that_is_not_a_folder_serves_nothing(make_swap_client, roots):
    """Without a local folder of the served model there is nothing to reload: the possibly
    mixed weights are not served."""
    _, _, second = roots
    engine = ReloadableFakeEngine(checkpoint_dir=None, failing_reloads=1)
    client, _ = await make_swap_client(engine=engine)
    status, body = await load(client, "step-1", second)
    assert (status, error_of(body)["type"]) == (500, "engine_error")
    assert error_of(body)["message"] == (
        "reloading the weights of checkpoint 'step-1' failed (fake reload of 'step-1' failed half-way); the engine "
        "may hold partly replaced weights and the previous model is not a local checkpoint folder, so it cannot "
        "be reloaded; no model is served: restart the server"
    )
    assert engine.reloads == [str(second.resolve())]
    assert (await _health(client))[:2] == (503, {"status": "failed", "version": __version__})
    status, body = await post_score(client, VALID)
    assert (status, error_of(body)["type"]) == (503, "engine_not_ready")

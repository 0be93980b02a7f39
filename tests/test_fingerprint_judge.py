"""The judge fingerprint: the documented hash, and every verdict-changing setting changes it."""

from __future__ import annotations

import hashlib

import pytest

from rmserve.fingerprint import FINGERPRINT_HEX_CHARS, dpo_fingerprint, judge_fingerprint
from rmserve.schema import JudgeSampling


def _by_hand(
    model: str, protocol: str, max_tokens: str, seed: str, compat: str, system_prompt: str, *sampling: tuple[str, str],
    thinking: str | None = None,
) -> str:
    digest = hashlib.sha256()
    fields = (("kind", "judge"), ("model", model), ("protocol", protocol), ("max_tokens", max_tokens),
              ("seed", seed), ("compat", compat), ("system_prompt", system_prompt), ("readers", "2"))
    if thinking is not None:
        fields += (("thinking", thinking),)
    fields += sampling
    for label, value in fields:
        data = value.encode()
        digest.update(label.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()[:FINGERPRINT_HEX_CHARS]


def test_judge_fingerprint_is_the_documented_hash():
    assert judge_fingerprint("m" * 16, protocol="auto", max_tokens=32, seed=0) == _by_hand(
        "m" * 16, "auto", "32", "0", "none", "1"
    )
    assert judge_fingerprint(
        "m" * 16, protocol="ratings", max_tokens=2048, seed=7, compat="official", system_prompt=False
    ) == _by_hand("m" * 16, "ratings", "2048", "7", "official", "0")
    assert judge_fingerprint("m" * 16, protocol="auto", max_tokens=32, seed=0, thinking="off") == _by_hand(
        "m" * 16, "auto", "32", "0", "none", "1", thinking="off"
    )


def test_the_readers_version_is_hashed():
    """Version 2 of the readers (verdicts from the concluding statement, after the reasoning)
    gives every judge a new fingerprint: scores read by the version-1 rules are not resumed."""
    version_1 = hashlib.sha256()
    for label, value in (("kind", "judge"), ("model", "m" * 16), ("protocol", "auto"), ("max_tokens", "32"),
                         ("seed", "0"), ("compat", "none"), ("system_prompt", "1")):
        data = value.encode()
        version_1.update(label.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    assert judge_fingerprint("m" * 16, protocol="auto", max_tokens=32, seed=0) != version_1.hexdigest()[:16]


def test_the_fingerprint_covers_the_sampling_and_keeps_its_greedy_value():
    # Greedy (temperature 0, top_p 1) adds no section: every judge fingerprint made before the
    # sampling was recorded (all greedy) keeps its value.
    greedy = judge_fingerprint("m" * 16, protocol="auto", max_tokens=32, seed=0, sampling=JudgeSampling(max_tokens=32))
    assert greedy == judge_fingerprint("m" * 16, protocol="auto", max_tokens=32, seed=0) == _by_hand(
        "m" * 16, "auto", "32", "0", "none", "1"
    )
    hot = judge_fingerprint("m" * 16, protocol="auto", max_tokens=32, seed=0, sampling=JudgeSampling(0.7, 1.0, 32))
    assert hot == _by_hand("m" * 16, "auto", "32", "0", "none", "1", ("temperature", "0.7"), ("top_p", "1.0"))
    nucleus = judge_fingerprint("m" * 16, protocol="auto", max_tokens=32, seed=0, sampling=JudgeSampling(0.0, 0.9, 32))
    assert nucleus == _by_hand("m" * 16, "auto", "32", "0", "none", "1", ("temperature", "0.0"), ("top_p", "0.9"))
    assert len({greedy, hot, nucleus}) == 3


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(temperature=-0.1), "temperature: -0.1 must be ≥ 0"),
    (dict(top_p=0.0), "top_p: 0.0 must lie in (0, 1]"),
    (dict(top_p=1.5), "top_p: 1.5 must lie in (0, 1]"),
    (dict(temperature=float("nan")), "temperature: nan must be a finite number"),
    (dict(max_tokens=0), "max_tokens: 0 must be an integer ≥ 1"),
])
def test_sampling_outside_its_range_is_refused(kwargs, message):
    with pytest.raises(ValueError) as caught:
        JudgeSampling(**kwargs)
    assert str(caught.value) == message


def test_every_setting_changes_the_judge_fingerprint():
    base = dict(protocol="auto", max_tokens=32, seed=0, compat="none", system_prompt=True)
    variants = [
        ("model", "n" * 16),
        ("protocol", "ranking"),
        ("protocol", "ratings"),
        ("protocol", "pairwise"),
        ("max_tokens", 33),
        ("seed", 1),
        ("compat", "official"),
        ("system_prompt", False),
        ("thinking", "on"),
        ("thinking", "off"),
    ]
    prints = {judge_fingerprint("m" * 16, **base)}
    for name, value in variants:
        if name == "model":
            prints.add(judge_fingerprint(value, **base))
        else:
            prints.add(judge_fingerprint("m" * 16, **{**base, name: value}))
    assert len(prints) == 1 + len(variants)
    assert "m" * 16 not in prints
    assert dpo_fingerprint("m" * 16, None, "avg") not in prints
    assert all(len(p) == FINGERPRINT_HEX_CHARS for p in prints)


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(protocol="", max_tokens=1, seed=0), "needs the model's fingerprint and the protocol"),
    (dict(protocol="auto", max_tokens=0, seed=0), r"max_tokens \(0\) must be ≥ 1"),
    (dict(protocol="auto", max_tokens=1, seed=-1), r"seed \(-1\) ≥ 0"),
])
def test_bad_inputs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        judge_fingerprint("m" * 16, **kwargs)

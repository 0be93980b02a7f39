"""The judge fingerprint: the documented hash, and every verdict-changing setting changes it."""

from __future__ import annotations

import hashlib

import pytest

from rmserve.fingerprint import FINGERPRINT_HEX_CHARS, dpo_fingerprint, judge_fingerprint


def _by_hand(model: str, protocol: str, max_tokens: str, seed: str, compat: str, system_prompt: str) -> str:
    digest = hashlib.sha256()
    fields = (("kind", "judge"), ("model", model), ("protocol", protocol), ("max_tokens", max_tokens),
              ("seed", seed), ("compat", compat), ("system_prompt", system_prompt))
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

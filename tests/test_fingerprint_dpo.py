"""The DPO fingerprint: every input changes it, and it is reproducible."""

from __future__ import annotations

import hashlib

import pytest

from rmserve.fingerprint import FINGERPRINT_HEX_CHARS, dpo_fingerprint


def _by_hand(policy: str, reference: str, mode: str, compat: str) -> str:
    digest = hashlib.sha256()
    for label, value in (("kind", "dpo"), ("policy", policy), ("reference", reference), ("mode", mode), ("compat", compat)):
        data = value.encode()
        digest.update(label.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()[:FINGERPRINT_HEX_CHARS]


def test_dpo_fingerprint_is_the_documented_hash():
    assert dpo_fingerprint("p" * 16, "r" * 16, "reference") == _by_hand("p" * 16, "r" * 16, "reference", "none")
    assert dpo_fingerprint("p" * 16, None, "norm", "official") == _by_hand("p" * 16, "", "norm", "official")


def test_every_input_changes_the_dpo_fingerprint():
    prints = {
        dpo_fingerprint("p" * 16, "r" * 16, "reference"),
        dpo_fingerprint("q" * 16, "r" * 16, "reference"),
        dpo_fingerprint("p" * 16, "s" * 16, "reference"),
        dpo_fingerprint("p" * 16, "r" * 16, "reference", "official"),
        dpo_fingerprint("p" * 16, None, "avg"),
        dpo_fingerprint("p" * 16, None, "sum"),
        dpo_fingerprint("p" * 16, None, "norm"),
    }
    assert len(prints) == 7
    assert "p" * 16 not in prints


@pytest.mark.parametrize(("reference", "mode", "word"), [(None, "reference", "needs"), ("r" * 16, "avg", "takes no")])
def test_reference_must_match_the_mode(reference, mode, word):
    with pytest.raises(ValueError, match=f"reference: mode '{mode}' {word} reference fingerprint"):
        dpo_fingerprint("p" * 16, reference, mode)

"""Judge records validate on construction and on decode."""

from __future__ import annotations

import msgspec
import pytest

from rmserve.judge_records import JudgeCall, JudgeGroupResult, JudgeParse


def test_parse_reason_must_match_the_value():
    assert JudgeParse("rb2-rating", "ok", rating=10).ok
    assert not JudgeParse("rb2-rating", "truncated").ok
    with pytest.raises(ValueError, match="reason is 'ok'"):
        JudgeParse("rb2-rating", "ok")
    with pytest.raises(ValueError, match="reason is 'no_verdict'"):
        JudgeParse("rb2-ranking-official", "no_verdict", verdict="A")
    with pytest.raises(ValueError, match=r"rating must lie in \[1, 10\], got 11"):
        JudgeParse("rb2-rating", "ok", rating=11)
    with pytest.raises(ValueError, match="reason must be one of"):
        JudgeParse("rb2-rating", "maybe")


def test_call_and_group_limits():
    parse = JudgeParse("rb2-rating", "ok", rating=3)
    with pytest.raises(ValueError, match="protocol"):
        JudgeCall("rb2-pairs", "0" * 64, (0,), "3", parse, 1, 1, "stop")
    with pytest.raises(ValueError, match="completion_tokens=-1"):
        JudgeCall("rb2-rating", "0" * 64, (0,), "3", parse, 1, -1, "stop")
    base = dict(benchmark="rewardbench2", domain="Math", id="1", protocol="rb2-ranking", compat="none",
                num_chosen=1, calls=())
    with pytest.raises(ValueError, match=r"credit must lie in \[0, 1\], got 1.5"):
        JudgeGroupResult(**base, credit=1.5)
    with pytest.raises(ValueError, match=r"position must lie in \[0, 3\], got 4"):
        JudgeGroupResult(**base, credit=1.0, position=4)
    with pytest.raises(ValueError, match="compat must be one of"):
        JudgeGroupResult(**{**base, "compat": "strict"}, credit=1.0)
    with pytest.raises(ValueError, match=r"thinking must be one of \('on', 'off'\) or None, got 'maybe'"):
        JudgeGroupResult(**base, credit=1.0, thinking="maybe")
    assert JudgeGroupResult(**base, credit=1.0, thinking="on").thinking == "on"
    assert not JudgeParse("rb2-ranking", "ambiguous_verdict", candidates=("B", "C")).ok
    assert not JudgeParse("rmbench-pairwise", "unfinished_reasoning").ok
    with pytest.raises(ValueError, match="cells must hold 9 values"):
        JudgeGroupResult(**{**base, "benchmark": "rm-bench", "protocol": "rmbench-pairwise"}, cells=(0.5,) * 8)


def test_decode_validates_too():
    bad = b'{"parser":"rb2-rating","reason":"ok","rating":0}'
    with pytest.raises(msgspec.ValidationError, match="rating must lie"):
        msgspec.json.decode(bad, type=JudgeParse)

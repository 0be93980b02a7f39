"""What the head tests read back from an ``rmserve run --only chat`` on RM-Bench: its records,
and a dozen chat groups rendered as the server renders them, to compare against an independent
forward pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from rmserve.datasets import load_rmbench
from rmserve.schema import Group, GroupKey, RequestGroup, ScoreRecord


def chat_run_sample(out: Path, rmbench: Path, renderer: Any) -> tuple[dict[GroupKey, ScoreRecord], list[Group], list[list[int]]]:
    """``(records by key, sample, token ids)`` of the run written to ``out``.

    Asserts the run scored every chat group of ``rmbench``. The sample is every
    ``len(chat) // 12``-th chat group; the token ids are its responses' sequences as ``renderer``
    (the served model's :class:`~rmserve.server.render.chat.Renderer`) renders them, group by
    group, in response order.
    """
    records = [msgspec.json.decode(line, type=ScoreRecord) for line in (out / "scores.jsonl").read_bytes().splitlines()]
    chat = [g for g in load_rmbench(rmbench).groups if g.key.domain == "chat"]
    assert len(records) == len(chat)
    sample = chat[:: len(chat) // 12]
    rendered = renderer.render_groups([RequestGroup(id=str(g.key), responses=g.responses, messages=g.messages)
                                       for g in sample])
    return {r.key: r for r in records}, sample, [ids for g in rendered for ids in g.token_ids]

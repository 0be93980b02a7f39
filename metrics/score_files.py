"""Score files → validated metric arrays (the score sets of :mod:`rmserve.metrics.scores`).

Three formats are read, detected from the fields of each record:

``score-records``
    rmserve's own store: JSONL, one :class:`rmserve.schema.ScoreRecord` per line (decoded with
    msgspec; a ``None`` reward becomes NaN).
``rm-bench-results``
    the official RM-Bench result file: a JSON list (or JSONL) of records with ``id``,
    ``score_chosen`` (3 numbers) and ``score_rejected`` (3 numbers), in style order concise,
    detailed plain, detailed markdown, plus ``domain`` when the file covers several domains.
    A file without ``domain`` takes it from the ``domain`` argument (``--domain``) or else
    from a file name starting with the domain (``chat_results.json``, ``safety-refuse.json``).
``rewardbench2-items``
    RewardBench 2 per-item results: JSONL whose optional first line is a
    ``{"_record": "metadata", …}`` line, then records with ``id``, ``subset``,
    ``num_correct`` and ``scores`` (one score per completion, each a one-element list or a
    number; correct completions first).

Several files are concatenated into one score set; they must hold one benchmark, and a group
key (benchmark, domain or subset, id) may appear only once, with one exception: inside one
RewardBench 2 file, an id repeated outside Ties is accepted with a warning (the per-item files
published by the benchmark's authors relabel the first ten Factuality ids 0–9 as 30–39; the
official figures outside Ties are means over items that never use ids, so they are computed
from every record). Every problem raises :class:`rmserve.errors.DataError` naming the file,
the line (for a JSON list: the line where the record starts), the id when known and the field.

What the readers accept, as the official harnesses write it:

- the literals ``NaN``, ``Infinity``, ``-Infinity`` and numbers beyond the double range
  (``1e999`` → inf) that Python's ``json.dump`` writes: values are read as the harness held
  them, and the metrics compare them as the official code does (NaN loses every strict
  comparison, +inf beats every finite reward);
- a UTF-8 byte-order mark at the start of a file;
- a torn last JSONL line (no newline after it and not valid JSON: a writer killed mid-line),
  which is dropped with a warning naming file, line and bytes. An undecodable line anywhere
  else is an error.

Warnings travel with the score set (``warnings``) into the report, and so does what kind of
score the records hold (``score_kind``: classifier, or DPO with its mode, reference and compat;
None for the official formats, which do not say). Score records of one score set must agree on
it.

Generative judges: score records of kind ``judge`` carry the judge's record of the group
(``judge``, a :class:`~rmserve.judge_records.JudgeGroupResult`), collected per row into the
score set's ``judge`` column; the figures come from it (:mod:`rmserve.metrics.judge`). Their
``judge_sampling`` and ``judge_engine`` give the score set's ``judge_setup``: records that
state different ones are refused, records that state none (written before rmserve recorded
them) are counted as unknown (:mod:`rmserve.metrics.judge_setup`). A
judge record must name its own group and ``num_chosen`` and use a protocol of that benchmark
and subset; a judge's score record without one must carry ``errors`` (the judge could not take
the group) and is counted as an unscored group. Judge records cannot share a score set with
records of another kind (classifier, DPO) or with the official result formats: the error
names the record and says so; ``dpo_reward`` does not apply to them.

DPO rewards: with ``dpo_reward`` (``avg``, ``sum``, ``norm`` or ``reference``) the rewards of
``score-records`` are recomputed from each record's ``extras`` by
:func:`rmserve.metrics.dpo.dpo_rewards` instead of taken from ``rewards`` (a response without a
reward keeps none); ``reward`` of the score set says which was used. A record without the
extras needed, or with a null one for a response that has a reward (e.g. no ``ref_logp`` in a
reference-free run), is an error naming the field.

A reward from the extras: with ``reward_extra`` NAME the rewards of ``score-records`` are the
extras NAME of each response instead of ``rewards`` (e.g. ``objective_2``, one objective of a
multi-objective head such as ArmoRM's, kept by the ``remote-code`` head); ``reward`` of the
score set is ``extra:NAME``. A record without that extra, a value that is not a number, or a
null one for a response that has a reward, is an error naming the field; ``dpo_reward`` and
``reward_extra`` exclude each other.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson

from rmserve.datasets import RB2_TIES_ID, TornLine, loads_json, strip_bom
from rmserve.errors import DataError, field_path, validation_reason
from rmserve.metrics.dpo import DPO_EXTRAS_NEEDED, DPO_REWARD_FORMULAS, DPO_REWARDS, dpo_rewards
from rmserve.metrics.judge_setup import SetupCollector
from rmserve.metrics.rewardbench2 import TIES
from rmserve.metrics.scores import JUDGE_KIND, SCORED_REWARDS, RB2Scores, RMBenchScores, ScoreSet, read_only
from rmserve.judge_records import JudgeGroupResult
from rmserve.schema import BENCHMARKS, RB2_SUBSETS, RMBENCH_DOMAINS, RMBENCH_STYLES, ScoreKind, ScoreRecord

FORMATS: tuple[str, ...] = ("score-records", "rm-bench-results", "rewardbench2-items")
"""Score-file formats, in detection order."""

RB2_NON_TIES_COMPLETIONS = 4
"""Completions per non-Ties RewardBench 2 group (1 chosen, 3 rejected)."""

_FORMAT_BENCHMARK = {"rm-bench-results": "rm-bench", "rewardbench2-items": "rewardbench2"}


# --- external record layouts (validated by msgspec) -------------------------------------


class _RMBenchResultRow(msgspec.Struct):
    """One record of the official RM-Bench result file (other fields are ignored)."""

    id: str | int
    score_chosen: list[float]
    score_rejected: list[float]
    domain: str | None = None


class _RB2Item(msgspec.Struct):
    """One per-item record of the official RewardBench 2 results (other fields are ignored)."""

    id: str | int
    subset: str
    num_correct: int
    scores: list[list[float] | float]


_STRUCTS: dict[str, type[msgspec.Struct]] = {
    "score-records": ScoreRecord,
    "rm-bench-results": _RMBenchResultRow,
    "rewardbench2-items": _RB2Item,
}


# --- collection -------------------------------------------------------------------------


@dataclass
class _Rows:
    """Validated rows of one benchmark, accumulated across files."""

    benchmark: str | None = None
    first_file: str | None = None
    domains: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    rewards: list[list[float]] = field(default_factory=list)
    num_correct: list[int] = field(default_factory=list)
    seen: dict[tuple[str, str], _Where] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    repeated: list[tuple[str, str, _Where, _Where]] = field(default_factory=list)
    """Keys repeated inside one file outside Ties: (subset, id, first place, this place)."""
    files_may_repeat_ids: bool = False
    """Whether an id repeated outside Ties inside one RewardBench 2 file is accepted (files only)."""
    dpo_reward: str | None = None
    """The DPO reward to recompute from the extras (see :mod:`rmserve.metrics.dpo`), or None."""
    reward_extra: str | None = None
    """The extras name whose values are the rewards (``--reward-extra``), or None."""
    extras: dict[str, list[list[float]]] = field(default_factory=dict)
    """Extras name → one row per record (parallel to ``rewards``), when ``dpo_reward`` or
    ``reward_extra`` is set."""
    score_kind: ScoreKind | None = None
    kind_where: _Where | None = None
    """Where the first score record (whose ``score_kind`` the others must share) was read."""
    models: dict[tuple[str, str], None] = field(default_factory=dict)
    """The distinct (model name, fingerprint) pairs of score records, in order of first appearance."""
    heads: dict[str, None] = field(default_factory=dict)
    """The distinct reward heads the score records' scorers name (:meth:`RewardHead.describe`), in order."""
    judge: list[JudgeGroupResult | None] = field(default_factory=list)
    """Per row its judge record (score records of kind ``judge``; None elsewhere)."""
    setup: SetupCollector = field(default_factory=SetupCollector)
    """The judge's sampling and engine as the judge score records state them."""


@dataclass(frozen=True)
class _Where:
    """Where a record sits: file, line (JSONL) or element index (JSON list), and its id."""

    path: str
    line: int | None = None
    record_id: str | None = None
    element: int | None = None
    raw: bytes | None = field(default=None, repr=False, compare=False)

    def line_number(self) -> int | None:
        """The 1-based line; for a JSON list computed from the text only when needed."""
        if self.line is None and self.element is not None and self.raw is not None:
            return _element_line(self.raw, self.element)
        return self.line

    def describe(self) -> str:
        line = self.line_number()
        return f"{self.path} line {line}" if line is not None else self.path

    def error(self, message: str, field_name: str | None = None, value: Any = None, limit: Any = None) -> DataError:
        return DataError(
            message,
            path=self.path,
            line=self.line_number(),
            record_id=self.record_id,
            field=field_name,
            value=value,
            limit=limit,
        )


def _classify(record: dict[str, Any]) -> str | None:
    """The format a record belongs to, ``"metadata"``, or None when unrecognised."""
    if "_record" in record:
        return "metadata"
    if "rewards" in record and "benchmark" in record:
        return "score-records"
    if "score_chosen" in record or "score_rejected" in record:
        return "rm-bench-results"
    if "scores" in record and "subset" in record:
        return "rewardbench2-items"
    return None


def _validation_error(exc: msgspec.ValidationError, where: _Where) -> DataError:
    """Turn a msgspec validation message into a DataError naming the field path."""
    message = validation_reason(exc)
    if message.startswith("Object missing required field"):
        message = "missing"
    return where.error(message, field_path(exc))


def _domain_from_name(name: str) -> str | None:
    """The RM-Bench domain a file name starts with (``chat_results.json`` → ``chat``)."""
    for domain in sorted(RMBENCH_DOMAINS, key=len, reverse=True):
        if name.startswith(domain) and (len(name) == len(domain) or not name[len(domain)].isalnum()):
            return domain
    return None


_JSON_TOKEN = re.compile(rb'"(?:[^"\\\n]|\\.)*"|[\[\]{},\n]')


def _element_line(raw: bytes, index: int) -> int | None:
    """1-based line where element ``index`` of the top-level JSON array in ``raw`` starts."""
    depth, line, element, expecting = 0, 1, -1, False
    for match in _JSON_TOKEN.finditer(raw):
        token = match.group()[:1]
        if token == b"\n":
            line += 1
            continue
        if depth == 1 and expecting and token not in (b",", b"]"):
            element += 1
            expecting = False
            if element == index:
                return line
        if token in (b"[", b"{"):
            expecting = expecting or depth == 0
            depth += 1
        elif token in (b"]", b"}"):
            depth -= 1
        elif token == b"," and depth == 1:
            expecting = True
    return None


def _iter_records(path: Path, warnings: list[str]) -> Iterator[tuple[_Where, Any]]:
    """Yield (location, decoded JSON value) for each record of a JSON-list or JSONL file.

    A leading UTF-8 byte-order mark is skipped. JSON accepts Python's ``NaN``/``Infinity``
    literals (:func:`rmserve.datasets.loads_json`). A torn last JSONL line (no newline, not
    valid JSON) is dropped and reported in ``warnings``; an undecodable line anywhere else is
    an error.
    """
    name = str(path)
    if not path.is_file():
        raise DataError("no such file", path=name)
    raw, _ = strip_bom(path.read_bytes())
    if raw.lstrip()[:1] == b"[":
        try:
            items = loads_json(raw)
        except orjson.JSONDecodeError as exc:
            raise DataError(f"invalid JSON ({exc.msg})", path=name, line=exc.lineno) from None
        for index, item in enumerate(items):
            yield _Where(name, element=index, raw=raw), item
        return
    lines = raw.split(b"\n")
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = loads_json(line)
        except orjson.JSONDecodeError as exc:
            if lineno == len(lines):  # the last piece has no newline after it
                warnings.append(TornLine(name, lineno, len(line)).message("the figures cover the records before it"))
                return
            raise DataError(f"invalid JSON ({exc.msg})", path=name, line=lineno) from None
        yield _Where(name, lineno), value


def _with_id(where: _Where, record_id: str) -> _Where:
    return replace(where, record_id=record_id)


def _check_id(value: Any, where: _Where) -> str:
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not text:
        raise where.error("missing or empty", "id")
    return text


def _float_row(values: Sequence[float | None]) -> list[float]:
    return [np.nan if v is None else float(v) for v in values]


def _rmbench_row(rows: _Rows, domain: str, record_id: str, rewards: list[float], where: _Where) -> None:
    if domain not in RMBENCH_DOMAINS:
        raise where.error(
            f"unknown RM-Bench domain {domain!r}; expected one of {', '.join(RMBENCH_DOMAINS)}", "domain", value=domain
        )
    _add(rows, domain, record_id, rewards, 3, where)


def _rb2_row(
    rows: _Rows, subset: str, record_id: str, num_correct: int, scores: list[float], where: _Where, scores_field: str
) -> None:
    if subset not in RB2_SUBSETS:
        raise where.error(
            f"unknown RewardBench 2 subset {subset!r}; expected one of {', '.join(RB2_SUBSETS)}", "subset", value=subset
        )
    count_field = "num_chosen" if scores_field == "rewards" else "num_correct"
    if subset == TIES:
        if not RB2_TIES_ID.match(record_id):
            raise where.error("Ties ids must be 'ref:<n>' or 'tied:<n>'", "id", value=record_id)
        if len(scores) < 2:
            raise where.error(
                f"must hold at least 2 scores, got {len(scores)}", scores_field, value=len(scores), limit=2
            )
        if not 1 <= num_correct < len(scores):
            raise where.error(
                f"must lie in [1, {len(scores) - 1}] (at least one incorrect completion), got {num_correct}",
                count_field,
                value=num_correct,
            )
    else:
        if num_correct != 1:
            raise where.error(
                f"must be 1 outside the Ties subset, got {num_correct}", count_field, value=num_correct, limit=1
            )
        if len(scores) != RB2_NON_TIES_COMPLETIONS:
            raise where.error(
                f"must hold {RB2_NON_TIES_COMPLETIONS} scores (1 chosen, 3 rejected), got {len(scores)}",
                scores_field,
                value=len(scores),
                limit=RB2_NON_TIES_COMPLETIONS,
            )
    _add(rows, subset, record_id, scores, num_correct, where)


def _add(rows: _Rows, domain: str, record_id: str, rewards: list[float], num_correct: int, where: _Where) -> None:
    key = (domain, record_id)
    first = rows.seen.get(key)
    if first is not None:
        same_file = first.path == where.path
        if rows.files_may_repeat_ids and rows.benchmark == "rewardbench2" and domain != TIES and same_file:
            # The official figures outside Ties are means over items and never look at ids,
            # so a file with a repeated id still has its official figures: keep both records.
            rows.repeated.append((domain, record_id, first, where))
        else:
            why = "; Ties pairs its rows by prompt id, so each id may appear once" if domain == TIES else ""
            raise where.error(
                f"duplicate group key ({rows.benchmark}, {domain}, {record_id}); first seen at {first.describe()}{why}",
                "id",
            )
    else:
        rows.seen[key] = where
    rows.domains.append(domain)
    rows.ids.append(record_id)
    rows.rewards.append(rewards)
    rows.num_correct.append(num_correct)
    rows.judge.append(None)


MAX_NAMED_KEYS = 20
"""At most this many repeated keys are listed in a warning (then a count of the rest)."""


def _repeated_keys_warning(path: str, repeated: Sequence[tuple[str, str, _Where, _Where]]) -> str:
    """The warning for group keys repeated inside one RewardBench 2 file (outside Ties)."""
    named = [
        f"{subset}/{record_id} (lines {first.line_number()} and {again.line_number()})"
        for subset, record_id, first, again in repeated[:MAX_NAMED_KEYS]
    ]
    more = f" and {len(repeated) - MAX_NAMED_KEYS} more" if len(repeated) > MAX_NAMED_KEYS else ""
    return (
        f"{path}: {len(repeated)} record(s) repeat the group key of an earlier record: {', '.join(named)}{more}. "
        "Every record is counted, as the official RewardBench 2 code does (its figures outside Ties do not use ids); "
        "'metrics compare' pairs groups by key and refuses this file until the ids are unique."
    )


def _check_score_kind(rows: _Rows, record: ScoreRecord, where: _Where) -> None:
    """The record's kind of score must be the one of the score set's first record."""
    kind = record.score_kind
    if record.kind != JUDGE_KIND and record.judge is not None:
        raise where.error(
            f"a judge record in a score record of kind {record.kind!r}; only kind 'judge' has one", "judge"
        )
    if rows.score_kind is None:
        if record.kind == JUDGE_KIND and rows.ids:
            raise where.error(
                f"judge score records cannot be mixed with official result records ({rows.first_file}): a judge's "
                "figures come from its verdicts, the others' from rewards; give files of one kind of score",
                "kind",
                value=record.kind,
            )
        chosen = (f"--dpo-reward {rows.dpo_reward} recomputes a DPO run's rewards" if rows.dpo_reward is not None
                  else f"--reward-extra {rows.reward_extra} reads rewards from the extras"
                  if rows.reward_extra is not None else None)
        if record.kind == JUDGE_KIND and chosen is not None:
            raise where.error(
                f"{chosen}; these are a generative judge's scores, whose figures come from its verdicts",
                "kind",
                value=record.kind,
            )
        rows.score_kind, rows.kind_where = kind, where
        return
    if kind.kind != rows.score_kind.kind and JUDGE_KIND in (kind.kind, rows.score_kind.kind):
        assert rows.kind_where is not None
        raise where.error(
            f"mixed kinds of score: this record is {kind.describe()}, {rows.kind_where.describe()} is "
            f"{rows.score_kind.describe()}; a judge's figures come from its verdicts and the others' from rewards, "
            "so one score set holds one kind: give the judge's score files on their own",
            "kind",
            value=kind.kind,
        )
    if kind != rows.score_kind:
        assert rows.kind_where is not None
        name = next(
            n for n in ("kind", "mode", "ref_model", "compat") if getattr(kind, n) != getattr(rows.score_kind, n)
        )
        raise where.error(
            f"scores of another kind ({kind.describe()}) than those of {rows.kind_where.describe()} "
            f"({rows.score_kind.describe()}); give score files of one kind of score",
            name,
            value=getattr(kind, name),
        )


def _collect_extra(rows: _Rows, record: ScoreRecord, where: _Where, name: str, *, needed_by: str,
                   no_value: str) -> None:
    """Check the record's extras ``name`` (present, one number or null per response, a number
    wherever the response has a reward) and add them as a row of ``rows.extras[name]``.

    ``needed_by`` says which option reads them (the message of a missing extra goes on with
    what the record has); ``no_value`` is the message of a null for a scored response.
    """
    extras = record.extras or {}
    values = extras.get(name)
    if values is None:
        raise where.error(
            f"missing: {needed_by}; this record ({record.score_kind.describe()}) has "
            f"{'none' if not extras else 'only ' + ', '.join(sorted(extras))}",
            f"extras.{name}",
        )
    if len(values) != len(record.rewards):
        raise where.error(
            f"holds {len(values)} values for {len(record.rewards)} responses",
            f"extras.{name}",
            value=len(values),
            limit=len(record.rewards),
        )
    row = []
    for j, (value, scored) in enumerate(zip(values, record.rewards, strict=True)):
        if isinstance(value, bool) or not isinstance(value, (int, float, type(None))):
            raise where.error(f"must be a number or null, got {value!r}", f"extras.{name}[{j}]", value=value)
        if value is None and scored is not None:
            raise where.error(no_value, f"extras.{name}[{j}]")
        row.append(np.nan if value is None else float(value))
    rows.extras.setdefault(name, []).append(row)


def _named_extra(rows: _Rows, record: ScoreRecord, where: _Where) -> None:
    """Check and collect the extras ``rows.reward_extra`` (the rewards the figures use), for one record."""
    name = rows.reward_extra
    assert name is not None
    _collect_extra(
        rows, record, where, name,
        needed_by=f"--reward-extra {name} reads each response's reward from the extras {name}",
        no_value=f"null for a response that has a reward: --reward-extra {name} has no value for it",
    )


def _dpo_extras(rows: _Rows, record: ScoreRecord, where: _Where) -> None:
    """Check and collect the extras ``rows.dpo_reward`` is computed from, for one record."""
    reward = rows.dpo_reward
    assert reward is not None
    for name in DPO_EXTRAS_NEEDED[reward]:
        why = (f"; the scores were made without a reference model ({record.score_kind.describe()})"
               if name == "ref_logp" else "")
        _collect_extra(
            rows, record, where, name,
            needed_by=f"--dpo-reward {reward} computes {DPO_REWARD_FORMULAS[reward]} from the extras a DPO run stores",
            no_value=f"null for a response that has a reward: --dpo-reward {reward} cannot be computed{why}",
        )


def _score_record(rows: _Rows, record: ScoreRecord, where: _Where) -> None:
    """Validate one ScoreRecord (benchmark already checked) and add its row."""
    record_id = _check_id(record.id, where)
    where = _with_id(where, record_id)
    _check_score_kind(rows, record, where)
    rewards = _float_row(record.rewards)
    if record.model or record.fingerprint:
        rows.models.setdefault((record.model, record.fingerprint))
    if record.scorer is not None and record.scorer.head is not None:
        rows.heads.setdefault(record.scorer.head.describe())
    if record.benchmark == "rm-bench":
        if record.num_chosen != 3:
            raise where.error(
                f"must be 3 for RM-Bench, got {record.num_chosen}", "num_chosen", value=record.num_chosen, limit=3
            )
        if len(rewards) != 6:
            raise where.error(
                f"must hold 6 rewards (3 chosen, 3 rejected), got {len(rewards)}",
                "rewards",
                value=len(rewards),
                limit=6,
            )
        if record.styles is not None and tuple(record.styles) != RMBENCH_STYLES + RMBENCH_STYLES:
            raise where.error(
                f"must be {list(RMBENCH_STYLES + RMBENCH_STYLES)} (chosen then rejected), got {list(record.styles)}",
                "styles",
            )
        _rmbench_row(rows, record.domain, record_id, rewards, where)
    else:
        _rb2_row(rows, record.domain, record_id, record.num_chosen, rewards, where, "rewards")
    if record.kind == JUDGE_KIND:
        rows.judge[-1] = _judge_result(record, record_id, where)
        rows.setup.add(record, where)
    if rows.dpo_reward is not None:
        _dpo_extras(rows, record, where)
    if rows.reward_extra is not None:
        _named_extra(rows, record, where)


def _judge_result(record: ScoreRecord, record_id: str, where: _Where) -> JudgeGroupResult | None:
    """The judge record of a score record of kind ``judge``, checked against the group.

    None when the judge could not take the group: then the record must say why (``errors``)
    and is counted as an unscored group. A judge record for another group, or with another
    ``num_chosen``, is an error.
    """
    judge = record.judge
    if judge is None:
        if record.scored:
            raise where.error(
                "missing: a judge's score record holds the judge's verdicts, or errors saying why the judge could "
                "not take the group; this one has neither",
                "judge",
            )
        return None
    if (judge.benchmark, judge.domain, judge.id) != (record.benchmark, record.domain, record_id):
        raise where.error(
            f"is for group ({judge.benchmark}, {judge.domain}, {judge.id}), not this record's "
            f"({record.benchmark}, {record.domain}, {record_id})",
            "judge",
        )
    if judge.num_chosen != record.num_chosen:
        raise where.error(
            f"num_chosen {judge.num_chosen} differs from the record's {record.num_chosen}",
            "judge.num_chosen",
            value=judge.num_chosen,
        )
    expected = ("rmbench-pairwise",) if record.benchmark == "rm-bench" else (
        ("rb2-rating-ties",) if record.domain == TIES else ("rb2-ranking", "rb2-rating")
    )
    if judge.protocol not in expected:
        raise where.error(
            f"protocol {judge.protocol!r} does not score {record.benchmark} {record.domain}; expected "
            f"{' or '.join(expected)}",
            "judge.protocol",
            value=judge.protocol,
        )
    return judge


def _rmbench_result(rows: _Rows, record: _RMBenchResultRow, where: _Where, fallback_domain: str | None) -> None:
    record_id = _check_id(record.id, where)
    where = _with_id(where, record_id)
    for name in ("score_chosen", "score_rejected"):
        values = getattr(record, name)
        if len(values) != 3:
            raise where.error(
                f"must hold 3 scores (concise, detailed plain, detailed markdown), got {len(values)}",
                name,
                value=len(values),
                limit=3,
            )
    domain = record.domain
    if domain is None:
        domain = fallback_domain
        if domain is None:
            raise where.error("missing; give records a domain, name the file <domain>….json or pass --domain", "domain")
    _rmbench_row(rows, domain, record_id, _float_row(record.score_chosen + record.score_rejected), where)


def _rb2_item(rows: _Rows, record: _RB2Item, where: _Where) -> None:
    record_id = _check_id(record.id, where)
    where = _with_id(where, record_id)
    scores = []
    for k, entry in enumerate(record.scores):
        if isinstance(entry, list):
            if len(entry) != 1:
                raise where.error(f"must be one score or a one-element list, got {len(entry)} elements", f"scores[{k}]")
            entry = entry[0]
        scores.append(float(entry))
    _rb2_row(rows, record.subset, record_id, record.num_correct, scores, where, "scores")


def _read_file(rows: _Rows, path: Path, *, domain: str | None, benchmark: str | None) -> None:
    """Validate every record of one file and append its rows."""
    name = str(path)
    if name in rows.files:
        raise DataError("given twice; give each score file once", path=name, field="files")
    fallback_domain = domain or _domain_from_name(path.name)
    file_format: str | None = None
    file_benchmark: str | None = None
    count = 0
    repeated_before = len(rows.repeated)
    warnings_before = len(rows.warnings)
    for where, value in _iter_records(path, rows.warnings):
        if not isinstance(value, dict):
            raise where.error("each record must be a JSON object")
        kind = _classify(value)
        if kind == "metadata":
            if count or file_format is not None:
                raise where.error("a metadata record may only be the first line", "_record")
            file_format = "metadata"
            continue
        if kind is None:
            raise where.error(
                f"unrecognised score record with fields {sorted(value)[:8]}; expected an rmserve score record "
                "(benchmark, rewards), an RM-Bench result (score_chosen, score_rejected) or a RewardBench 2 item "
                "(subset, scores)"
            )
        if rows.reward_extra is not None and kind != "score-records":
            raise where.error(
                f"is a {kind} record, which has no extras: --reward-extra {rows.reward_extra} needs rmserve score "
                "records",
                "extras",
            )
        if rows.dpo_reward is not None and kind != "score-records":
            raise where.error(
                f"is a {kind} record, which has no DPO extras: --dpo-reward {rows.dpo_reward} needs rmserve score "
                "records of a DPO run",
                "extras",
            )
        if kind != "score-records" and rows.score_kind is not None and rows.score_kind.kind == JUDGE_KIND:
            raise where.error(
                f"is a {kind} record, which cannot be mixed with the judge score records of {rows.first_file}: a "
                "judge's figures come from its verdicts, the others' from rewards; give files of one kind of score",
                "kind",
            )
        record_benchmark = value.get("benchmark") if kind == "score-records" else _FORMAT_BENCHMARK[kind]
        if record_benchmark not in BENCHMARKS:
            raise where.error(
                f"unknown benchmark {record_benchmark!r}; expected one of {', '.join(BENCHMARKS)}", "benchmark"
            )
        if file_benchmark is None:
            file_benchmark = record_benchmark
            if benchmark is not None and record_benchmark != benchmark:
                raise where.error(
                    f"holds {record_benchmark} scores, but {benchmark} scores were asked for", "benchmark"
                )
            if rows.benchmark is not None and record_benchmark != rows.benchmark:
                raise where.error(
                    f"holds {record_benchmark} scores, but {rows.first_file} holds {rows.benchmark}; "
                    "give files of one benchmark",
                    "benchmark",
                )
        elif record_benchmark != file_benchmark:
            raise where.error(
                f"two benchmarks in one file: this record is {record_benchmark}, earlier ones are {file_benchmark}",
                "benchmark",
            )
        if file_format in (None, "metadata"):
            file_format = kind
        elif kind != file_format:
            raise where.error(f"two formats in one file: this record is {kind}, earlier ones are {file_format}")
        try:
            record = msgspec.convert(value, type=_STRUCTS[kind])
        except msgspec.ValidationError as exc:
            raise _validation_error(exc, where) from None
        rows.benchmark = rows.benchmark or record_benchmark
        rows.first_file = rows.first_file or name
        if kind == "score-records":
            _score_record(rows, record, where)
        elif kind == "rm-bench-results":
            _rmbench_result(rows, record, where, fallback_domain)
        else:
            _rb2_item(rows, record, where)
        count += 1
    if count == 0:
        torn = " (its only line is a truncated write)" if len(rows.warnings) > warnings_before else ""
        raise DataError(f"holds no score records{torn}", path=name)
    if len(rows.repeated) > repeated_before:
        rows.warnings.append(_repeated_keys_warning(name, rows.repeated[repeated_before:]))
    rows.files.append(name)


def _to_scores(rows: _Rows) -> ScoreSet:
    """Arrays of the rows in canonical order (by domain/subset, then id).

    The order of records in a file (e.g. completion order of an evaluation) must not change
    any figure; sorting also makes the bootstrap, which resamples row indices, independent of
    it: the same groups and seed give the same intervals whatever order they were stored in.
    """
    scores = _to_scores_in_file_order(rows)
    return scores.take(np.lexsort((scores.ids, scores.parts)))


def _padded(values: list[list[float]], lengths: np.ndarray) -> np.ndarray:
    """``(n, max(lengths))`` float64: row ``g`` holds ``values[g]``, NaN after ``lengths[g]``."""
    width = int(lengths.max())
    out = np.full((lengths.size, width), np.nan)
    out[np.arange(width) < lengths[:, None]] = np.fromiter(
        (x for r in values for x in r), dtype=np.float64, count=int(lengths.sum())
    )
    return out


def _rewards(rows: _Rows, lengths: np.ndarray) -> tuple[np.ndarray, str]:
    """The reward matrix (NaN-padded) and which reward it holds (``SCORED_REWARDS``,
    ``dpo:<name>`` or ``extra:<name>``)."""
    scored = _padded(rows.rewards, lengths)
    if rows.reward_extra is not None:
        named = _padded(rows.extras[rows.reward_extra], lengths)
        named[np.isnan(scored)] = np.nan  # a response without a reward keeps none
        return named, f"extra:{rows.reward_extra}"
    if rows.dpo_reward is None:
        return scored, SCORED_REWARDS
    parts = {name: _padded(values, lengths) for name, values in rows.extras.items()}
    recomputed = dpo_rewards(rows.dpo_reward, parts)
    recomputed[np.isnan(scored)] = np.nan  # a response without a reward keeps none
    return recomputed, f"dpo:{rows.dpo_reward}"


def _to_scores_in_file_order(rows: _Rows) -> ScoreSet:
    domains = read_only(np.array(rows.domains, dtype=str))
    ids = read_only(np.array(rows.ids, dtype=str))
    lengths = np.fromiter((len(r) for r in rows.rewards), dtype=np.int64, count=len(rows.rewards))
    scores, reward = _rewards(rows, lengths)
    judge = setup = None
    if rows.score_kind is not None and rows.score_kind.kind == JUDGE_KIND:
        judge = np.empty(len(rows.judge), dtype=object)
        judge[:] = rows.judge
        judge = read_only(judge)
        setup = rows.setup.setup()
    common = {
        "files": tuple(rows.files), "warnings": tuple(rows.warnings), "score_kind": rows.score_kind, "reward": reward,
        "models": tuple(rows.models), "heads": tuple(rows.heads), "judge": judge, "judge_setup": setup,
    }
    if rows.benchmark == "rm-bench":
        return RMBenchScores(rewards=read_only(scores.reshape(-1, 6)), domains=domains, ids=ids, **common)
    return RB2Scores(
        scores=read_only(scores),
        lengths=read_only(lengths),
        num_correct=read_only(np.array(rows.num_correct, dtype=np.int64)),
        subsets=domains,
        ids=ids,
        **common,
    )


def _check_reward_choice(dpo_reward: str | None, reward_extra: str | None) -> None:
    """``dpo_reward`` a known name, ``reward_extra`` a non-empty name, not both."""
    if dpo_reward is not None and reward_extra is not None:
        raise DataError(
            f"--dpo-reward {dpo_reward} and --reward-extra {reward_extra} both name the reward the figures use; "
            "give one", field="reward_extra")
    if reward_extra is not None and (not isinstance(reward_extra, str) or not reward_extra):
        raise DataError(f"reward_extra: {reward_extra!r} must be an extras name (e.g. objective_0)",
                        field="reward_extra")
    if dpo_reward is not None and dpo_reward not in DPO_REWARDS:
        raise DataError(
            f"unknown DPO reward {dpo_reward!r}; expected one of {', '.join(DPO_REWARDS)}", field="dpo_reward"
        )


def read_score_files(
    paths: Sequence[str | Path],
    *,
    domain: str | None = None,
    benchmark: str | None = None,
    dpo_reward: str | None = None,
    reward_extra: str | None = None,
) -> ScoreSet:
    """Read and concatenate score files of one benchmark (format detected per record).

    Args:
        paths: one or more files (JSON list or JSONL).
        domain: RM-Bench source domain for result records without ``domain`` (overrides the
            file-name rule).
        benchmark: when given, files of the other benchmark are an error.
        dpo_reward: recompute the rewards from the DPO extras (``avg``, ``sum``, ``norm`` or
            ``reference``; see :mod:`rmserve.metrics.dpo`); None (default) keeps ``rewards``.
        reward_extra: take the rewards from the records' extras of this name instead (one
            objective of a multi-objective head, ``objective_0``, …); excludes ``dpo_reward``.

    Returns:
        :class:`~rmserve.metrics.scores.RMBenchScores` or :class:`~rmserve.metrics.scores.RB2Scores` (arrays read-only).

    Raises:
        DataError: unreadable file, invalid JSON (other than a torn last line), an
            unrecognised record, wrong number of scores, a non-numeric score, missing id, two
            benchmarks or formats in one file, files of different benchmarks or one file given
            twice, an unknown domain/subset, a duplicate group key (except an id repeated
            outside Ties inside one RewardBench 2 file, which is a warning), score records of
            different kinds (kind, mode, ref_model or compat), judge score records that state
            different sampling or engine settings (field ``judge_sampling.<name>`` or
            ``judge_engine.<name>``, both values), no records at all, or with
            ``dpo_reward``: an unknown name, a record that is not an rmserve score record or
            lacks a needed extra (field ``extras.<name>``), or with ``reward_extra``: a record
            without it (field ``extras.<name>``), or both options. The message names file, line,
            id and field.
    """
    if domain is not None and domain not in RMBENCH_DOMAINS:
        raise DataError(
            f"unknown RM-Bench domain {domain!r}; expected one of {', '.join(RMBENCH_DOMAINS)}", field="domain"
        )
    if benchmark is not None and benchmark not in BENCHMARKS:
        raise DataError(f"unknown benchmark {benchmark!r}; expected one of {', '.join(BENCHMARKS)}", field="bench")
    if not paths:
        raise DataError("no score files given", field="files")
    _check_reward_choice(dpo_reward, reward_extra)
    rows = _Rows(files_may_repeat_ids=True, dpo_reward=dpo_reward, reward_extra=reward_extra)
    for path in paths:
        _read_file(rows, Path(path), domain=domain, benchmark=benchmark)
    return _to_scores(rows)


def scores_from_records(
    records: Iterable[ScoreRecord], *, source: str = "<records>", dpo_reward: str | None = None,
    reward_extra: str | None = None,
) -> ScoreSet:
    """Build a score set from in-memory :class:`rmserve.schema.ScoreRecord` objects.

    Records are validated as in a score file; errors name ``source`` and the 1-based record
    number as the line. ``dpo_reward`` and ``reward_extra`` as for :func:`read_score_files`.

    Raises:
        DataError: as :func:`read_score_files`.
    """
    _check_reward_choice(dpo_reward, reward_extra)
    rows = _Rows(dpo_reward=dpo_reward, reward_extra=reward_extra)
    count = 0
    for number, record in enumerate(records, start=1):
        where = _Where(source, number)
        if record.benchmark not in BENCHMARKS:
            raise where.error(
                f"unknown benchmark {record.benchmark!r}; expected one of {', '.join(BENCHMARKS)}", "benchmark"
            )
        if rows.benchmark is not None and record.benchmark != rows.benchmark:
            raise where.error(f"two benchmarks in one run: {record.benchmark} after {rows.benchmark}", "benchmark")
        rows.benchmark = record.benchmark
        _score_record(rows, record, where)
        count += 1
    if count == 0:
        raise DataError("holds no score records", path=source)
    rows.files.append(source)
    return _to_scores(rows)


def score_file_fingerprints(path: str | Path) -> frozenset[str]:
    """The model fingerprints an rmserve score file's records name (empty for the official
    result formats, which carry none, and for lines that are not JSON objects)."""
    found: set[str] = set()
    with open(path, "rb") as fh:
        for line in fh:
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(record, dict) and isinstance(record.get("fingerprint"), str) and record["fingerprint"]:
                found.add(record["fingerprint"])
    return frozenset(found)

"""Dataset loaders: benchmark files or hub ids → validated :class:`~rmserve.schema.Group` lists.

No torch, no ``datasets`` library: JSON/JSONL are read with orjson (falling back to Python's
``json`` for the ``NaN``/``Infinity`` literals it writes, see :func:`loads_json`), parquet with pyarrow
(the ``[parquet]`` extra), hub ids are fetched with ``huggingface_hub.snapshot_download``
(cached; ``HF_HUB_OFFLINE=1`` makes it use the cache only).

Every validation error is a :class:`~rmserve.errors.DataError` naming file, record index,
id and field.
"""

from __future__ import annotations

import codecs
import difflib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from rmserve.errors import DataError
from rmserve.schema import (
    RB2_SUBSETS,
    RMBENCH_DOMAINS,
    RMBENCH_STYLES,
    Group,
    Message,
)

RMBENCH_HUB_ID = "THU-KEG/RM-Bench"
RB2_HUB_ID = "allenai/reward-bench-2"
RB2_TIES_ID = re.compile(r"^(ref|tied):([0-9]+)$")
"""RewardBench 2 Ties ids: ``ref:<prompt>`` (one correct answer) or ``tied:<prompt>`` (several);
group 1 is the kind, group 2 the prompt number (ASCII digits)."""

UTF8_BOM = codecs.BOM_UTF8
"""The UTF-8 byte-order mark some Windows tools put at the start of a text file."""


# --- JSON text shared by every reader -----------------------------------------------------


def strip_bom(raw: bytes) -> tuple[bytes, int]:
    """``raw`` without a leading UTF-8 byte-order mark, and how many bytes were removed (0 or 3).

    The mark is skipped as Python's ``utf-8-sig`` codec does; one anywhere else is left alone
    (and then fails to decode as JSON, naming its line).
    """
    if raw.startswith(UTF8_BOM):
        return raw[len(UTF8_BOM) :], len(UTF8_BOM)
    return raw, 0


def loads_json(data: bytes) -> Any:
    """Decode one JSON text, accepting what Python's ``json`` module writes.

    The fast strict decoder (orjson) is tried first. Only when it refuses the text is it
    decoded again with :func:`json.loads`, which also accepts the literals ``NaN``,
    ``Infinity`` and ``-Infinity`` (written by ``json.dump`` with its default
    ``allow_nan=True``) and numbers too large for a double such as ``1e999`` (→ ``inf``), so
    a file written by an official harness reads with the same values the harness held.
    Anything else orjson refuses is refused by both.

    Raises:
        orjson.JSONDecodeError: neither decoder accepts ``data``; the error is orjson's (its
            ``msg``, ``lineno`` and ``colno`` locate the fault).
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        try:
            return json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise exc from None


@dataclass(frozen=True)
class TornLine:
    """A last line cut short by an interrupted write, dropped by a reader.

    A line counts as torn when it is the last of its file, has no newline after it and is
    not valid JSON: what a writer killed in the middle of a line leaves. Any other line that
    does not decode is an error.

    Attributes:
        path: the file.
        line: the 1-based line number.
        size_bytes: the length of the dropped text in bytes.
    """

    path: str
    line: int
    size_bytes: int

    def message(self, consequence: str) -> str:
        """One sentence naming file, line and bytes, then ``consequence`` (what it means for the caller)."""
        return (
            f"{self.path}: ignored a truncated last line (line {self.line}, {self.size_bytes} bytes, "
            f"no newline and not valid JSON: an interrupted write); {consequence}"
        )


@dataclass(frozen=True)
class Dataset:
    """A loaded benchmark.

    Attributes:
        benchmark: ``"rm-bench"`` or ``"rewardbench2"``.
        groups: the groups in source order.
        source: the path or hub id it came from.
        domains: domains (RM-Bench) or subsets (RewardBench 2) present, in canonical order.
        missing: canonical domains/subsets asked for with no group in this source.
        excluded: canonical domains/subsets left out by the selection (``only``), present
            in the source or not.
    """

    benchmark: str
    groups: tuple[Group, ...]
    source: str
    domains: tuple[str, ...] = field(default=())
    missing: tuple[str, ...] = field(default=())
    excluded: tuple[str, ...] = field(default=())


# --- file reading -----------------------------------------------------------------------


def read_records(path: Path) -> list[dict[str, Any]]:
    """Read a JSON array, JSONL or parquet file into a list of dicts.

    A UTF-8 byte-order mark at the start of a JSON/JSONL file is skipped. Every line of a
    data file must decode, the last one included: a data file defines the benchmark, so a
    record is never dropped from it.

    Raises:
        DataError: unreadable file, invalid JSON (with line number for JSONL), a JSON value
            that is not a list of objects, or parquet without pyarrow installed.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError("no such file", path=str(path))
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise DataError("reading parquet needs pyarrow: pip install 'rmserve[parquet]'", path=str(path)) from exc
        return pq.read_table(path).to_pylist()
    raw, _ = strip_bom(path.read_bytes())
    if suffix == ".jsonl":
        records = []
        for lineno, line in enumerate(raw.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise DataError(f"invalid JSON: {exc}", path=str(path), line=lineno) from None
            if not isinstance(value, dict):
                raise DataError("each line must be a JSON object", path=str(path), line=lineno)
            records.append(value)
        return records
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DataError(f"invalid JSON: {exc}", path=str(path)) from None
    if isinstance(value, dict):
        # {"train": [...]} or {"data": [...]} style wrappers: take the single list value.
        lists = [v for v in value.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise DataError("expected a JSON list of records", path=str(path))
        value = lists[0]
    if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
        raise DataError("expected a JSON list of records", path=str(path))
    return value


def _hub_snapshot(repo_id: str, patterns: Sequence[str]) -> Path:
    """Download (or reuse from cache) a dataset repo snapshot; honours ``HF_HUB_OFFLINE``."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover
        raise DataError("loading hub ids needs huggingface_hub", path=repo_id) from exc
    try:
        local = snapshot_download(repo_id=repo_id, repo_type="dataset", allow_patterns=list(patterns))
    except Exception as exc:  # noqa: BLE001 - surface any hub failure as a data error
        raise DataError(f"could not fetch hub dataset ({type(exc).__name__}: {exc})", path=repo_id) from None
    return Path(local)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def describe_folder(path: Path) -> str:
    """What a data folder holds, in words, for messages: RM-Bench release files, then
    parquet, JSONL and other JSON files (searched recursively), e.g. ``"4 RM-Bench
    *_filtered.json files"``; ``"no files"`` when empty."""
    files = [p for p in path.rglob("*") if p.is_file()]
    rmbench = [p for p in files if p.name.endswith("_filtered.json") or p.name == "total_dataset.json"]
    parts = []
    if rmbench:
        names = ", ".join(sorted(p.name for p in rmbench)[:4]) + (", …" if len(rmbench) > 4 else "")
        parts.append(f"{_plural(len(rmbench), 'RM-Bench release file')} ({names})")
    for suffix, label in ((".parquet", "parquet file"), (".jsonl", "JSONL file"), (".json", "other JSON file")):
        n = sum(1 for p in files if p.suffix.lower() == suffix and p not in rmbench)
        if n:
            parts.append(_plural(n, label))
    others = sum(1 for p in files if p.suffix.lower() not in {".parquet", ".jsonl", ".json"})
    if others:
        parts.append(_plural(others, "other file"))
    return ", ".join(parts) if parts else "no files"


def _looks_like_hub_id(source: str) -> bool:
    return not Path(source).exists() and re.fullmatch(r"[\w.-]+/[\w.-]+", source) is not None


# --- field validation -------------------------------------------------------------------


def _messages(value: Any, *, path: str, index: int, record_id: str, field_name: str) -> tuple[Message, ...]:
    """A prompt string → one user turn; a list of {role, content} → those turns."""
    if isinstance(value, str):
        if not value:
            raise DataError("must be a non-empty string", path=path, record=index, record_id=record_id, field=field_name)
        return (Message("user", value),)
    if isinstance(value, list) and value:
        turns = []
        for k, turn in enumerate(value):
            if not (
                isinstance(turn, dict)
                and isinstance(turn.get("role"), str)
                and isinstance(turn.get("content"), str)
            ):
                raise DataError(
                    "each turn must be {role: str, content: str}",
                    path=path, record=index, record_id=record_id, field=f"{field_name}[{k}]",
                )
            turns.append(Message(turn["role"], turn["content"]))
        if turns[-1].role != "user":
            raise DataError(
                f"the last turn must be the user's, got {turns[-1].role!r}",
                path=path, record=index, record_id=record_id, field=f"{field_name}[{len(turns) - 1}].role",
            )
        return tuple(turns)
    raise DataError(
        "must be a string or a non-empty list of messages",
        path=path, record=index, record_id=record_id, field=field_name,
    )


def _strings(value: Any, *, path: str, index: int, record_id: str, field_name: str, count: int | None) -> tuple[str, ...]:
    if value is None:
        what = f"a list of {count} strings" if count is not None else "a list of strings"
        raise DataError(f"missing (must be {what})", path=path, record=index, record_id=record_id, field=field_name)
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise DataError("must be a list of strings", path=path, record=index, record_id=record_id, field=field_name)
    if count is not None and len(value) != count:
        raise DataError(
            f"must hold exactly {count} strings, got {len(value)}",
            path=path, record=index, record_id=record_id, field=field_name, value=len(value), limit=count,
        )
    return tuple(value)


def _record_id(record: dict[str, Any], *, path: str, index: int) -> str:
    value = record.get("id")
    if value is None or isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise DataError("missing or not a string/integer", path=path, record=index, field="id")
    return str(value)


def _check_unique(groups: Iterable[Group], source: str) -> None:
    seen: set[tuple[str, str]] = set()
    for g in groups:
        k = (g.domain, g.id)
        if k in seen:
            raise DataError("duplicate group key (domain, id)", path=source, record_id=g.id, field="id", value=g.domain)
        seen.add(k)


# --- RM-Bench ---------------------------------------------------------------------------


def _rmbench_group(record: dict[str, Any], *, domain: str | None, path: str, index: int) -> Group:
    record_id = _record_id(record, path=path, index=index)
    if "num_correct" in record and record.get("subset") in RB2_SUBSETS:
        raise DataError(
            f"a RewardBench 2 record (subset {record['subset']!r}, num_correct), not RM-Bench; "
            "use --bench rewardbench2",
            path=path, record=index, record_id=record_id, field="subset",
        )
    if domain is None:
        domain = record.get("domain")
        if not isinstance(domain, str):
            raise DataError(
                "missing; records must carry a domain unless the file is <domain>_filtered.json",
                path=path, record=index, record_id=record_id, field="domain",
            )
    if domain not in RMBENCH_DOMAINS:
        raise DataError(
            f"unknown RM-Bench domain {domain!r}; expected one of {', '.join(RMBENCH_DOMAINS)}",
            path=path, record=index, record_id=record_id, field="domain", value=domain,
        )
    messages = _messages(record.get("prompt"), path=path, index=index, record_id=record_id, field_name="prompt")
    chosen = _strings(record.get("chosen"), path=path, index=index, record_id=record_id, field_name="chosen", count=3)
    rejected = _strings(record.get("rejected"), path=path, index=index, record_id=record_id, field_name="rejected", count=3)
    return Group(
        benchmark="rm-bench",
        domain=domain,
        id=record_id,
        messages=messages,
        responses=chosen + rejected,
        num_chosen=3,
        styles=RMBENCH_STYLES + RMBENCH_STYLES,
    )


def _rmbench_file(path: Path) -> list[Group]:
    name = path.name
    domain = name[: -len("_filtered.json")] if name.endswith("_filtered.json") else None
    records = read_records(path)
    return [_rmbench_group(r, domain=domain, path=str(path), index=i) for i, r in enumerate(records)]


def load_rmbench(source: str | Path, domains: Sequence[str] | None = None) -> Dataset:
    """Load RM-Bench groups.

    Args:
        source: a folder of ``<domain>_filtered.json`` release files; one such file;
            ``total_dataset.json`` or any JSON/JSONL/parquet file whose records carry
            ``domain``; or the hub id ``THU-KEG/RM-Bench``.
        domains: keep only these domains (default: all present).

    Returns:
        A :class:`Dataset`; each group has 6 responses (3 chosen then 3 rejected, each in
        the order concise, detailed plain, detailed markdown), ``num_chosen=3``.

    Raises:
        DataError: unreadable source, a record without exactly 3 chosen and 3 rejected
            strings, an unknown domain, duplicate (domain, id) keys, or no groups at all.
    """
    source_str = str(source)
    if isinstance(source, str) and _looks_like_hub_id(source):
        path = _hub_snapshot(source, ["*.json", "*.jsonl", "*.parquet", "**/*.json", "**/*.jsonl", "**/*.parquet"])
    else:
        path = Path(source)
    if path.is_dir():
        total = sorted(path.rglob("total_dataset.json"))
        if total:
            groups = _rmbench_file(total[0])
        else:
            files = sorted(path.rglob("*_filtered.json"))
            if not files:
                holds = describe_folder(path)
                hint = "; RewardBench 2 data? use --bench rewardbench2" if re.search(r"parquet|JSONL", holds) else ""
                raise DataError(
                    f"no RM-Bench data: the folder holds {holds}, but neither total_dataset.json nor "
                    f"<domain>_filtered.json files{hint}",
                    path=source_str,
                )
            groups = [g for f in files for g in _rmbench_file(f)]
    else:
        groups = _rmbench_file(path)
    return _selected(groups, "rm-bench", RMBENCH_DOMAINS, domains, source_str, field_name="domains")


# --- RewardBench 2 ----------------------------------------------------------------------


def _int_field(record: dict[str, Any], name: str, *, path: str, index: int, record_id: str) -> int:
    value = record.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise DataError("missing or not an integer", path=path, record=index, record_id=record_id, field=name)
    return value


def _rb2_group(record: dict[str, Any], *, path: str, index: int) -> Group:
    record_id = _record_id(record, path=path, index=index)
    subset = record.get("subset")
    if "num_correct" not in record and (record.get("domain") in RMBENCH_DOMAINS or path.endswith("_filtered.json")):
        raise DataError(
            "an RM-Bench record (no num_correct; a domain or a <domain>_filtered.json file), not RewardBench 2; "
            "use --bench rm-bench",
            path=path, record=index, record_id=record_id, field="num_correct",
        )
    if subset not in RB2_SUBSETS:
        raise DataError(
            f"unknown RewardBench 2 subset {subset!r}; expected one of {', '.join(RB2_SUBSETS)}",
            path=path, record=index, record_id=record_id, field="subset", value=subset,
        )
    num_correct = _int_field(record, "num_correct", path=path, index=index, record_id=record_id)
    if "num_incorrect" not in record and "num_rejected" in record:
        raise DataError(
            "missing; the RewardBench 2 release schema names the count of rejected answers num_incorrect "
            "(this record has num_rejected): rename the column",
            path=path, record=index, record_id=record_id, field="num_incorrect",
        )
    num_incorrect = _int_field(record, "num_incorrect", path=path, index=index, record_id=record_id)
    if num_correct < 1:
        raise DataError("must be ≥ 1", path=path, record=index, record_id=record_id, field="num_correct", value=num_correct, limit=1)
    if num_incorrect < 1:
        raise DataError("must be ≥ 1", path=path, record=index, record_id=record_id, field="num_incorrect", value=num_incorrect, limit=1)
    chosen = _strings(record.get("chosen"), path=path, index=index, record_id=record_id, field_name="chosen", count=num_correct)
    rejected = _strings(record.get("rejected"), path=path, index=index, record_id=record_id, field_name="rejected", count=num_incorrect)
    total = record.get("total_completions")
    if total is not None and total != num_correct + num_incorrect:
        raise DataError(
            f"is {total} but num_correct + num_incorrect = {num_correct + num_incorrect}",
            path=path, record=index, record_id=record_id, field="total_completions", value=total,
        )
    if subset == "Ties" and not RB2_TIES_ID.match(record_id):
        raise DataError(
            "Ties ids must be 'ref:<n>' or 'tied:<n>'", path=path, record=index, record_id=record_id, field="id"
        )
    messages = _messages(record.get("prompt"), path=path, index=index, record_id=record_id, field_name="prompt")
    return Group(
        benchmark="rewardbench2",
        domain=subset,
        id=record_id,
        messages=messages,
        responses=chosen + rejected,
        num_chosen=num_correct,
    )


def load_rewardbench2(source: str | Path, subsets: Sequence[str] | None = None) -> Dataset:
    """Load RewardBench 2 groups.

    Args:
        source: a JSON/JSONL/parquet file (or a folder of parquet/JSONL shards) in the
            release schema (``id, prompt, chosen[], rejected[], num_correct, num_incorrect,
            total_completions, models, subset, additional_metadata``), or the hub id
            ``allenai/reward-bench-2`` (split ``test``).
        subsets: keep only these subsets (default: all present).

    Returns:
        A :class:`Dataset`; each group's responses are chosen first, then rejected, with
        ``num_chosen = num_correct``.

    Raises:
        DataError: ``len(chosen) != num_correct``, ``len(rejected) != num_incorrect``,
            inconsistent ``total_completions``, ``num_correct < 1``, an unknown subset,
            a Ties id not of the form ``ref:N``/``tied:N``, duplicate (subset, id) keys.
    """
    source_str = str(source)
    if isinstance(source, str) and _looks_like_hub_id(source):
        path = _hub_snapshot(source, ["*test*.parquet", "**/*test*.parquet", "*test*.jsonl", "**/*test*.jsonl"])
    else:
        path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in {".parquet", ".jsonl"} and "test" in p.name)
        files = files or sorted(p for p in path.rglob("*") if p.suffix in {".parquet", ".jsonl"})
        if not files:
            holds = describe_folder(path)
            hint = "; use --bench rm-bench" if "RM-Bench" in holds else ""
            raise DataError(
                f"no RewardBench 2 data: the folder holds {holds}, but no parquet or JSONL files{hint}", path=source_str
            )
    else:
        files = [path]
    groups = [_rb2_group(r, path=str(f), index=i) for f in files for i, r in enumerate(read_records(f))]
    return _selected(groups, "rewardbench2", RB2_SUBSETS, subsets, source_str, field_name="subsets")


_NAMING = {"rm-bench": ("RM-Bench", "domain"), "rewardbench2": ("RewardBench 2", "subset")}
"""How messages name each benchmark and its parts."""

PART_NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "rm-bench": {
        "chat": ("chat",),
        "math": ("math",),
        "code": ("code",),
        "safety": ("safety-refuse", "safety-response"),
        "safety-refuse": ("safety-refuse",),
        "safety-response": ("safety-response",),
    },
    "rewardbench2": {name: (name,) for name in RB2_SUBSETS},
}
"""The names a selection (``--only``) accepts per benchmark, as the tables write them →
the domains or subsets each stands for. RM-Bench's ``safety`` column averages its two
source domains, so ``safety`` selects both. Matching ignores case, and spaces, ``-`` and
``_`` are the same (``precise-if`` is ``Precise IF``)."""


def _name_key(name: str) -> str:
    """The form names are matched in: case folded, runs of spaces, ``-`` and ``_`` as one ``-``."""
    return re.sub(r"[\s_-]+", "-", name.strip().casefold())


def part_names_text(benchmark: str) -> str:
    """The names :data:`PART_NAMES` accepts for ``benchmark``, for messages and help
    (``safety (safety-refuse and safety-response)`` for a name standing for several parts)."""
    return ", ".join(
        f"{name} ({' and '.join(parts)})" if len(parts) > 1 else name for name, parts in PART_NAMES[benchmark].items()
    )


def select_parts(benchmarks: Sequence[str], names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The domains/subsets of each benchmark that ``names`` select.

    Args:
        benchmarks: the benchmarks of the run (``rm-bench``, ``rewardbench2``).
        names: the names given (see :data:`PART_NAMES`; case-insensitive).

    Returns:
        Benchmark → its selected parts, in table order.

    Raises:
        ValueError: a name that no benchmark of the run has (the message lists the valid
            names and suggests the closest one, when one is close), or a benchmark that none
            of ``names`` selects from.
    """
    keys = {bench: {_name_key(n): parts for n, parts in PART_NAMES[bench].items()} for bench in benchmarks}
    shown = {_name_key(n): n for bench in benchmarks for n in PART_NAMES[bench]}
    for name in names:
        if not any(_name_key(name) in keys[bench] for bench in benchmarks):
            what = " or ".join(f"{_NAMING[b][0]} {_NAMING[b][1]}" for b in benchmarks)
            close = difflib.get_close_matches(_name_key(name), list(shown), n=1, cutoff=0.6)
            hint = f"; did you mean {shown[close[0]]!r}?" if close else "."
            if len(benchmarks) == 1:
                valid = part_names_text(benchmarks[0])
            else:
                valid = "; ".join(f"{_NAMING[b][0]}: {part_names_text(b)}" for b in benchmarks)
            article = "an" if what.startswith("RM") else "a"
            raise ValueError(f"{name!r} is not {article} {what}{hint} Valid names (any case): {valid}")
    selected = {}
    for bench in benchmarks:
        wanted = {part for name in names for part in keys[bench].get(_name_key(name), ())}
        all_parts = RMBENCH_DOMAINS if bench == "rm-bench" else RB2_SUBSETS
        selected[bench] = tuple(p for p in all_parts if p in wanted)
        if not selected[bench]:
            title, part = _NAMING[bench]
            raise ValueError(
                f"{', '.join(map(repr, names))} selects no {title} {part}; add one of {part_names_text(bench)}"
                + (f", or leave {bench} out of the run" if len(benchmarks) > 1 else "")
            )
    return selected


def _selected(
    groups: list[Group],
    benchmark: str,
    names: tuple[str, ...],
    only: Sequence[str] | None,
    source: str,
    *,
    field_name: str,
) -> Dataset:
    """The :class:`Dataset` of ``groups`` read from ``source``, kept to the parts in ``only``.

    Args:
        groups: every group read, in file order.
        benchmark: ``"rm-bench"`` or ``"rewardbench2"``.
        names: all parts (domains or subsets) of the benchmark, in table order.
        only: names of the parts to keep (:data:`PART_NAMES`, any case); None keeps all.
        source: the data source as given, for messages and :attr:`Dataset.source`.
        field_name: the argument that carried ``only``, named in its error.

    Raises:
        DataError: a name in ``only`` not in ``names`` (field ``field_name``), no group left, or
            duplicate (domain, id) keys.
    """
    title, part = _NAMING[benchmark]
    wanted = names
    in_data = {g.domain for g in groups}
    if only is not None:
        try:
            wanted = select_parts([benchmark], only)[benchmark]
        except ValueError as exc:
            raise DataError(str(exc), path=source, field=field_name) from None
        groups = [g for g in groups if g.domain in wanted]
        if not groups and in_data:
            held = ", ".join(n for n in names if n in in_data)
            raise DataError(
                f"selects {', '.join(wanted)}, which the data ({source}) does not hold; it holds {held}",
                field=field_name,
            )
    if not groups:
        raise DataError(f"no {title} groups found", path=source)
    _check_unique(groups, source)
    present = {g.domain for g in groups}
    return Dataset(
        benchmark=benchmark,
        groups=tuple(groups),
        source=source,
        domains=tuple(n for n in names if n in present),
        missing=tuple(n for n in wanted if n not in present),
        excluded=tuple(n for n in names if n not in wanted),
    )


def load_benchmark(benchmark: str, source: str | Path, only: Sequence[str] | None = None) -> Dataset:
    """Dispatch to :func:`load_rmbench` or :func:`load_rewardbench2` by benchmark name.

    Raises:
        DataError: unknown benchmark name (lists the choices), or any loader error.
    """
    if benchmark == "rm-bench":
        return load_rmbench(source, only)
    if benchmark == "rewardbench2":
        return load_rewardbench2(source, only)
    raise DataError(f"unknown benchmark {benchmark!r}; expected 'rm-bench' or 'rewardbench2'", field="bench")

"""Loader tests on the real RM-Bench release files and the RewardBench 2 fixture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testkit.shared_data import shared_data_dir

from rmserve.datasets import load_benchmark, load_rewardbench2, load_rmbench
from rmserve.errors import DataError
from rmserve.schema import RMBENCH_STYLES

REPO = Path(__file__).resolve().parents[1]
RB2_FIXTURE = REPO / "tests" / "data" / "rewardbench2_fixture.jsonl"


def _raw(domain: str) -> list[dict]:
    return json.loads((shared_data_dir() / "rm-bench" / f"{domain}_filtered.json").read_text())


def test_rmbench_folder_counts_and_missing_math():
    ds = load_rmbench(shared_data_dir() / "rm-bench")
    counts = {d: sum(g.domain == d for g in ds.groups) for d in ds.domains}
    # Counts from the shared README (independent of the loader).
    assert counts == {"chat": 129, "code": 228, "safety-refuse": 284, "safety-response": 157}
    assert len(ds.groups) == 798
    assert ds.missing == ("math",)


def test_rmbench_response_order_and_keys():
    ds = load_rmbench(shared_data_dir() / "rm-bench")
    raw = _raw("code")[5]
    g = next(g for g in ds.groups if g.domain == "code" and g.id == str(raw["id"]))
    assert g.responses == tuple(raw["chosen"]) + tuple(raw["rejected"])
    assert g.num_chosen == 3
    assert g.styles == RMBENCH_STYLES * 2
    assert g.messages[-1].role == "user" and g.messages[-1].content == raw["prompt"]
    # 23 ids are shared by chat and code: keys stay distinct because the domain is in them.
    chat_ids = {str(r["id"]) for r in _raw("chat")}
    code_ids = {str(r["id"]) for r in _raw("code")}
    assert len(chat_ids & code_ids) == 23
    assert len({g.key for g in ds.groups}) == 798


def test_rmbench_total_dataset_with_domain(tmp_path):
    recs = [dict(r, domain="chat") for r in _raw("chat")[:3]] + [dict(r, domain="code") for r in _raw("code")[:2]]
    path = tmp_path / "total_dataset.json"
    path.write_text(json.dumps(recs))
    ds = load_rmbench(path)
    assert [g.domain for g in ds.groups] == ["chat"] * 3 + ["code"] * 2
    assert set(ds.missing) == {"math", "safety-refuse", "safety-response"}
    # The same file found inside a folder.
    assert len(load_rmbench(tmp_path).groups) == 5


def test_rmbench_jsonl_and_domain_filter(tmp_path):
    recs = [dict(r, domain="safety-refuse") for r in _raw("safety-refuse")[:4]]
    path = tmp_path / "part.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs))
    ds = load_benchmark("rm-bench", path, only=["safety-refuse"])
    assert len(ds.groups) == 4 and ds.missing == ()


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda r: r.update(chosen=r["chosen"][:2]), "chosen"),
        (lambda r: r.update(rejected=r["rejected"] + ["x"]), "rejected"),
        (lambda r: r.pop("id"), "id"),
        (lambda r: r.update(prompt=5), "prompt"),
        (lambda r: r.update(chosen=[1, 2, 3]), "chosen"),
    ],
)
def test_rmbench_validation_names_file_index_and_field(tmp_path, mutate, field):
    recs = _raw("chat")[:3]
    mutate(recs[1])
    path = tmp_path / "chat_filtered.json"
    path.write_text(json.dumps(recs))
    with pytest.raises(DataError) as exc:
        load_rmbench(path)
    msg = str(exc.value)
    assert "chat_filtered.json" in msg and "record 1" in msg and f"field {field!r}" in msg


def test_rmbench_unknown_domain_and_duplicates(tmp_path):
    recs = [dict(r, domain="poetry") for r in _raw("chat")[:1]]
    (tmp_path / "a.json").write_text(json.dumps(recs))
    with pytest.raises(DataError, match="unknown RM-Bench domain 'poetry'"):
        load_rmbench(tmp_path / "a.json")
    dup = _raw("chat")[:1] * 2
    (tmp_path / "chat_filtered.json").write_text(json.dumps(dup))
    with pytest.raises(DataError, match="duplicate"):
        load_rmbench(tmp_path / "chat_filtered.json")


def test_rewardbench2_fixture():
    ds = load_rewardbench2(RB2_FIXTURE)
    assert len(ds.groups) == 14 and ds.missing == ()
    tied = next(g for g in ds.groups if g.id == "tied:1")
    assert tied.domain == "Ties" and tied.num_chosen == 4 and len(tied.responses) == 9
    assert tied.responses[:4] == ("2", "3", "5", "7")
    fact = next(g for g in ds.groups if g.domain == "Factuality" and g.id == "0")
    assert fact.num_chosen == 1 and len(fact.responses) == 4
    # id "0" exists in several subsets; keys differ.
    assert len({g.key for g in ds.groups}) == 14


def test_rewardbench2_parquet_roundtrip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in RB2_FIXTURE.read_text().splitlines()]
    for r in rows:
        r["additional_metadata"] = json.dumps(r["additional_metadata"])
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "test-00000.parquet")
    assert [g.key for g in load_rewardbench2(tmp_path).groups] == [g.key for g in load_rewardbench2(RB2_FIXTURE).groups]


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda r: r.update(num_correct=2), "chosen"),
        (lambda r: r.update(num_incorrect=4), "rejected"),
        (lambda r: r.update(total_completions=7), "total_completions"),
        (lambda r: r.update(num_correct=0, chosen=[]), "num_correct"),
        (lambda r: r.update(subset="Chat"), "subset"),
        (lambda r: r.update(subset="Ties"), "id"),
    ],
)
def test_rewardbench2_validation(tmp_path, mutate, field):
    rows = [json.loads(line) for line in RB2_FIXTURE.read_text().splitlines()]
    mutate(rows[2])
    path = tmp_path / "rb2.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(DataError) as exc:
        load_rewardbench2(path)
    assert "rb2.jsonl" in str(exc.value) and "record 2" in str(exc.value) and f"field {field!r}" in str(exc.value)


def test_unknown_benchmark():
    with pytest.raises(DataError, match="unknown benchmark"):
        load_benchmark("mmlu", RB2_FIXTURE)


def test_hub_id_offline_without_cache_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(DataError, match="THU-KEG/RM-Bench"):
        load_rmbench("THU-KEG/RM-Bench")


def test_byte_order_mark_at_the_start_of_a_data_file_is_skipped(tmp_path):
    bom = b"\xef\xbb\xbf"
    listed = tmp_path / "chat_filtered.json"
    listed.write_bytes(bom + json.dumps(_raw("chat")[:3]).encode())
    plain = load_rmbench(shared_data_dir() / "rm-bench" / "chat_filtered.json")
    assert [g.key for g in load_rmbench(listed).groups] == [g.key for g in plain.groups[:3]]

    lines = tmp_path / "rb2.jsonl"
    lines.write_bytes(bom + RB2_FIXTURE.read_bytes())
    assert [g.key for g in load_rewardbench2(lines).groups] == [g.key for g in load_rewardbench2(RB2_FIXTURE).groups]


def test_a_byte_order_mark_inside_a_data_file_is_still_an_error(tmp_path):
    text = RB2_FIXTURE.read_bytes().split(b"\n")
    text[1] = b"\xef\xbb\xbf" + text[1]
    path = tmp_path / "rb2.jsonl"
    path.write_bytes(b"\n".join(text))
    with pytest.raises(DataError, match=r"rb2.jsonl, line 2: invalid JSON"):
        load_rewardbench2(path)


def test_a_data_file_keeps_every_record_even_a_cut_last_one(tmp_path):
    # Data files define the benchmark: a cut last line is an error, never a dropped record.
    path = tmp_path / "rb2.jsonl"
    path.write_bytes(RB2_FIXTURE.read_bytes().rstrip(b"\n")[:-10])
    with pytest.raises(DataError, match=r"rb2.jsonl, line 14: invalid JSON"):
        load_rewardbench2(path)


def test_ties_id_pattern_is_the_one_the_metrics_use():
    from rmserve.datasets import RB2_TIES_ID
    from rmserve.metrics import score_files

    assert score_files.RB2_TIES_ID is RB2_TIES_ID
    assert [bool(RB2_TIES_ID.match(s)) for s in ("ref:0", "tied:12", "ref:", "tie:1", "ref:1a", "ref:\u0661")] == [
        True,
        True,
        False,
        False,
        False,
        False,
    ]

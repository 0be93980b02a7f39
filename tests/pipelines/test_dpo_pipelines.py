"""The pipelines with a DPO server (no model: the wire stub, or the real app over fake engines):
``eval`` keeps extras and kind, ``run --kind dpo`` passes its engine options on and keys the
store by a DPO signature, and ``sweep`` keeps one store memo per mode."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from rmserve.client.score_file import read_scores
from rmserve.client.score_store import ScoreStore, checkpoint_signature
from rmserve.pipelines.evaluate import EvalConfig, evaluate_async
from rmserve.pipelines.launch import RunConfig, ServeOptions, run, store_signature
from rmserve.pipelines.sweep import SweepConfig, sweep_async
from testkit import fakes, wire_stub
from testkit.records import fake_checkpoint
from testkit.servers import ThreadedServer, write_rmbench_data

from rmserve import errors
from rmserve.fingerprint import dpo_fingerprint
from rmserve.schema import ModelInfo, ScoreKind

STUB_SCRIPT = str(Path(__file__).resolve().parents[1] / "testkit" / "wire_stub.py")
N_SMALL = 10  # groups in the small_rmbench fixture


# --- eval -----------------------------------------------------------------------------------


def _eval_config(stub_http, data, out, **kwargs) -> EvalConfig:
    return EvalConfig(bench="rm-bench", data=str(data), out_dir=out, server_url=str(stub_http.make_url("")),
                      resamples=0, quiet=True, **kwargs)


async def test_eval_with_a_dpo_server_keeps_extras_and_kind(stub_http, stub_state, small_rmbench, tmp_path):
    stub_state.model = wire_stub.stub_dpo_model("reference", ref_model="ref-1b")
    out = tmp_path / "out"
    result = await evaluate_async(_eval_config(stub_http, small_rmbench, out, store=tmp_path / "s.sqlite"),
                                  session=stub_http.session)
    assert result.n_scored == N_SMALL
    records = read_scores(out / "scores.jsonl").records
    assert {r.score_kind for r in records} == {ScoreKind("dpo", "reference", "ref-1b", "none")}
    for record in records:
        assert set(record.extras) == {"policy_logp", "ref_logp", "policy_logp_norm", "answer_tokens"}
        # The stub's reward in mode reference is policy_logp - ref_logp, response by response.
        assert record.rewards == tuple(p - r for p, r in zip(record.extras["policy_logp"], record.extras["ref_logp"]))
    results = json.loads((out / "results.json").read_text())
    assert results["score_kind"] == {"kind": "dpo", "mode": "reference", "ref_model": "ref-1b", "compat": "none"}
    assert results["reward"]["name"] == "rewards"
    assert "Scores: dpo (mode reference, reference 'ref-1b', compat none)" in (out / "table.md").read_text()


async def test_eval_refuses_to_resume_a_dpo_score_file_under_another_mode(stub_http, stub_state, small_rmbench, tmp_path):
    stub_state.model = wire_stub.stub_dpo_model("avg")
    out = tmp_path / "out"
    await evaluate_async(_eval_config(stub_http, small_rmbench, out), session=stub_http.session)
    stub_state.model = wire_stub.stub_dpo_model("norm")
    with pytest.raises(errors.FingerprintMismatch) as info:
        await evaluate_async(_eval_config(stub_http, small_rmbench, out), session=stub_http.session)
    assert "'fp-stub-dpo-avg-none', dpo (mode avg, compat none))" in str(info.value)
    assert "'fp-stub-dpo-norm-none', dpo (mode norm, compat none))" in str(info.value)


# --- run: the store signature -------------------------------------------------------------------


def _run_config(model, data, out, store, engine_options, *serve_extra) -> RunConfig:
    serve = ServeOptions(model=str(model), engine_options={"dtype": "float32", **engine_options},
                         serve_command=(sys.executable, STUB_SCRIPT, *serve_extra), stop_grace_s=5)
    return RunConfig(serve=serve, evaluation=EvalConfig(bench="rm-bench", data=str(data), out_dir=out, resamples=0,
                                                        quiet=True, store=store))


def test_store_signature_of_a_dpo_run_is_the_dpo_fingerprint_of_both_folders(tmp_path):
    policy = fake_checkpoint(tmp_path / "policy", b"\x01" * 512, causal_lm=True)
    ref = fake_checkpoint(tmp_path / "ref", b"\x02" * 512, causal_lm=True)
    store = tmp_path / "s.sqlite"

    def signature(model=policy, **options):
        return store_signature(_run_config(model, tmp_path / "d", tmp_path / "o", store, options))

    policy_sig, ref_sig = checkpoint_signature(policy, "float32"), checkpoint_signature(ref, "float32")
    classifier = fake_checkpoint(tmp_path / "rm", b"\x01" * 512)
    assert signature(classifier) == checkpoint_signature(classifier, "float32")  # a classifier: the folder's own
    with_ref = signature(kind="dpo", ref_model=str(ref))
    assert with_ref == dpo_fingerprint(policy_sig, ref_sig, "reference", "none")
    assert signature(kind="dpo", ref_model=str(ref), compat="official") == dpo_fingerprint(
        policy_sig, ref_sig, "reference", "official")
    free = {mode: signature(kind="dpo", ref_free=mode) for mode in ("avg", "sum", "norm")}
    assert free["avg"] == dpo_fingerprint(policy_sig, None, "avg", "none")
    assert len({policy_sig, with_ref, *free.values()}) == 5  # never the folder's own signature, never another mode's
    assert signature(kind="dpo", ref_model="org/ref-on-the-hub") is None  # a hub reference cannot be hashed


def test_store_signature_of_a_classifier_covers_its_head_options(tmp_path):
    """Two runs of one multi-label folder under other head options never share a memo (each
    would otherwise be answered with the other's stored scores); the default head keeps the
    folder's plain signature, so memos made before the head was covered still match."""
    from rmserve.fingerprint import model_fingerprint
    from rmserve.schema import RewardHead

    labels = fake_checkpoint(tmp_path / "rm3", b"\x03" * 512)
    (labels / "config.json").write_text('{"architectures": ["LlamaForSequenceClassification"], "num_labels": 3}')
    one = fake_checkpoint(tmp_path / "rm1", b"\x01" * 512)
    store = tmp_path / "s.sqlite"

    def signature(model, **options):
        return store_signature(_run_config(model, tmp_path / "d", tmp_path / "o", store, options))

    by_index = {i: signature(labels, label_index=i) for i in range(3)}
    assert by_index[1] == model_fingerprint(labels, None, "float32", RewardHead("multi-label", label_index=1))
    weighted = signature(labels, label_weights="0.5,0.5,0")
    assert weighted == model_fingerprint(labels, None, "float32", RewardHead("multi-label", label_weights=(0.5, 0.5, 0.0)))
    assert len({*by_index.values(), weighted}) == 4
    assert signature(one) == checkpoint_signature(one, "float32")  # the one-label head adds nothing


def test_store_signature_under_a_chat_template_is_the_key_a_sweep_files_it_under(tmp_path):
    """With --chat-template the signature is the folder's hashed with the template's digest
    (what a server started so reports), for a classifier and a DPO policy; another template
    gives another key; a template passed in extra args gives none."""
    import hashlib

    rm = fake_checkpoint(tmp_path / "rm", b"\x01" * 512)
    policy = fake_checkpoint(tmp_path / "policy", b"\x02" * 512, causal_lm=True)
    one, two = tmp_path / "one.jinja", tmp_path / "two.jinja"
    one.write_text("{{ messages }}", encoding="utf-8")
    two.write_text("{{ messages }} ", encoding="utf-8")
    store = tmp_path / "s.sqlite"

    def signature(model, *extra, **options):
        return store_signature(_run_config(model, tmp_path / "d", tmp_path / "o", store, options, *extra))

    digest = hashlib.sha256(b"{{ messages }}").hexdigest()[:16]
    assert signature(rm, chat_template=str(one)) == checkpoint_signature(rm, "float32", chat_template_override=digest)
    assert signature(rm, chat_template=str(one)) not in (signature(rm), signature(rm, chat_template=str(two)))
    assert signature(policy, kind="dpo", ref_free="avg", chat_template=str(one)) == dpo_fingerprint(
        checkpoint_signature(policy, "float32", chat_template_override=digest), None, "avg")
    serve = ServeOptions(model=str(rm), engine_options={"dtype": "float32"}, extra_args=("--chat-template", str(one)))
    evaluation = EvalConfig(bench="rm-bench", data="d", out_dir=tmp_path / "o", store=store)
    assert store_signature(RunConfig(serve=serve, evaluation=evaluation)) is None


def test_run_kind_dpo_passes_its_options_and_is_answered_from_the_store_next_time(small_rmbench, tmp_path):
    policy = fake_checkpoint(tmp_path / "policy", b"\x01" * 512, causal_lm=True)
    ref = fake_checkpoint(tmp_path / "ref", b"\x02" * 512, causal_lm=True)
    store = tmp_path / "s.sqlite"
    options = {"kind": "dpo", "ref_model": str(ref)}
    first = run(_run_config(policy, small_rmbench, tmp_path / "a", store, options))
    assert (first.n_scored, first.model.kind, first.model.mode) == (N_SMALL, "dpo", "reference")
    log = (tmp_path / "a" / "server.log").read_text()
    assert "stub: serving dpo model stub-policy" in log  # --kind dpo --ref-model REF reached the child
    records = read_scores(tmp_path / "a" / "scores.jsonl").records
    assert {r.score_kind for r in records} == {ScoreKind("dpo", "reference", str(ref), "none")}
    with ScoreStore(store) as db:
        signature = dpo_fingerprint(checkpoint_signature(policy, "float32"), checkpoint_signature(ref, "float32"),
                                    "reference", "none")
        assert db.fingerprint_for(signature) == "fp-stub-dpo-reference-none"
        assert db.fingerprint_for(checkpoint_signature(policy, "float32")) is None

    # A server started now would exit at once: the same DPO run must not need one ...
    second = run(_run_config(policy, small_rmbench, tmp_path / "b", store, options, "--fail-at-start"))
    assert any(n.startswith("answered from the store, no server started") for n in second.notes)
    assert read_scores(tmp_path / "b" / "scores.jsonl").records == records
    # ... but another mode of the same policy is not in the store.
    with pytest.raises(errors.ServerFault, match="exited with status 3 before it was ready"):
        run(_run_config(policy, small_rmbench, tmp_path / "c", store, {"kind": "dpo", "ref_free": "avg"},
                        "--fail-at-start"))
    # The policy as a classifier is refused before any server starts, as rmserve serve refuses it.
    with pytest.raises(ValueError, match=r"^model: checkpoint 'policy/config.json': has architectures "
                                         r"\['LlamaForCausalLM'\], whose reward head rmserve does not know; .* to score a DPO policy "
                                         r"by its implicit reward use --kind dpo with --ref-model REF"):
        _run_config(policy, small_rmbench, tmp_path / "c", store, {})


# --- sweep ------------------------------------------------------------------------------------

TOKEN = "sweep-token"
BIG = 1_000_000


class DPOFakeEngine(fakes.ReloadableFakeEngine):
    """A reloadable fake engine reporting a DPO model of ``mode`` (``reference`` needs
    ``ref_model``, a folder): the policy is swapped, reference, mode and compat stay; every
    response carries extras (policy_logp = minus its token count)."""

    def __init__(self, *args, mode: str, ref_model: str | None = None, **kwargs):
        super().__init__(*args, extras_of=lambda ids: {"policy_logp": -float(len(ids)), "answer_tokens": len(ids)},
                         **kwargs)
        self.mode = mode
        self.ref_model = ref_model
        self.model = self._dpo(self.model)

    def _dpo(self, info: ModelInfo) -> ModelInfo:
        reference = "fp-ref" if self.ref_model is not None else None
        return ModelInfo(name=info.name, max_model_len=info.max_model_len, dtype=info.dtype,
                         fingerprint=dpo_fingerprint(info.fingerprint, reference, self.mode), engine=info.engine,
                         kind="dpo", mode=self.mode, ref_model=self.ref_model)

    async def reload_weights(self, path):
        await super().reload_weights(path)
        self.model = self._dpo(self.model)
        return self.loaded()


def _server(root, engine):
    from rmserve.server.http.app import ServerConfig, create_app

    def make_app():
        config = ServerConfig(port=0, admin_token=TOKEN, checkpoint_roots=(str(root),), retry_after_s=1)
        return create_app(config, engine, fakes.FakeRenderer(max_model_len=BIG))

    return ThreadedServer(make_app)


async def test_sweep_of_a_dpo_server_keeps_one_memo_per_mode(tmp_path):
    root = tmp_path / "run"
    start = fakes.write_fake_checkpoint(root / "init", 0.0)
    folders = [fakes.write_fake_checkpoint(root / f"step-{s}", float(s)) for s in (1, 2)]
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=3, n_code=2)
    store = tmp_path / "store.sqlite"

    def config():
        return SweepConfig(servers=(server.url,), checkpoints=tuple(folders), data=(("rm-bench", str(data)),),
                           out_dir=tmp_path / "out", store=store, admin_token=TOKEN, resamples=20, quiet=True,
                           server_wait_s=30.0)

    base = ModelInfo(name="policy", max_model_len=BIG, dtype="float32", fingerprint="fp-init", engine="fake")
    avg = DPOFakeEngine(model=base, checkpoint_dir=str(start), mode="avg")
    with _server(root, avg) as server:
        first = await sweep_async(config())
        assert [(r.n_scored, r.loaded) for r in first.runs] == [(5, True), (5, True)]
        again = await sweep_async(config())
        assert [(r.n_stored, r.loaded) for r in again.runs] == [(5, False), (5, False)]  # the avg memo
    assert json.loads((tmp_path / "out" / "sweep.json").read_text())["score_kind"] == {
        "kind": "dpo", "mode": "avg", "ref_model": None, "compat": "none"}

    avg_reloads = list(avg.reloads)
    norm = DPOFakeEngine(model=base, checkpoint_dir=str(start), mode="norm")
    with _server(root, norm) as server:
        other = await sweep_async(config())  # the same folders, another mode: loaded and scored
    assert [(r.n_scored, r.loaded) for r in other.runs] == [(5, True), (5, True)]
    assert len(avg_reloads) == 2 and len(norm.reloads) == 2
    with ScoreStore(store) as db:
        for run_avg, run_norm, folder in zip(first.runs, other.runs, folders, strict=True):
            assert run_avg.fingerprint != run_norm.fingerprint
            plain = checkpoint_signature(folder, "float32")
            assert db.fingerprint_for(plain) is None
            assert db.fingerprint_for(dpo_fingerprint(plain, None, "avg")) == run_avg.fingerprint
            assert db.fingerprint_for(dpo_fingerprint(plain, None, "norm")) == run_norm.fingerprint
            records = db.records(run_norm.fingerprint)
            assert {r.score_kind for r in records} == {ScoreKind("dpo", "norm")}
            assert all(r.extras["policy_logp"] == tuple(-float(t) for t in r.extras["answer_tokens"]) for r in records)
    exported = read_scores(tmp_path / "out" / "checkpoints" / "step-1" / "rm-bench.scores.jsonl").records
    assert {r.mode for r in exported} == {"norm"}



def test_cli_run_kind_dpo_builds_the_run_it_says(small_rmbench, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import rmserve.pipelines.launch as launch
    from rmserve.cli import app

    seen = []

    def fake_run(config):
        seen.append(config)
        raise errors.EngineNotReady("stop here (test)")

    monkeypatch.setattr(launch, "run", fake_run)
    policy = fake_checkpoint(tmp_path / "policy", b"\x01" * 512, causal_lm=True)
    ref = fake_checkpoint(tmp_path / "ref", b"\x02" * 512, causal_lm=True)
    args = ["run", str(policy), "--bench", "rm-bench", "--data", str(small_rmbench), "--out", str(tmp_path / "o"),
            "--store", str(tmp_path / "s.sqlite"), "--dtype", "float32", "--quiet"]
    CliRunner().invoke(app, [*args, "--kind", "dpo", "--ref-model", str(ref), "--compat", "official"])
    (config,) = seen
    assert dict(config.serve.engine_options) == {"kind": "dpo", "ref_model": str(ref), "compat": "official",
                                                 "dtype": "float32"}
    assert store_signature(config) == dpo_fingerprint(
        checkpoint_signature(policy, "float32"), checkpoint_signature(ref, "float32"), "reference", "official")
    refused = CliRunner().invoke(app, [*args, "--kind", "dpo"])
    assert refused.exit_code == 2 and len(seen) == 1
    assert "kind dpo needs exactly one" in " ".join(refused.output.replace("│", " ").split())


async def test_sweep_with_a_reference_keys_the_memo_by_the_reference_folder_too(tmp_path):
    root = tmp_path / "run"
    start = fakes.write_fake_checkpoint(root / "init", 0.0)
    folder = fakes.write_fake_checkpoint(root / "step-1", 1.0)
    ref = fake_checkpoint(tmp_path / "ref", b"\x02" * 512, causal_lm=True)
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=2, n_code=1)
    base = ModelInfo(name="policy", max_model_len=BIG, dtype="float32", fingerprint="fp-init", engine="fake")
    engine = DPOFakeEngine(model=base, checkpoint_dir=str(start), mode="reference", ref_model=str(ref))
    with _server(root, engine) as server:
        config = SweepConfig(servers=(server.url,), checkpoints=(folder,), data=(("rm-bench", str(data)),),
                             out_dir=tmp_path / "out", store=tmp_path / "s.sqlite", admin_token=TOKEN, resamples=20,
                             quiet=True, server_wait_s=30.0)
        (run_,) = (await sweep_async(config)).runs
        (again,) = (await sweep_async(config)).runs
    assert (run_.n_scored, again.loaded) == (3, False)
    signature = dpo_fingerprint(checkpoint_signature(folder, "float32"), checkpoint_signature(ref, "float32"),
                                "reference", "none")
    with ScoreStore(tmp_path / "s.sqlite") as db:
        assert db.fingerprint_for(signature) == run_.fingerprint
        assert {r.score_kind for r in db.records(run_.fingerprint)} == {ScoreKind("dpo", "reference", str(ref))}

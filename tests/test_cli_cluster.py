"""``rmserve cluster`` and the ``--ray`` options of ``eval`` and ``sweep``: what is refused
before Ray is reached, and the replica spec the options make (no Ray, no engine)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rmserve.cli import app
from rmserve.cli_cluster import checkpoint_root, replica_spec
from rmserve.cluster.replica import ReplicaSpec

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture
def folders(tmp_path):
    made = [tmp_path / "run" / f"step-{s}" for s in (10, 20)]
    for folder in made:
        folder.mkdir(parents=True)
    return made


@pytest.mark.parametrize("command", ["sweep", "eval"])
def test_server_or_ray_each_mistake_named(folders, tmp_path, command):
    common = [command, "--bench", "rm-bench", "--data", str(tmp_path), "--out", str(tmp_path / "out")]
    if command == "sweep":
        common += ["--checkpoints", str(folders[0])]
    cases = [
        ([], "give --server URL (running servers) or --ray ADDRESS (a Ray cluster)"),
        (["--server", "http://127.0.0.1:1", "--ray", "auto"], "--server and --ray exclude each other"),
        (["--cluster", "team"], "--cluster names a replica set on a Ray cluster: give --ray ADDRESS too"),
        (["--server", "http://127.0.0.1:1", "--cluster", "team"], "--cluster names a replica set on a Ray cluster"),
    ]
    for extra, words in cases:
        result = invoke(*common, *extra)
        assert result.exit_code == 2 and words in " ".join(result.output.split()), (extra, result.output)


def test_eval_with_ray_needs_a_cluster_or_a_model_and_not_both(tmp_path):
    common = ["eval", "--bench", "rm-bench", "--data", str(tmp_path), "--out", str(tmp_path / "out")]
    result = invoke(*common, "--ray", "auto")
    assert result.exit_code == 2 and "with --ray, give --cluster NAME (a running replica set) or --serve-model MODEL" \
        in " ".join(result.output.split())
    result = invoke(*common, "--ray", "auto", "--cluster", "team", "--serve-model", "m")
    assert result.exit_code == 2 and "--cluster and --serve-model exclude each other" in result.output
    result = invoke(*common, "--server", "http://127.0.0.1:1", "--serve-model", "m")
    assert result.exit_code == 2 and "--serve-model starts replicas on a Ray cluster: give --ray ADDRESS too" in \
        " ".join(result.output.split())


def test_eval_refuses_a_server_given_twice(tmp_path):
    result = invoke("eval", "--bench", "rm-bench", "--data", str(tmp_path), "--out", str(tmp_path / "out"),
                    "--server", "http://127.0.0.1:1", "--server", "http://127.0.0.1:1")
    assert result.exit_code == 2 and "a URL is given twice" in result.output


@pytest.mark.parametrize("arg", ["--port 9", "--host=0.0.0.0", "--parent-pid 3", "--replica x"])
def test_cluster_up_refuses_what_each_replica_sets_itself(arg):
    result = invoke("cluster", "up", "team", "some-model", "--serve-args", arg)
    option = arg.split("=")[0].split()[0]
    assert result.exit_code == 2 and f"{option} cannot be given: each replica" in result.output, result.output


def test_cluster_up_refuses_a_bad_name_and_bad_quoting():
    result = invoke("cluster", "up", "team one", "some-model")
    assert result.exit_code == 2 and "use 1 to 64 letters, digits" in result.output
    result = invoke("cluster", "up", "team", "some-model", "--serve-args", "--users-file 'unclosed")
    assert result.exit_code == 2 and "Invalid value for '--serve-args': No closing quotation" in result.output


def test_serve_args_that_rmserve_serve_does_not_know_are_refused_before_any_replica_starts(tmp_path):
    result = invoke("cluster", "up", "team", "some-model", "--serve-args", "--dtype float32 --bogus-flag x --no-such=1")
    assert result.exit_code == 2, result.output
    assert "'--serve-args': --bogus-flag, --no-such are not options of rmserve serve" in result.output
    (tmp_path / "step-1").mkdir()
    result = invoke("sweep", "--ray", "127.0.0.1:1", "--serve-args", "--max-model-lenn 512", "--checkpoints",
                    str(tmp_path / "step-1"), "--bench", "rm-bench", "--data", str(tmp_path), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2 and "--max-model-lenn is not an option of rmserve serve" in result.output
    result = invoke("cluster", "up", "team", "some-model", "--serve-args", "--dtype fp7")
    assert result.exit_code == 2 and "Invalid value for '--dtype'" in result.output and "'fp7'" in result.output


def test_without_ray_the_command_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails, as where the extra is not installed
    result = invoke("cluster", "status", "--ray", "auto")
    assert result.exit_code == 1
    assert "Ray is not installed here: install rmserve's [ray] extra" in result.output


def test_replica_spec_of_the_options(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("UNRELATED", "x")
    spec = replica_spec("m", engine_options={"dtype": "float32", "max_model_len": 4096},
                        serve_args="--users-file '/a b/users.jsonl'", extra=("--checkpoint-root", "/ckpts"),
                        gpus=2, cpus=4, host="127.0.0.1", admin_token="secret")
    assert spec.serve_args == ("--dtype", "float32", "--max-model-len", "4096", "--checkpoint-root", "/ckpts",
                               "--users-file", "/a b/users.jsonl")
    assert (spec.gpus, spec.cpus, spec.host) == (2, 4, "127.0.0.1")
    assert ("VLLM_CPU_KVCACHE_SPACE", "1") in spec.env and all(k != "UNRELATED" for k, _ in spec.env)
    assert "secret" not in repr(spec)


@pytest.mark.parametrize("kwargs, words", [
    ({"model": ""}, "model must be a path or hub id"),
    ({"gpus": -1}, "gpus must be a number ≥ 0"),
    ({"cpus": float("nan")}, "cpus must be a number ≥ 0"),
    ({"startup_timeout_s": 0}, "startup_timeout_s must be > 0"),
])
def test_replica_spec_limits(kwargs, words):
    with pytest.raises(ValueError, match=words):
        ReplicaSpec(**{"model": "m", **kwargs})


def test_checkpoint_root_is_the_deepest_common_parent(tmp_path):
    a, b = tmp_path / "run" / "x" / "step-1", tmp_path / "run" / "y" / "step-2"
    assert checkpoint_root([a, b]) == tmp_path / "run"
    assert checkpoint_root([a]) == Path(a).parent

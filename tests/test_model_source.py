"""A model argument is a folder or a hub id, told apart before any engine starts.

A path that does not exist used to go to the hub (five retries, a traceback, "check your
internet connection" 30 s later); an empty folder failed inside transformers ("Should have a
`model_type` key"). Both are now refused in milliseconds, naming MODEL and the path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rmserve.cli import app
from rmserve.server.swaps.checkpoints import check_model_source, model_folder

runner = CliRunner()


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "empty").mkdir(parents=True)
    (tmp_path / "weights.bin").write_bytes(b"")
    return tmp_path


@pytest.mark.parametrize("model", ["runs/demo-rmX", "./runs/demo-rmX", "/no/such/ckpt", "~/no-such-ckpt", "a/b/c",
                                   "has space/name", "C:\\ckpts\\rm"])
def test_a_path_that_does_not_exist_is_an_error_not_a_hub_id(workdir, model):
    with pytest.raises(ValueError) as info:
        model_folder(model)
    assert str(info.value) == (
        f"model: no folder {model!r} (looked in {workdir}); give an existing checkpoint folder, "
        "or a hub id of the form ORG/NAME"
    )


@pytest.mark.parametrize("model", ["Skywork/Skywork-Reward-V2-Llama-3.1-8B", "gpt2", "org/name_v1.5-x"])
def test_hub_ids_are_left_to_the_loader(workdir, model):
    assert model_folder(model) is None
    assert check_model_source(model, "classifier") is None


def test_a_file_is_not_a_checkpoint_folder(workdir):
    with pytest.raises(ValueError, match=r"^ref_model: 'weights.bin' is a file; give the checkpoint folder"):
        model_folder("weights.bin", "ref_model")


def test_an_existing_folder_is_checked_with_the_kind_s_rules(workdir):
    assert model_folder("runs/empty") == Path("runs/empty")
    with pytest.raises(ValueError, match=r"^model: checkpoint 'empty/config.json': is missing$"):
        check_model_source("runs/empty", "classifier")
    folder = workdir / "runs" / "policy"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForSequenceClassification"], "num_labels": 1}))
    with pytest.raises(ValueError, match=r"^ref_model: checkpoint 'policy/config.json': has architectures \['LlamaForSequenceClassification'\]; kind dpo needs a causal LM"):
        check_model_source(str(folder), "dpo", "ref_model")


@pytest.mark.parametrize("command", [["serve"], ["run", "--bench", "rm-bench", "--data", ".", "--out", "out"]])
def test_serve_and_run_refuse_a_missing_folder_before_any_engine_starts(workdir, command):
    result = runner.invoke(app, [command[0], "runs/demo-rmX", *command[1:]])
    assert result.exit_code == 2, result.output
    assert "Invalid value for 'MODEL': no folder 'runs/demo-rmX'" in " ".join(result.output.split())
    assert not (workdir / "out").exists()


def test_serve_refuses_an_empty_folder_naming_config_json(workdir):
    result = runner.invoke(app, ["serve", "runs/empty"])
    assert result.exit_code == 2
    assert "Invalid value for 'MODEL': checkpoint 'empty/config.json': is missing" in " ".join(result.output.split())


def test_a_missing_reference_model_is_named_by_its_flag(workdir):
    result = runner.invoke(app, ["serve", "org/policy", "--kind", "dpo", "--ref-model", "./ref-step-9"])
    assert result.exit_code == 2
    assert "Invalid value for '--ref-model': no folder './ref-step-9'" in " ".join(result.output.split())


@pytest.mark.parametrize(("model", "near"), [("demo_rm", "runs/demo-rm"), ("demo-rn", "runs/demo-rm"),
                                             ("run", "runs")])
def test_a_bare_name_close_to_a_folder_here_is_a_mistyped_folder(workdir, model, near):
    (workdir / "runs" / "demo-rm").mkdir()
    with pytest.raises(ValueError) as info:
        model_folder(model)
    assert str(info.value) == (
        f"model: no folder {model!r} (looked in {workdir}); did you mean {near!r}? (a hub id has the form ORG/NAME)"
    )


def test_a_bare_name_close_to_no_folder_stays_a_hub_id(workdir):
    (workdir / "runs" / "demo-rm").mkdir()
    assert model_folder("gpt2") is None
    assert model_folder("Skywork/demo_rm") is None  # ORG/NAME is a hub id even when NAME is close to a folder


def _folder_without_weights(workdir: Path) -> Path:
    folder = workdir / "runs" / "no-weights"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForSequenceClassification"], "num_labels": 1}))
    (folder / "tokenizer.json").write_text('{"version": "1.0"}')
    return folder


RUN_ARGS = ["--bench", "rm-bench", "--data", ".", "--out", "out"]


@pytest.mark.parametrize(("folder", "message"), [
    ("runs/empty", "Invalid value for 'MODEL': checkpoint 'empty/config.json': is missing"),
    ("runs/no-weights", "Invalid value for 'MODEL': checkpoint 'no-weights': has no weight files (*.safetensors or *.bin)"),
])
@pytest.mark.parametrize("command", [["serve"], ["run", *RUN_ARGS]], ids=["serve", "run"])
def test_run_checks_a_folder_s_files_as_serve_does_before_any_server_starts(workdir, monkeypatch, command, folder,
                                                                             message):
    from rmserve.pipelines import launch

    _folder_without_weights(workdir)

    def no_server(*args, **kwargs):
        raise AssertionError("a server was started")

    monkeypatch.setattr(launch, "ServerProcess", no_server)
    result = runner.invoke(app, [command[0], folder, *command[1:]], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.stderr.split())
    assert "internal_error" not in result.stderr and "exited with status" not in result.stderr
    assert not (workdir / "out").exists()


def test_run_checks_the_reference_model_s_files_too(workdir):
    policy = workdir / "runs" / "policy"
    policy.mkdir()
    (policy / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (policy / "tokenizer.json").write_text('{"version": "1.0"}')
    (policy / "model.safetensors").write_bytes(b"w")
    result = runner.invoke(app, ["run", "runs/policy", "--kind", "dpo", "--ref-model", "runs/empty", *RUN_ARGS],
                           terminal_width=400)
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--ref-model': checkpoint 'empty/config.json': is missing" in " ".join(result.stderr.split())

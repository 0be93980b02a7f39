"""``rmserve serve`` and ``rmserve demo-model``."""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import typer

from rmserve.cli_common import (
    MODEL_HELP_JUDGE_URL,
    Command,
    bad_parameter,
    check_model_sources,
    config_flags,
    field_help,
    model_argument,
    read_admin_token,
    with_default,
    with_engine_options,
)
from rmserve.server.config import EngineConfig

LOG_LEVELS = ("debug", "info", "warning", "error")
"""Accepted ``--log-level`` values."""

PARENT_POLL_S = 0.5
"""Seconds between two looks at the parent process (``--parent-pid``)."""


def _server_help(field: str) -> str:
    from rmserve.server.http.app import ServerConfig

    return field_help(ServerConfig, field, flags=config_flags())


def _given(**options: object) -> dict[str, object]:
    """The options the user set (None = leave the config default)."""
    return {name: value for name, value in options.items() if value is not None}


def _process_alive(pid: int) -> bool:
    """True while ``pid`` names a process that has not exited (a zombie counts as exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in (b"Z", b"X")


def watch_parent(pid: int, *, poll_s: float = PARENT_POLL_S, on_gone: Any = None) -> threading.Thread:
    """Stop this process (SIGTERM to itself, a clean shutdown) once process ``pid`` is gone.

    "Gone": ``pid`` has exited, or it was this process's parent and no longer is (the parent
    died and the process was re-parented). A daemon thread looks every ``poll_s`` seconds;
    ``on_gone`` (default: :func:`_stop_self`) is called once. Returns the thread.

    Raises:
        ValueError: ``pid`` is not a positive integer, or names no running process.
    """
    if not isinstance(pid, int) or pid <= 0:
        raise ValueError(f"--parent-pid: {pid!r} must be a positive process id")
    if not _process_alive(pid):
        raise ValueError(f"--parent-pid: no process {pid} is running")
    was_parent = os.getppid() == pid
    handled = [False]  # whether SIGTERM has been seen handled by the server (its event loop)

    def gone() -> bool:
        return (was_parent and os.getppid() != pid) or not _process_alive(pid)

    def loop() -> None:
        event = threading.Event()
        while not event.wait(poll_s):
            handled[0] = handled[0] or signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
            if gone():
                logging.getLogger("rmserve.server").warning("parent process %d is gone; stopping", pid)
                (on_gone or _stop_self)(handled[0])
                return

    thread = threading.Thread(target=loop, name=f"rmserve-watch-parent-{pid}", daemon=True)
    thread.start()
    return thread


def _stop_self(server_was_serving: bool) -> None:
    """SIGTERM to this process, unless it would cut a shutdown short.

    While the server serves, its event loop turns SIGTERM into a clean stop (a second one
    changes nothing). Before that (the engine is being built) the default action ends the
    process. After the server has removed its handler it is already shutting down (e.g. a
    parent-death signal came first): a SIGTERM then would end the engine's shutdown half-way,
    so none is sent.
    """
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None) and server_was_serving:
        return
    os.kill(os.getpid(), signal.SIGTERM)


@with_engine_options
def serve_command(
    model: Annotated[
        Optional[str],
        typer.Argument(metavar="MODEL", help=f"{field_help(EngineConfig, 'model')} {MODEL_HELP_JUDGE_URL}",
                       show_default=False),
    ] = None,
    *,
    engine_options: dict[str, Any],
    model_specs: Annotated[
        Optional[list[str]],
        typer.Option(
            "--model",
            metavar="NAME=PATH[,KEY=VALUE]",
            help="Serve several models from this server (repeat per model; instead of MODEL): one engine each, "
            "chosen by the request's model. KEY: gpu-memory-utilization or kv-cache-memory-bytes for that model "
            "alone; without one, a model gets an even share of --gpu-memory-utilization (and of "
            "--kv-cache-memory-bytes when given). Engines start one after another; the other engine options "
            "apply to every model.",
            show_default=False,
        ),
    ] = None,
    host: Annotated[
        Optional[str], typer.Option("--host", metavar="ADDRESS", help=_server_help("host"), show_default=False)
    ] = None,
    port: Annotated[Optional[int], typer.Option("--port", metavar="PORT", help=_server_help("port"), show_default=False)] = None,
    max_body_bytes: Annotated[
        Optional[int],
        typer.Option("--max-body-bytes", metavar="BYTES", help=_server_help("max_body_bytes"), show_default=False),
    ] = None,
    max_inflight_groups: Annotated[
        Optional[int],
        typer.Option("--max-inflight-groups", help=_server_help("max_inflight_groups"), show_default=False),
    ] = None,
    admin_token_file: Annotated[
        Optional[Path],
        typer.Option(
            "--admin-token-file",
            metavar="FILE",
            help=with_default(
                "File holding the admin token for POST /v1/models/load.",
                "the token in $RMSERVE_ADMIN_TOKEN; neither: the endpoint is disabled",
            ),
            show_default=False,
        ),
    ] = None,
    checkpoint_root: Annotated[
        Optional[list[Path]],
        typer.Option("--checkpoint-root", metavar="DIR", help="Folder checkpoint swaps may load from (repeatable).",
                     show_default=False),
    ] = None,
    wait_swap_s: Annotated[
        Optional[float],
        typer.Option("--wait-swap-s", metavar="SECONDS", help=_server_help("swap_wait_s"), show_default=False),
    ] = None,
    wait_drain_s: Annotated[
        Optional[float],
        typer.Option("--wait-drain-s", metavar="SECONDS", help=_server_help("swap_drain_timeout_s"), show_default=False),
    ] = None,
    result_cache_groups: Annotated[
        Optional[int],
        typer.Option("--result-cache-groups", help=_server_help("result_cache_groups"), show_default=False),
    ] = None,
    users_file: Annotated[
        Optional[Path], typer.Option("--users-file", metavar="FILE", help=_server_help("users_file"), show_default=False)
    ] = None,
    insecure_no_auth: Annotated[
        bool, typer.Option("--insecure-no-auth", help=_server_help("insecure_no_auth"), show_default=False)
    ] = False,
    fair_share: Annotated[
        Optional[bool],
        typer.Option("--fair-share/--no-fair-share", help=_server_help("fair_share"), show_default=False),
    ] = None,
    engine_concurrency_groups: Annotated[
        Optional[int],
        typer.Option(
            "--engine-concurrency-groups", help=_server_help("engine_concurrency_groups"), show_default=False
        ),
    ] = None,
    engine_window_tokens: Annotated[
        Optional[int],
        typer.Option("--engine-window-tokens", help=_server_help("engine_window_tokens"), show_default=False),
    ] = None,
    fair_share_quantum_tokens: Annotated[
        Optional[int],
        typer.Option(
            "--fair-share-quantum-tokens", help=_server_help("fair_share_quantum_tokens"), show_default=False
        ),
    ] = None,
    fair_share_interactive_boost: Annotated[
        Optional[float],
        typer.Option(
            "--fair-share-interactive-boost", metavar="FACTOR", help=_server_help("fair_share_interactive_boost"),
            show_default=False,
        ),
    ] = None,
    lease_idle_s: Annotated[
        Optional[float],
        typer.Option("--lease-idle-s", metavar="SECONDS", help=_server_help("lease_idle_s"), show_default=False),
    ] = None,
    policy_template: Annotated[
        Optional[str],
        typer.Option("--policy-template", metavar="NAME|FILE", help=_server_help("policy_template"),
                     show_default=False),
    ] = None,
    training_log: Annotated[
        Optional[Path],
        typer.Option("--training-log", metavar="FILE", help=_server_help("training_log"), show_default=False),
    ] = None,
    training_log_rate: Annotated[
        Optional[float],
        typer.Option("--training-log-rate", metavar="FRACTION", help=_server_help("training_log_rate"),
                     show_default=False),
    ] = None,
    training_log_text: Annotated[
        bool, typer.Option("--training-log-text", help=_server_help("training_log_text"), show_default=False)
    ] = False,
    log_level: Annotated[
        Literal[LOG_LEVELS],  # type: ignore[valid-type]
        typer.Option(
            "--log-level",
            case_sensitive=False,
            help="Least severe log level written to stderr for rmserve's own loggers (other libraries: warning and "
            "above).",
        ),
    ] = "info",
    replica: Annotated[
        Optional[str],
        typer.Option("--replica", metavar="LABEL", help=_server_help("replica"), show_default=False),
    ] = None,
    parent_pid: Annotated[
        Optional[int],
        typer.Option(
            "--parent-pid",
            metavar="PID",
            help="Shut down cleanly once process PID (≥ 1) is gone (rmserve run passes its own pid).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve a reward model over HTTP: POST /v1/score, GET /health, /v1/models, /metrics.

    The listener starts at once (/health answers 503 while the model loads); the URL is printed when the model is ready. SIGINT/SIGTERM shut down cleanly.
    """  # noqa: E501 - typer keeps docstring line breaks in --help
    from rmserve.server.http.app import ServerConfig
    from rmserve.server.http.serve import configure_logging, serve, serve_node

    if log_level.lower() not in LOG_LEVELS:
        raise typer.BadParameter(f"{log_level!r} is not one of {', '.join(LOG_LEVELS)}", param_hint="'--log-level'")

    def configs() -> tuple[list[EngineConfig], ServerConfig]:
        if model_specs:
            from rmserve.server.config import ModelSpec, node_engine_configs

            if model is not None:
                raise ValueError(f"give MODEL ({model}) or --model NAME=PATH, not both")
            if engine_options.get("served_model_name") is not None:
                raise ValueError("--served-model-name: with --model NAME=PATH each model is named by its NAME")
            specs = [ModelSpec.parse(text) for text in model_specs]
            engine_configs = node_engine_configs(EngineConfig(model=specs[0].path, **engine_options), specs)
        else:
            engine_configs = [EngineConfig(model=model_argument(model, engine_options), **engine_options)]
        for engine_config in engine_configs:  # a missing folder or a bad config.json, before any engine starts
            check_model_sources(engine_config)
        server_config = ServerConfig(
            **_given(
                host=host,
                port=port,
                max_body_bytes=max_body_bytes,
                max_inflight_groups=max_inflight_groups,
                served_model_name=engine_options.get("served_model_name"),
                admin_token=read_admin_token(admin_token_file),
                checkpoint_roots=tuple(str(root) for root in checkpoint_root) if checkpoint_root else None,
                swap_wait_s=wait_swap_s,
                swap_drain_timeout_s=wait_drain_s,
                result_cache_groups=result_cache_groups,
                users_file=str(users_file) if users_file is not None else None,
                insecure_no_auth=insecure_no_auth or None,
                fair_share=fair_share,
                engine_concurrency_groups=engine_concurrency_groups,
                engine_window_tokens=engine_window_tokens,
                fair_share_quantum_tokens=fair_share_quantum_tokens,
                fair_share_interactive_boost=fair_share_interactive_boost,
                lease_idle_s=lease_idle_s,
                policy_template=policy_template,
                training_log=str(training_log) if training_log is not None else None,
                training_log_rate=training_log_rate,
                training_log_text=training_log_text or None,
                replica=replica,
            )
        )
        if parent_pid is not None:
            watch_parent(parent_pid)
        return engine_configs, server_config

    engine_configs, server_config = bad_parameter(configs)
    configure_logging(log_level)
    from rmserve.server.http.group_reaper import start_group_reaper

    start_group_reaper()  # the engine's processes go with this one, however it ends
    if model_specs:
        code = serve_node(engine_configs, server_config, announce=lambda line: typer.echo(line))
    else:
        code = serve(engine_configs[0], server_config, announce=lambda line: typer.echo(line))
    if code:
        raise typer.Exit(code)

def demo_model_command(
    out: Annotated[Path, typer.Argument(metavar="OUT", help="Folder to create (must not exist or be empty).", show_default=False)],
    corpus: Annotated[
        Path,
        typer.Option(
            "--corpus",
            metavar="PATH",
            help="Tokenizer training text: a file or folder (.json/.jsonl benchmark records, .txt, .md).",
            show_default=False,
        ),
    ],
    layers: Annotated[int, typer.Option("--layers", help="Decoder layers (≥ 1).")] = 2,
    hidden: Annotated[int, typer.Option(
        "--hidden", help="Hidden size (≥ 1): a multiple of --heads, with a head dim (--hidden/--heads) of at least 32.")] = 128,
    heads: Annotated[int, typer.Option("--heads", help="Attention heads (≥ 1).")] = 4,
    kv_heads: Annotated[int, typer.Option("--kv-heads", help="Key/value heads (≥ 1; must divide --heads).")] = 2,
    intermediate: Annotated[int, typer.Option("--intermediate", help="MLP size (≥ 1).")] = 352,
    vocab: Annotated[int, typer.Option("--vocab", help="Tokenizer vocabulary target (300 to 65536).")] = 2000,
    seed: Annotated[int, typer.Option("--seed", help="Weight seed (≥ 0); same seed and corpus give identical files.")] = 0,
    max_len: Annotated[int, typer.Option("--max-len", help="Max positions / tokenizer model_max_length (≥ 16).")] = 4096,
    head: Annotated[
        Literal["reward", "causal", "gated", "qwen2-rm", "internlm2-rm", "inf-orm", "grm", "ldl"],
        typer.Option(
            "--head",
            help="reward: a one-label reward head (LlamaForSequenceClassification, for serve --kind classifier or "
            "length); causal: a language-model head (LlamaForCausalLM: a DPO policy or reference, or a judge, for "
            "--kind dpo or judge; two seeds make a pair); gated: a multi-objective reward model with a softmax gate "
            "that ships its own modeling code, as ArmoRM does (serve with --trust-remote-code --engine hf); qwen2-rm: "
            "a per-token value model, Qwen2ForRewardModel as Qwen2.5-Math-RM (family qwen2; the token-value head, "
            "on vLLM); internlm2-rm: InternLM2ForRewardModel, its reward read at a reward token appended to every "
            "sequence, as internlm2-7b-reward (the reward-token head, on vLLM with --trust-remote-code for its "
            "config class); inf-orm: INFORMForSequenceClassification, a two-layer MLP score head as "
            "INF-ORM-Llama3.1-70B (family demo or llama3; the mlp-value head, on --engine hf); grm: GRewardModel, a "
            "decoder and a value head v_head.summary as the GRM reward models (the value-head head, on --engine hf); "
            "ldl: a decoder with regression_layer.pt and gating_layer.pt beside it as LDL-Reward-Gemma-2-27B (serve "
            "with --head label-distribution --engine hf).",
        ),
    ] = "reward",
    objectives: Annotated[
        int, typer.Option("--objectives", help="Objectives of a gated reward model (1 to 64).")
    ] = 4,
    family: Annotated[
        str,
        typer.Option(
            "--family",
            metavar="FAMILY",
            help="Model family: its architecture class, tokenizer rules (special tokens, BOS/EOS) and chat template: "
            "demo (Llama, rmserve's own template), llama3 (BOS written by the template and added by the tokenizer), "
            "qwen2 (ChatML, no BOS, Qwen2.5's default system turn), qwen3 (ChatML with the <think> block), gemma2 "
            "(no system role, the assistant is 'model'), mistral ([INST], BOS added by the tokenizer only).",
        ),
    ] = "demo",
    labels: Annotated[  # not num_labels: serve's help names the config key num_labels, which is no flag there
        int,
        typer.Option("--num-labels", help="Labels of a reward head (1 to 64); a model with more than one is served "
                     "with --label-index or --label-weights (the multi-label head)."),
    ] = 1,
) -> None:
    """Build a tiny RANDOM-WEIGHT reward model (a *ForSequenceClassification, 1 label) or causal LM of a model family for tests and benchmarks.

    Its rewards are reproducible but meaningless. No download: the tokenizer is trained on --corpus.
    """  # noqa: E501 - typer keeps docstring line breaks in --help
    from rmserve.cli_common import guarded
    from rmserve.demo_model import RANDOM_WEIGHTS_WARNING, DemoModelConfig, build_demo_model

    config = bad_parameter(
        lambda: DemoModelConfig(
            layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
            intermediate=intermediate, vocab=vocab, seed=seed, max_len=max_len, kind=head, num_labels=labels,
            objectives=objectives, family="qwen2" if head == "qwen2-rm" and family == "demo" else family,
        )
    )
    banner = "!" * 78
    typer.secho(f"{banner}\n{RANDOM_WEIGHTS_WARNING}\n{banner}", fg=typer.colors.RED, bold=True, err=True)
    report = guarded(lambda: bad_parameter(lambda: build_demo_model(out, corpus, config)), input_option="--corpus")
    typer.echo(
        f"wrote {report.path}: {report.num_parameters:,} parameters, vocab {report.vocab_size}, "
        f"head dim {report.head_dim}, weights sha256 {report.weights_sha256[:16]}",
        err=True,  # a status line: stdout is left empty
    )
    typer.secho("RANDOM WEIGHTS: the rewards of this model mean nothing.", fg=typer.colors.RED, bold=True, err=True)


def register(app: typer.Typer) -> None:
    """Add the server commands to ``app``."""
    app.command("serve", cls=Command, short_help="Serve a reward model over HTTP.")(serve_command)
    app.command("demo-model", cls=Command, short_help="Build a tiny random-weight model for tests.")(
        demo_model_command
    )

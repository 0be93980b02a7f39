"""``rmserve serve`` and ``rmserve demo-model``."""

from __future__ import annotations

import ast
import inspect
from functools import cache
from pathlib import Path
from typing import Optional

import typer


@cache
def _attribute_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a config dataclass (the string literal after each field)."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for field, doc in zip(body, body[1:]):
        if (
            isinstance(field, ast.AnnAssign)
            and isinstance(field.target, ast.Name)
            and isinstance(doc, ast.Expr)
            and isinstance(doc.value, ast.Constant)
            and isinstance(doc.value.value, str)
        ):
            docs[field.target.id] = " ".join(doc.value.value.split())
    return docs


def _engine_help(field: str) -> str:
    """Help text of an ``EngineConfig`` field, with its default when it has a non-None one."""
    import dataclasses

    from rmserve.server.config import EngineConfig

    text = _attribute_docs(EngineConfig).get(field, "")
    default = {f.name: f.default for f in dataclasses.fields(EngineConfig)}.get(field, dataclasses.MISSING)
    if default is not dataclasses.MISSING and default is not None and "default" not in text.lower():
        text = f"{text} Default: {default}."
    return text


def _server_help(field: str) -> str:
    from rmserve.server.app import ServerConfig

    return _attribute_docs(ServerConfig).get(field, "")


def _given(**options: object) -> dict[str, object]:
    """The options the user set (None = leave the config default)."""
    return {name: value for name, value in options.items() if value is not None}


ADMIN_TOKEN_ENV = "RMSERVE_ADMIN_TOKEN"
"""Environment variable holding the admin token when ``--admin-token-file`` is not given."""


def _admin_token(token_file: Path | None) -> str | None:
    """The admin token: the file's stripped text, else ``$RMSERVE_ADMIN_TOKEN``, else None.

    Raises:
        ValueError: the file cannot be read or is empty.
    """
    import os

    if token_file is None:
        return os.environ.get(ADMIN_TOKEN_ENV) or None
    try:
        token = token_file.read_text().strip()
    except OSError as exc:
        raise ValueError(f"--admin-token-file {str(token_file)!r} cannot be read: {exc.strerror}") from None
    if not token:
        raise ValueError(f"--admin-token-file {str(token_file)!r} is empty")
    return token


def serve_command(
    model: str = typer.Argument(..., help=_engine_help("model")),
    engine: Optional[str] = typer.Option(None, "--engine", help=_engine_help("engine")),
    dtype: Optional[str] = typer.Option(None, "--dtype", help=_engine_help("dtype")),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", help=_engine_help("max_model_len")),
    block_size: Optional[int] = typer.Option(None, "--block-size", help=_engine_help("block_size")),
    gpu_memory_utilization: Optional[float] = typer.Option(
        None, "--gpu-memory-utilization", help=_engine_help("gpu_memory_utilization")
    ),
    kv_cache_memory_bytes: Optional[int] = typer.Option(
        None, "--kv-cache-memory-bytes", help=_engine_help("kv_cache_memory_bytes")
    ),
    tensor_parallel_size: Optional[int] = typer.Option(
        None, "--tensor-parallel-size", help=_engine_help("tensor_parallel_size")
    ),
    chat_template: Optional[Path] = typer.Option(None, "--chat-template", help=_engine_help("chat_template")),
    served_model_name: Optional[str] = typer.Option(
        None, "--served-model-name", help=_engine_help("served_model_name")
    ),
    enforce_eager: bool = typer.Option(False, "--enforce-eager", help=_engine_help("enforce_eager")),
    max_num_batched_tokens: Optional[int] = typer.Option(
        None, "--max-num-batched-tokens", help=_engine_help("max_num_batched_tokens")
    ),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", help=_engine_help("max_num_seqs")),
    cpu_threads_bind: Optional[str] = typer.Option(None, "--cpu-threads-bind", help=_engine_help("cpu_threads_bind")),
    host: Optional[str] = typer.Option(None, "--host", help=_server_help("host")),
    port: Optional[int] = typer.Option(None, "--port", help=_server_help("port")),
    max_body_bytes: Optional[int] = typer.Option(None, "--max-body-bytes", help=_server_help("max_body_bytes")),
    max_inflight_groups: Optional[int] = typer.Option(
        None, "--max-inflight-groups", help=_server_help("max_inflight_groups")
    ),
    admin_token_file: Optional[Path] = typer.Option(
        None, "--admin-token-file",
        help="File holding the admin token for POST /v1/models/load (else env RMSERVE_ADMIN_TOKEN; "
        "neither = endpoint disabled).",
    ),
    checkpoint_root: Optional[list[Path]] = typer.Option(
        None, "--checkpoint-root", help="Folder checkpoint swaps may load from (repeatable)."
    ),
    swap_wait_s: Optional[float] = typer.Option(None, "--swap-wait-s", help=_server_help("swap_wait_s")),
    swap_drain_timeout_s: Optional[float] = typer.Option(
        None, "--swap-drain-timeout-s", help=_server_help("swap_drain_timeout_s")
    ),
    result_cache_groups: Optional[int] = typer.Option(
        None, "--result-cache-groups", help=_server_help("result_cache_groups")
    ),
) -> None:
    """Serve a reward model over HTTP: POST /v1/score, GET /health, /v1/models, /metrics.

    The listener starts at once (/health answers 503 while the model loads); the URL is printed when the model is ready. SIGINT/SIGTERM shut down cleanly.
    """  # noqa: E501 - typer keeps docstring line breaks in --help
    from rmserve.server.app import ServerConfig
    from rmserve.server.config import EngineConfig
    from rmserve.server.serve import serve

    try:
        admin_token = _admin_token(admin_token_file)
        engine_config = EngineConfig(
            model=model,
            enforce_eager=enforce_eager,
            **_given(
                engine=engine,
                dtype=dtype,
                max_model_len=max_model_len,
                block_size=block_size,
                gpu_memory_utilization=gpu_memory_utilization,
                kv_cache_memory_bytes=kv_cache_memory_bytes,
                tensor_parallel_size=tensor_parallel_size,
                chat_template=chat_template,
                served_model_name=served_model_name,
                max_num_batched_tokens=max_num_batched_tokens,
                max_num_seqs=max_num_seqs,
                cpu_threads_bind=cpu_threads_bind,
            ),
        )
        server_config = ServerConfig(
            **_given(
                host=host,
                port=port,
                max_body_bytes=max_body_bytes,
                max_inflight_groups=max_inflight_groups,
                served_model_name=served_model_name,
                admin_token=admin_token,
                checkpoint_roots=tuple(str(root) for root in checkpoint_root) if checkpoint_root else None,
                swap_wait_s=swap_wait_s,
                swap_drain_timeout_s=swap_drain_timeout_s,
                result_cache_groups=result_cache_groups,
            )
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    code = serve(engine_config, server_config, announce=lambda line: typer.echo(line))
    if code:
        raise typer.Exit(code)


def demo_model_command(
    out: Path = typer.Argument(..., help="Folder to create (must not exist or be empty)."),
    corpus: Path = typer.Option(
        ..., "--corpus", help="Tokenizer training text: a file or folder (.json/.jsonl benchmark records, .txt, .md)."
    ),
    layers: int = typer.Option(2, "--layers", help="Decoder layers (≥ 1)."),
    hidden: int = typer.Option(128, "--hidden", help="Hidden size; hidden/heads (head dim) must be ≥ 32."),
    heads: int = typer.Option(4, "--heads", help="Attention heads."),
    kv_heads: int = typer.Option(2, "--kv-heads", help="Key/value heads (divides heads)."),
    intermediate: int = typer.Option(352, "--intermediate", help="MLP size."),
    vocab: int = typer.Option(2000, "--vocab", help="Tokenizer vocabulary target (300…65536)."),
    seed: int = typer.Option(0, "--seed", help="Weight seed; same seed and corpus give identical files."),
    max_len: int = typer.Option(4096, "--max-len", help="Max positions / tokenizer model_max_length (≥ 16)."),
) -> None:
    """Build a tiny RANDOM-WEIGHT reward model (LlamaForSequenceClassification, 1 label) for tests and benchmarks.

    Its rewards are reproducible but meaningless. No download: the tokenizer is trained on --corpus.
    """  # noqa: E501 - typer keeps docstring line breaks in --help
    from rmserve.errors import DataError
    from rmserve.demo_model import RANDOM_WEIGHTS_WARNING, DemoModelConfig, build_demo_model

    try:
        config = DemoModelConfig(
            layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
            intermediate=intermediate, vocab=vocab, seed=seed, max_len=max_len,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    banner = "!" * 78
    typer.secho(f"{banner}\n{RANDOM_WEIGHTS_WARNING}\n{banner}", fg=typer.colors.RED, bold=True, err=True)
    try:
        report = build_demo_model(out, corpus, config)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    except DataError as exc:
        raise typer.BadParameter(f"--corpus: {exc}") from None
    typer.echo(
        f"wrote {report.path}: {report.num_parameters:,} parameters, vocab {report.vocab_size}, "
        f"head dim {report.head_dim}, weights sha256 {report.weights_sha256[:16]}"
    )
    typer.secho("RANDOM WEIGHTS: the rewards of this model mean nothing.", fg=typer.colors.RED, bold=True, err=True)


def register(app: typer.Typer) -> None:
    """Add the server commands to ``app``."""
    app.command("serve")(serve_command)
    app.command("demo-model")(demo_model_command)

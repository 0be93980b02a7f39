"""Checks of a checkpoint swap (``POST /v1/models/load``): token, path, and which kind of swap.

A swap is a ``reload`` (new weights into the running engine: same architecture/shape and
tokenizer) or a ``restart`` (the engine shuts its model down and starts the new checkpoint
with the same settings otherwise: any architecture or tokenizer). :func:`plan_swap` picks one
from the two checkpoints' ``config.json`` and tokenizer files and the engine's capabilities.

No torch, no vllm: these run on the event loop (file reads of a few KiB) before the app
drains scoring and hands the swap to the engine.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from rmserve.fingerprint import TOKENIZER_FILES
from rmserve.server.protocol import SupportsRestart, SupportsWeightReload

from rmserve.errors import Conflict, Forbidden, Unauthorized

SHAPE_KEYS: tuple[str, ...] = (
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "num_labels",
    "torch_dtype",
    "tie_word_embeddings",
)
"""``config.json`` keys that must match for weights to load into the running engine."""

RESTART_HINT = "restart the server on it (this engine cannot restart itself on another checkpoint)"

SwapKind = Literal["reload", "restart"]
"""``reload``: weights loaded into the running engine; ``restart``: the engine restarted on the checkpoint."""


def check_admin_token(authorization: str | None, admin_token: str | None) -> None:
    """Check the ``Authorization: Bearer <token>`` header against the configured token.

    Raises:
        Forbidden: no admin token is configured (the endpoint is disabled).
        Unauthorized: the header is missing, not ``Bearer``, or the token is wrong
            (compared in constant time).
    """
    if admin_token is None:
        raise Forbidden(
            "checkpoint swap is disabled: the server was started without an admin token "
            "(--admin-token-file or RMSERVE_ADMIN_TOKEN)"
        )
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), admin_token.encode()):
        raise Unauthorized("missing or wrong admin token (header Authorization: Bearer <token>)")


def resolve_checkpoint(path: str, roots: Sequence[str]) -> Path:
    """The checkpoint folder ``path`` resolved (symlinks followed), if it lies under a root.

    Args:
        path: the requested folder (absolute, or relative to the server's working directory).
        roots: the allowed checkpoint roots (``--checkpoint-root``), each resolved too.

    Raises:
        Forbidden (field ``path``): no roots configured; the path does not exist; it
            resolves outside every root (a symlink inside a root that points out of it
            included); or it is not a folder.
    """
    if not roots:
        raise Forbidden("no checkpoint roots are configured (--checkpoint-root); nothing may be loaded", field="path")
    try:
        resolved = Path(path).resolve(strict=True)
    except (OSError, RuntimeError):
        raise Forbidden(f"checkpoint path {path!r} does not exist under a checkpoint root", field="path") from None
    if not any(resolved.is_relative_to(Path(root).resolve()) for root in roots):
        raise Forbidden(f"checkpoint path {path!r} resolves outside the checkpoint roots", field="path")
    if not resolved.is_dir():
        raise Forbidden(f"checkpoint path {path!r} is not a folder", field="path")
    return resolved


def _shape(folder: Path) -> dict[str, object]:
    file = folder / "config.json"
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise Conflict(f"checkpoint {folder.name!r} has no readable config.json: {type(exc).__name__}", field="path") from None
    return {key: config.get(key) for key in SHAPE_KEYS}


def reload_blocker(current: Path, new: Path) -> str | None:
    """Why ``new`` cannot be reloaded into the engine serving ``current``; None when it can.

    Compares the :data:`SHAPE_KEYS` of both ``config.json`` files and the bytes of every
    tokenizer file (:data:`~rmserve.fingerprint.TOKENIZER_FILES`) present in either.

    Returns:
        None (same architecture/shape and tokenizer), or a sentence naming the differing
        config keys (old → new) or the first differing tokenizer file.

    Raises:
        Conflict (409, field ``path``): a ``config.json`` is missing or not JSON.
    """
    old_shape, new_shape = _shape(current), _shape(new)
    differing = [key for key in SHAPE_KEYS if old_shape[key] != new_shape[key]]
    if differing:
        detail = ", ".join(f"{k}: {old_shape[k]!r} → {new_shape[k]!r}" for k in differing)
        return f"checkpoint {new.name!r} has a different architecture/shape ({detail})"
    for name in TOKENIZER_FILES:
        a, b = current / name, new / name
        old_bytes = a.read_bytes() if a.is_file() else None
        new_bytes = b.read_bytes() if b.is_file() else None
        if old_bytes != new_bytes:
            return f"checkpoint {new.name!r} has a different tokenizer ({name} differs)"
    return None


def check_compatible(current: Path, new: Path) -> None:
    """Check that ``new`` has the loaded checkpoint's architecture/shape and tokenizer.

    Raises:
        Conflict (409, field ``path``): :func:`reload_blocker` found a difference (the
            message names it and says a restart is needed), or a ``config.json`` is unreadable.
    """
    blocker = reload_blocker(current, new)
    if blocker is not None:
        raise Conflict(f"{blocker}; {RESTART_HINT}", field="path")


def plan_swap(engine: object, current: Path | None, new: Path) -> tuple[SwapKind, str | None]:
    """Which swap loads ``new`` into ``engine`` (serving the checkpoint folder ``current``).

    - ``reload`` when the engine supports in-place reload and ``new`` has the same
      architecture/shape and tokenizer (or ``current`` is unknown: a hub id, or an engine
      that does not say — then nothing can be compared and the reload is tried);
    - ``restart`` when the checkpoints differ, or the engine cannot reload in place, and it
      can restart itself and ``current`` is a known folder (so a failed restart can be
      undone by restarting on it).

    Returns:
        ``(kind, reason)``: ``reason`` says why a reload was not possible (None for a reload).

    Raises:
        Conflict (409, field ``path``): neither kind applies (the message names the
            difference and says to restart the server), or a ``config.json`` is unreadable.
    """
    can_reload = isinstance(engine, SupportsWeightReload)
    can_restart = isinstance(engine, SupportsRestart) and current is not None
    if current is None:
        blocker = None if can_reload else "the engine cannot reload weights in place"
    else:
        blocker = reload_blocker(current, new)
        if blocker is None and not can_reload:
            blocker = "the engine cannot reload weights in place"
    if blocker is None:
        return "reload", None
    if can_restart:
        return "restart", blocker
    if current is None and isinstance(engine, SupportsRestart):
        raise Conflict(
            f"{blocker}, and the loaded model is not a local checkpoint folder, so a failed restart could "
            f"not be undone; restart the server on it",
            field="path",
        )
    raise Conflict(f"{blocker}; {RESTART_HINT}", field="path")

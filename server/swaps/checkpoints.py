"""What can be known about a checkpoint folder from its files, before any engine touches it.

A checkpoint swap (``POST /v1/models/load``) used to find out that a folder could not be
served only when the engine failed to load it: the engine stopped, the restart failed, the
previous checkpoint was restarted, and minutes later the reply was a 500. Everything that
the files themselves decide is checked here instead, in milliseconds, on a few KiB of JSON:

- ``config.json`` exists and is a JSON object;
- the kind's architecture rule (:func:`architecture_problem`, also what a server checks at
  start): for a sequence-classifier reward model a head rmserve serves under the server's head
  settings (:func:`rmserve.server.kinds.heads.resolve_head`: a one-label
  ``*ForSequenceClassification``, one with more labels and a label index or weights, or a causal
  LM named with ``--head lm-logit``; labels counted as transformers counts them — the length of
  ``id2label`` when present, else ``num_labels``, else transformers' default of 2) and, at a
  swap, the head of the model served (:func:`~rmserve.server.kinds.heads.swap_head_problem`: a
  swap never changes the head); for a DPO policy (kind ``dpo``) a causal-LM architecture
  (``*ForCausalLM`` / ``*LMHeadModel``);
- tokenizer files: at least one of :data:`~rmserve.fingerprint.TOKENIZER_FILES`, and every
  JSON one among them parses;
- weights: a ``*.safetensors`` or ``*.bin`` file, or an index (``*.index.json``) whose every
  shard is present.

A refusal is :class:`~rmserve.errors.InvalidCheckpoint` (422) naming the folder, the file and
the rule; the engine and the served model are untouched. No torch, no transformers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rmserve.fingerprint import TOKENIZER_FILES
from rmserve.server.kinds.heads import (  # noqa: F401 - the architecture names are re-exported
    CAUSAL_LM_SUFFIXES,
    CLASSIFIER_SUFFIX,
    TRANSFORMERS_DEFAULT_NUM_LABELS,
    HeadProblem,
    HeadSettings,
    head_hint,
    swap_head_problem,
    is_causal_lm_architecture,
    is_classifier_architecture,
    num_labels,
    resolve_head,
)

from rmserve.errors import InvalidCheckpoint
from rmserve.schema import CLASSIFIER_KIND, DPO_KIND, JUDGE_KIND, LENGTH_KIND, ModelKind, RewardHead

WEIGHT_SUFFIXES: tuple[str, ...] = (".safetensors", ".bin")
"""File suffixes that hold weights (safetensors, PyTorch pickles)."""


def _refuse(folder: Path, message: str, file: str | None = None) -> InvalidCheckpoint:
    where = f"{folder.name}/{file}" if file else folder.name
    return InvalidCheckpoint(f"checkpoint {where!r}: {message}", field="path")


def _read_json(folder: Path, name: str) -> Any:
    try:
        return json.loads((folder / name).read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise _refuse(folder, "is missing", name) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _refuse(folder, f"is not readable JSON ({type(exc).__name__}: {exc})", name) from None


CAUSAL_LM_KINDS: tuple[ModelKind, ...] = (DPO_KIND, JUDGE_KIND)
"""Kinds whose model must be a causal LM with an LM head (a DPO policy and its reference; a local judge)."""


def architecture_problem(
    kind: ModelKind, config: Mapping[str, Any], head: HeadSettings | None = None, folder: Path | None = None,
) -> str | None:
    """Why a model with this config cannot be served as ``kind``; None when it can.

    The one statement of the architecture rules, for the start checks
    (:func:`rmserve.server.config.check_reward_head`, :func:`rmserve.server.config.check_lm_head`:
    ``ServerFault``) and the swap check (:func:`check_config`: ``InvalidCheckpoint``); each site
    reads the config and prefixes the model or file it names.

    Args:
        kind: ``classifier`` (a head rmserve serves under ``head``:
            :func:`rmserve.server.kinds.heads.resolve_head`), ``dpo`` or ``judge`` (a causal LM:
            an architecture ending in one of :data:`CAUSAL_LM_SUFFIXES`); other kinds have no
            architecture rule.
        config: the model config as a mapping (``config.json`` content or ``AutoConfig.to_dict()``).
        head: kind ``classifier``: the server's head settings (None: none given, the head is
            found from the config).
        folder: the checkpoint folder, when local: a refused head's message may name what lies
            in it (:func:`~rmserve.server.kinds.heads.head_hint`).

    Returns:
        The rule broken, starting with ``has``: the architectures or label count found, the rule
        and the fix (an unknown head names the heads rmserve knows and ``--head``; a causal LM
        offered as a classifier is told ``--head lm-logit`` and ``--kind dpo``, a classifier
        offered as a causal LM ``--kind classifier``).
    """
    architectures = list(config.get("architectures") or [])
    if kind == CLASSIFIER_KIND:
        try:
            resolve_head(config, head or HeadSettings())
        except HeadProblem as problem:
            return f"{problem}{head_hint(str(problem), config, head or HeadSettings(), folder)}"
        return None
    if kind not in CAUSAL_LM_KINDS or any(is_causal_lm_architecture(a) for a in architectures):
        return None
    if any(is_classifier_architecture(a) for a in architectures):
        fix = "it is a reward classifier: serve it with --kind classifier, or give a DPO-trained causal LM"
    elif kind == JUDGE_KIND:
        fix = "give a chat model (a causal LM with a chat template)"
    else:
        fix = "give a causal LM checkpoint (the DPO policy, or the model it was trained from)"
    return (
        f"has architectures {architectures!r}; kind {kind} needs a causal LM with an LM head "
        f"(*ForCausalLM or *LMHeadModel); {fix}"
    )


def check_config(
    folder: Path, kind: ModelKind = CLASSIFIER_KIND, head: HeadSettings | None = None,
    served_head: RewardHead | None = None,
) -> dict[str, Any]:
    """Read ``folder/config.json`` and check it describes a model of ``kind``; returns the config.

    Args:
        folder: a local checkpoint folder.
        kind: the kind served; its architecture rule is :func:`architecture_problem`'s (kinds
            without one: only readability is checked).
        head: kind ``classifier``: the server's head settings (None: found from the config).
        served_head: kind ``classifier``, at a swap: the head of the model served; the
            folder's head (under ``head``) must be the same
            (:func:`~rmserve.server.kinds.heads.swap_head_problem`). None: not compared.

    Raises:
        InvalidCheckpoint (422, field ``path``): missing or unreadable config, not a JSON
            object, the rule :func:`architecture_problem` names, or another head than the
            served one, naming both (prefixed with ``checkpoint 'FOLDER/config.json':``).
    """
    config = _read_json(folder, "config.json")
    if not isinstance(config, dict):
        raise _refuse(folder, f"holds a JSON {type(config).__name__}, not an object", "config.json")
    if kind == CLASSIFIER_KIND and served_head is not None:
        problem = swap_head_problem(config, head or HeadSettings(), served_head)
    else:
        problem = architecture_problem(kind, config, head, folder)
    if problem is not None:
        raise _refuse(folder, problem, "config.json")
    return config


def check_tokenizer_files(folder: Path) -> tuple[str, ...]:
    """Check the tokenizer files of ``folder``; returns the names present.

    Raises:
        InvalidCheckpoint (422, field ``path``): none of
            :data:`~rmserve.fingerprint.TOKENIZER_FILES` is present, or a JSON one does not parse.
    """
    present = tuple(name for name in TOKENIZER_FILES if (folder / name).is_file())
    if not present:
        raise _refuse(folder, f"has no tokenizer files (expected one of {', '.join(TOKENIZER_FILES)})")
    for name in present:
        if name.endswith(".json"):
            _read_json(folder, name)
    return present


def check_weight_files(folder: Path) -> tuple[str, ...]:
    """Check that ``folder`` holds weights; returns the weight file names.

    A sharded checkpoint (an ``*.index.json`` with a ``weight_map``) must have every shard it
    names; otherwise at least one ``*.safetensors`` / ``*.bin`` file must be there.

    Raises:
        InvalidCheckpoint (422, field ``path``): no weight file, an unreadable index, or a
            shard named by an index that is missing (the first one is named).
    """
    for index_name in sorted(p.name for p in folder.glob("*.index.json")):
        index = _read_json(folder, index_name)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise _refuse(folder, "has no weight_map", index_name)
        shards = sorted({str(shard) for shard in weight_map.values()})
        missing = [shard for shard in shards if not (folder / shard).is_file()]
        if missing:
            raise _refuse(folder, f"names {len(missing)} missing shard(s) of {len(shards)}, first {missing[0]!r}", index_name)
        return tuple(shards)
    weights = tuple(sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES))
    if not weights:
        raise _refuse(folder, f"has no weight files ({' or '.join('*' + s for s in WEIGHT_SUFFIXES)})")
    return weights


def check_checkpoint(
    folder: str | Path, kind: ModelKind = CLASSIFIER_KIND, head: HeadSettings | None = None,
    served_head: RewardHead | None = None,
) -> None:
    """All file checks of a checkpoint folder before it is loaded: config (with the head
    settings ``head`` and, at a swap, the ``served_head``: :func:`check_config`), tokenizer,
    weights.

    Raises:
        InvalidCheckpoint (422, field ``path``): the first rule the folder breaks (see the
            module docstring); nothing else is touched.
    """
    folder = Path(folder)
    check_config(folder, kind, head, served_head)
    check_tokenizer_files(folder)
    check_weight_files(folder)


HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
"""What a Hugging Face hub id looks like: ``NAME`` or ``ORG/NAME``, letters, digits, ``.``, ``_``, ``-``."""


def model_folder(model: str, field: str = "model") -> Path | None:
    """The local folder ``model`` names, or None when it is a hub id, told apart as a user would.

    A folder that exists is a folder. Anything else that looks like a path is a path that does
    not exist (an error, never a hub lookup): it starts with ``/``, ``.`` or ``~``, holds a
    backslash or more than one ``/``, is not of the hub's ``NAME`` / ``ORG/NAME`` form, or its
    first part is a folder here (``runs/demo-rmX`` beside an existing ``runs/``). What is left
    (``org/name`` with no folder ``org`` here) is a hub id.

    Raises:
        ValueError: names ``field`` and ``model``: a path-like string that does not exist, or a
            file that is not a folder.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"{field}: {model!r} is a file; give the checkpoint folder that holds config.json")
    first = model.split("/", 1)[0]
    looks_like_path = (
        model.startswith(("/", ".", "~"))
        or "\\" in model
        or HUB_ID.fullmatch(model) is None
        or ("/" in model and Path(first).is_dir())
    )
    if looks_like_path:
        raise ValueError(
            f"{field}: no folder {model!r} (looked in {Path.cwd()}); give an existing checkpoint folder, "
            "or a hub id of the form ORG/NAME"
        )
    if "/" not in model:
        near = near_folder(model)
        if near is not None:
            raise ValueError(
                f"{field}: no folder {model!r} (looked in {Path.cwd()}); did you mean {near!r}? "
                "(a hub id has the form ORG/NAME)"
            )
    return None


NEAR_FOLDER_CUTOFF = 0.8
"""Least :class:`difflib.SequenceMatcher` ratio at which a folder here is taken for the one a bare
name meant (``demo_rm`` → ``demo-rm``: 0.86)."""

NEAR_FOLDER_SCAN = 2000
"""Most entries looked at (the working folder and one level below) for :func:`near_folder`."""


def near_folder(name: str) -> str | None:
    """A folder in the working folder, or one level below it, whose name is close to ``name`` (a
    bare hub-like name with no such folder), as typed relative to the working folder; None when
    none is close. A mistyped checkpoint folder (``demo_rm`` for ``runs/demo-rm``) is refused
    with this guess instead of being looked up on the hub; a name close to no folder here is a
    hub id (``gpt2``)."""
    import difflib
    import itertools

    def folders(parent: Path) -> list[Path]:
        try:
            return [p for p in itertools.islice(parent.iterdir(), NEAR_FOLDER_SCAN) if p.is_dir()]
        except OSError:
            return []

    here = Path(".")
    candidates: dict[str, str] = {}
    for top in folders(here):
        if top.name.startswith("."):
            continue
        candidates.setdefault(top.name, str(top))
        for below in folders(top)[:NEAR_FOLDER_SCAN]:
            candidates.setdefault(below.name, str(below))
        if len(candidates) >= NEAR_FOLDER_SCAN:
            break
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=NEAR_FOLDER_CUTOFF)
    return candidates[close[0]] if close else None


def check_model_source(
    model: str, kind: ModelKind, field: str = "model", head: HeadSettings | None = None
) -> Path | None:
    """Before any engine starts: :func:`model_folder`, then, for a folder, the file checks of
    :func:`check_checkpoint` with ``kind``'s rules and the head settings ``head`` (a ``length``
    server reads the tokenizer only, so only its tokenizer files are checked). Hub ids are
    left to the engine's loader.

    Returns:
        The folder, or None for a hub id.

    Raises:
        ValueError: as :func:`model_folder`, or the folder breaks a rule (the message starts
            with ``field`` and names the file and the rule).
    """
    folder = model_folder(model, field)
    if folder is None:
        return None
    try:
        if kind == LENGTH_KIND:
            check_tokenizer_files(folder)
        else:
            check_checkpoint(folder, kind, head)
    except InvalidCheckpoint as exc:
        raise ValueError(f"{field}: {exc}") from None
    return folder

"""Model fingerprint: ties every stored score to exactly one model + tokenizer + template.

``sha256`` over labelled sections, hex, first 16 characters:

1. ``config.json`` bytes;
2. the weight index (``*.safetensors.index.json`` / ``*.bin.index.json`` bytes) and, for
   every weight file (``.safetensors``, ``.bin``, ``.pt``), its name, size and a digest of
   sampled content (nine 64 KiB windows spread over the file, or the whole file under
   1 MiB) — so two checkpoints of the same shape differ, without reading 16 GB;
3. tokenizer files that exist (``tokenizer.json``, ``tokenizer_config.json``,
   ``special_tokens_map.json``, ``tokenizer.model``, ``vocab.json``, ``merges.txt``,
   ``added_tokens.json``);
4. the chat template actually used (an override file's text, else the tokenizer's);
5. for hub ids, the snapshot commit (weights are not fetched for the fingerprint);
6. the compute dtype when given (the same weights in bfloat16 and float32 give different
   rewards, so their scores must not share a fingerprint);
7. the reward head when it is not the one-label classifier (:func:`head_sections`: the head's
   name, label index or weights, token id), so a default classifier keeps the fingerprint it
   had before heads were recorded and existing score files still resume;
8. for the ``remote-code`` head (the checkpoint's own modeling code, ``--trust-remote-code``),
   every ``*.py`` file of the folder, name and bytes: the code computes the reward.

No torch import; ``huggingface_hub`` only for hub ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from rmserve.errors import ServerFault
from rmserve.judge_records import JUDGE_READER_VERSION
from rmserve.schema import (
    CLASSIFIER_REWARD_HEAD,
    DPO_KIND,
    JUDGE_KIND,
    LENGTH_KIND,
    REMOTE_CODE_HEAD,
    REWARD_TOKEN_HEAD,
    JudgeSampling,
    RewardHead,
)

FINGERPRINT_HEX_CHARS = 16
TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)
WEIGHT_SUFFIXES: tuple[str, ...] = (".safetensors", ".bin", ".pt")
_HUB_PATTERNS = ["config.json", "*.index.json", *TOKENIZER_FILES, "chat_template.jinja", "chat_template.json", "*.py"]
_WINDOW_BYTES = 64 * 1024
_WINDOWS = 9


def resolve_model_dir(model: str | Path) -> tuple[Path, str | None]:
    """A local folder for ``model`` and, for hub ids, the snapshot commit.

    Hub ids are resolved through the huggingface_hub cache with only config, index and
    tokenizer files (``HF_HUB_OFFLINE=1`` keeps it to the cache).

    Raises:
        ServerFault: not a folder and not resolvable on the hub.
    """
    path = Path(model)
    if path.is_dir():
        return path, None
    try:
        from huggingface_hub import snapshot_download

        local = Path(snapshot_download(repo_id=str(model), allow_patterns=_HUB_PATTERNS))
    except Exception as exc:  # noqa: BLE001 - any hub failure: cannot fingerprint
        raise ServerFault(f"cannot resolve model {str(model)!r} for its fingerprint: {type(exc).__name__}: {exc}") from None
    return local, local.name


def model_fingerprint(
    model: str | Path, chat_template: str | None, dtype: str | None = None, head: RewardHead | None = None
) -> str:
    """Short hex fingerprint of ``model`` (folder or hub id) scored with ``chat_template`` in ``dtype``.

    ``dtype`` (``float32``, ``bfloat16`` …) is hashed when given; engines pass the dtype they
    compute in, so a fingerprint names the model, the template and the numerics. ``head`` is
    how the reward is read (:func:`head_sections`; None or
    ``CLASSIFIER_REWARD_HEAD``, the one-label classifier, add nothing; a ``remote-code`` head, and a
    ``reward-token`` head whose config class is the checkpoint's code, add the folder's ``*.py``
    files).

    Returns:
        The first :data:`FINGERPRINT_HEX_CHARS` hex characters of the sha256 described in
        the module docstring.

    Raises:
        ServerFault: the model cannot be resolved or has no ``config.json``.
    """
    folder, revision = resolve_model_dir(model)
    config = folder / "config.json"
    if not config.is_file():
        raise ServerFault(f"model {str(model)!r} has no config.json")
    digest = hashlib.sha256()

    def section(label: str, data: bytes) -> None:
        digest.update(label.encode() + b"\0" + len(data).to_bytes(8, "little") + data)

    section("config.json", config.read_bytes())
    for index in sorted(folder.glob("*.index.json")):
        section(f"index:{index.name}", index.read_bytes())
    for weights in sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file()):
        section(f"weights:{weights.name}", f"{weights.stat().st_size}:{_sampled_digest(weights)}".encode())
    for name in TOKENIZER_FILES:
        file = folder / name
        if file.is_file():
            section(f"tokenizer:{name}", file.read_bytes())
    section("chat_template", (chat_template or "").encode())
    section("revision", (revision or "").encode())
    if dtype is not None:
        section("dtype", dtype.encode())
    for label, value in head_sections(head):
        section(label, value.encode())
    if head is not None and head.name in (REMOTE_CODE_HEAD, REWARD_TOKEN_HEAD):  # code the load executes
        for code in sorted(p for p in folder.glob("*.py") if p.is_file()):
            section(f"code:{code.name}", code.read_bytes())
    return digest.hexdigest()[:FINGERPRINT_HEX_CHARS]


def hash_sections(sections: Iterable[tuple[str, str | bytes]]) -> str:
    """The first :data:`FINGERPRINT_HEX_CHARS` hex characters of the sha256 of ``sections``, each
    hashed as its label, a NUL byte, its value's length (8 bytes, little-endian) and the value
    (a ``str`` as UTF-8): the form of every fingerprint here, so no two sections run together."""
    digest = hashlib.sha256()
    for label, value in sections:
        data = value.encode() if isinstance(value, str) else value
        digest.update(label.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()[:FINGERPRINT_HEX_CHARS]


def chat_template_digest(template: str) -> str:
    """The first :data:`FINGERPRINT_HEX_CHARS` hex characters of the sha256 of a chat
    template's text (UTF-8): what ``ModelInfo.chat_template_override`` reports for a template
    given at a server's start."""
    return hashlib.sha256(template.encode()).hexdigest()[:FINGERPRINT_HEX_CHARS]


def head_sections(head: RewardHead | None) -> list[tuple[str, str]]:
    """The fingerprint sections of a reward head: none for None and for the default
    :data:`~rmserve.schema.CLASSIFIER_REWARD_HEAD` (the one-label classifier, so its fingerprints keep
    their values), else
    ``head`` (the name) and each setting the head has: ``label_index`` (decimal),
    ``label_weights`` (``repr`` of each weight as a float, comma-joined: ``1`` and ``1.0`` are
    one weight) and ``head_token_id`` (decimal)."""
    if head is None or head == CLASSIFIER_REWARD_HEAD:
        return []
    sections = [("head", head.name)]
    if head.label_index is not None:
        sections.append(("label_index", str(int(head.label_index))))
    if head.label_weights is not None:
        sections.append(("label_weights", ",".join(repr(float(w)) for w in head.label_weights)))
    if head.token_id is not None:
        sections.append(("head_token_id", str(int(head.token_id))))
    return sections


def _sampled_digest(path: Path) -> str:
    """sha256 of the whole file under 1 MiB, else of nine 64 KiB windows spread evenly."""
    size = path.stat().st_size
    h = hashlib.sha256()
    with path.open("rb") as f:
        if size <= 16 * _WINDOW_BYTES:
            h.update(f.read())
        else:
            step = (size - _WINDOW_BYTES) // (_WINDOWS - 1)
            for k in range(_WINDOWS):
                f.seek(k * step)
                h.update(f.read(_WINDOW_BYTES))
    return h.hexdigest()


def dpo_fingerprint(policy: str, reference: str | None, mode: str, compat: str = "none") -> str:
    """Fingerprint of a DPO implicit reward: the policy's and reference's fingerprints (each
    from :func:`model_fingerprint`), the reward mode and the compatibility mode, hashed together.

    Args:
        policy: the policy's fingerprint.
        reference: the reference's fingerprint; None for a reference-free mode.
        mode: ``reference``, ``avg``, ``sum`` or ``norm``.
        compat: ``none`` or ``official``.

    Returns:
        :data:`FINGERPRINT_HEX_CHARS` hex characters; differs from every single-model
        fingerprint, so a DPO score never shares a key with a classifier's.

    Raises:
        ValueError: ``reference`` given with a reference-free mode, or missing with ``reference``.
    """
    if (mode == "reference") != (reference is not None):
        raise ValueError(f"reference: mode {mode!r} {'needs' if mode == 'reference' else 'takes no'} reference fingerprint")
    return hash_sections(
        (("kind", DPO_KIND), ("policy", policy), ("reference", reference or ""), ("mode", mode), ("compat", compat))
    )


def judge_fingerprint(
    model: str,
    *,
    protocol: str,
    max_tokens: int,
    seed: int,
    compat: str = "none",
    system_prompt: bool = True,
    thinking: str | None = None,
    sampling: JudgeSampling | None = None,
) -> str:
    """Fingerprint of a generative judge: the judge model's fingerprint (from
    :func:`model_fingerprint`, or what an endpoint engine reports for its model) hashed with
    every setting that changes its verdicts and the version of the readers' rules
    (:data:`rmserve.judge_records.JUDGE_READER_VERSION`).

    Args:
        model: the judge model's fingerprint.
        protocol: the protocol choice (``auto``, ``ranking``, ``ratings``, ``pairwise``).
        max_tokens: generated tokens per call at most (an output cut there reads differently).
        seed: the seed of the ranking positions.
        compat: ``none`` or ``official`` (which readers read the outputs).
        system_prompt: whether the ranking instructions go in a system message.
        thinking: the thinking switch (``on`` / ``off``), or None when not set; a section
            ``thinking`` is hashed only when set.
        sampling: how the calls are decoded (None: the default :class:`~rmserve.schema.JudgeSampling`,
            greedy). Its temperature and top_p are hashed (``repr`` of the floats) when they
            differ from greedy's 0 and 1, so every judge fingerprint made before they were
            recorded (all greedy) keeps its value; its ``max_tokens`` is ``max_tokens``'s to cover.

    Returns:
        :data:`FINGERPRINT_HEX_CHARS` hex characters; differs from every single-model and DPO
        fingerprint, so a judge's score never shares a key with another kind's.

    Raises:
        ValueError: an empty ``model`` or ``protocol``, or ``max_tokens`` < 1 or ``seed`` < 0.
    """
    if not model or not protocol:
        raise ValueError("model / protocol: a judge fingerprint needs the model's fingerprint and the protocol")
    if max_tokens < 1 or seed < 0:
        raise ValueError(f"max_tokens ({max_tokens}) must be ≥ 1 and seed ({seed}) ≥ 0")
    return hash_sections((
        ("kind", JUDGE_KIND),
        ("model", model),
        ("protocol", protocol),
        ("max_tokens", str(int(max_tokens))),
        ("seed", str(int(seed))),
        ("compat", compat),
        ("system_prompt", "1" if system_prompt else "0"),
        ("readers", str(JUDGE_READER_VERSION)),
        *((("thinking", thinking),) if thinking is not None else ()),
        *_sampling_sections(sampling or JudgeSampling()),
    ))


def _sampling_sections(sampling: JudgeSampling) -> list[tuple[str, str]]:
    """The fingerprint sections of a judge's sampling: none for greedy's temperature 0 and
    top_p 1, else both values."""
    if sampling.temperature == 0 and sampling.top_p == 1:
        return []
    return [("temperature", repr(float(sampling.temperature))), ("top_p", repr(float(sampling.top_p)))]


def length_fingerprint(model: str | Path, sign: str) -> str:
    """Fingerprint of the length baseline: every tokenizer file of ``model`` (folder or hub id;
    see :data:`TOKENIZER_FILES`), the hub snapshot commit for a hub id, and the sign
    (``longest`` or ``shortest``), hashed together; no weights or config are read.

    Returns:
        :data:`FINGERPRINT_HEX_CHARS` hex characters; differs from every other kind's, so a
        length score never shares a key with a model's.

    Raises:
        ServerFault: the model cannot be resolved, or has none of :data:`TOKENIZER_FILES`.
        ValueError: ``sign`` is neither ``longest`` nor ``shortest``.
    """
    if sign not in ("longest", "shortest"):
        raise ValueError(f"sign: {sign!r} is not one of longest, shortest")
    folder, revision = resolve_model_dir(model)
    files = [(name, folder / name) for name in TOKENIZER_FILES if (folder / name).is_file()]
    if not files:
        raise ServerFault(f"model {str(model)!r} has no tokenizer files (one of {', '.join(TOKENIZER_FILES)})")
    return hash_sections([("kind", LENGTH_KIND), *((f"tokenizer:{name}", path.read_bytes()) for name, path in files),
                          ("revision", revision or ""), ("sign", sign)])

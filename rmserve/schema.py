"""Typed records for every arrow of the data flow, defined once.

dataset -> :class:`Group` -> (wire) :class:`ScoreRequest` -> server -> :class:`ScoreResponse`
-> :class:`ScoreRecord` (JSONL score file) -> metric arrays -> report.

All records are frozen ``msgspec.Struct`` types: they validate on decode and cannot be
mutated by later stages. Every JSON body on HTTP is one of these records, on both sides: the
server encodes replies in ``rmserve.server.http.wire`` (error bodies through
:meth:`rmserve.errors.RMServeError.to_wire`), the client decodes them into the same types
(error bodies through :func:`rmserve.errors.from_wire`), and no body is built as a dict.
The score file and the score store write each :class:`ScoreRecord` with :func:`encode`
(the metrics' ``results.json`` is a report, not a wire body, and is built in ``metrics.render_json``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import msgspec

from rmserve.judge_records import JudgeGroupResult

BENCHMARKS: tuple[str, ...] = ("rm-bench", "rewardbench2")
"""Benchmark names as they appear in records and on the command line."""

Benchmark = Literal["rm-bench", "rewardbench2"]

RMBENCH_DOMAINS: tuple[str, ...] = ("chat", "math", "code", "safety-refuse", "safety-response")
"""RM-Bench domains as named by the release files (``<domain>_filtered.json``)."""

RMBENCH_STYLES: tuple[str, ...] = ("concise", "detailed_plain", "detailed_markdown")
"""RM-Bench response styles, in release order, for both chosen and rejected."""

ModelKind = Literal["classifier", "dpo", "judge", "length"]
"""What kind of reward model is served, and so what kind of score a reward is: a sequence
classifier (a reward head's logit), a DPO policy scored by its implicit reward (log-probabilities
of the answer under the policy, minus a reference's), a generative judge (a chat model that
ranks, rates or compares the answers in text), or the length baseline (the response's token
count, or its negative). Each kind is one module of ``rmserve.server.kinds``."""

CLASSIFIER_KIND: ModelKind = "classifier"
DPO_KIND: ModelKind = "dpo"
JUDGE_KIND: ModelKind = "judge"
LENGTH_KIND: ModelKind = "length"
MODEL_KINDS: tuple[ModelKind, ...] = (CLASSIFIER_KIND, DPO_KIND, JUDGE_KIND, LENGTH_KIND)
"""Every :data:`ModelKind`, in the order the CLI lists them."""

HeadName = Literal[
    "classifier", "multi-label", "lm-logit", "remote-code", "token-value", "reward-token", "mlp-value", "value-head",
    "label-distribution",
]
"""How a sequence classifier's reward is read from the model (``rmserve.server.kinds.heads``):
``classifier`` — the one logit of a one-label ``*ForSequenceClassification`` at the last token;
``multi-label`` — one label, or a weighted sum of the labels, of a ``*ForSequenceClassification``
with ``num_labels > 1``; ``lm-logit`` — the logit of one vocabulary id of a ``*ForCausalLM``'s
LM head at the last position (Llama-3.1-Nemotron-70B-Reward-HF reads id 0); ``remote-code`` —
the output of the checkpoint's own modeling code (``auto_map``, run only with
``--trust-remote-code``): its ``score`` (a gated multi-objective model such as ArmoRM) or its one
logit (an MLP value head); ``token-value`` — a per-token value head (``Qwen2ForRewardModel``,
Qwen2.5-Math-RM-72B), read at the last token; ``reward-token`` — a per-token value head read at
a reward token appended to every sequence (``InternLM2ForRewardModel``, its ``reward_token_id``);
``mlp-value`` — a two-layer MLP score head (``score.0``, ReLU, ``score.2``) over a decoder, read at
the last token, for a checkpoint that ships no code for it (INF-ORM-Llama3.1-70B, whose card
gives the class); ``value-head`` — a value head ``v_head.summary`` (linear layers with ReLU between)
over a decoder, read at the last token (the GRM reward models, whose class only the official
harness defines); ``label-distribution`` — per-objective score distributions and a gate over them
at the last token, the reward the expected score of their gated mixture (LDL-Reward-Gemma-2-27B,
whose class only its card and the official harness define)."""

CLASSIFIER_HEAD: HeadName = "classifier"
MULTI_LABEL_HEAD: HeadName = "multi-label"
LM_LOGIT_HEAD: HeadName = "lm-logit"
REMOTE_CODE_HEAD: HeadName = "remote-code"
TOKEN_VALUE_HEAD: HeadName = "token-value"
REWARD_TOKEN_HEAD: HeadName = "reward-token"
MLP_VALUE_HEAD: HeadName = "mlp-value"
VALUE_HEAD: HeadName = "value-head"
LABEL_DISTRIBUTION_HEAD: HeadName = "label-distribution"
HEAD_NAMES: tuple[HeadName, ...] = (
    CLASSIFIER_HEAD, MULTI_LABEL_HEAD, LM_LOGIT_HEAD, REMOTE_CODE_HEAD, TOKEN_VALUE_HEAD, REWARD_TOKEN_HEAD,
    MLP_VALUE_HEAD, VALUE_HEAD, LABEL_DISTRIBUTION_HEAD,
)
"""Every :data:`HeadName`, in the order the CLI and the docs list them."""

ATTENTION_UNKNOWN = "unknown"
"""What :attr:`Scorer.attention` says when the engine's attention implementation cannot be read."""


class RewardHead(msgspec.Struct, frozen=True, omit_defaults=True):
    """Which head a reward is read from, and how (:data:`HeadName`).

    Attributes:
        name: the head.
        label_index: ``multi-label`` read as one label: its index (0-based, below ``num_labels``).
        label_weights: ``multi-label`` read as a weighted sum: one weight per label, label order
            (reward = Σ weight_i · logit_i).
        token_id: ``lm-logit``: the vocabulary id whose logit is the reward; ``reward-token``:
            the reward token appended to every sequence (the config's ``reward_token_id``).

    Every field but ``name`` is None (and left out of the JSON) where the head has no such
    setting; the one-label classifier is :data:`CLASSIFIER_REWARD_HEAD`.
    """

    name: HeadName
    label_index: int | None = None
    label_weights: tuple[float, ...] | None = None
    token_id: int | None = None

    def describe(self) -> str:
        """Words for messages: ``classifier``, ``multi-label (label 2)``,
        ``multi-label (weights 0.5, 0.5)``, ``lm-logit (token id 0)``."""
        if self.label_index is not None:
            return f"{self.name} (label {self.label_index})"
        if self.label_weights is not None:
            return f"{self.name} (weights {', '.join(f'{w:g}' for w in self.label_weights)})"
        if self.token_id is not None:
            return f"{self.name} (token id {self.token_id})"
        return self.name


CLASSIFIER_REWARD_HEAD = RewardHead(CLASSIFIER_HEAD)
"""The head of a one-label ``*ForSequenceClassification`` (what rmserve served before heads were recorded)."""


class Scorer(msgspec.Struct, frozen=True, omit_defaults=True):
    """What scored a reply's rewards: the engine, its attention implementation and, for a
    sequence classifier, the head the reward was read from.

    Attributes:
        engine: the engine's registered name (``vllm``, ``hf``; :attr:`ModelInfo.engine`).
        attention: the attention implementation the engine runs, as it names it (vLLM: its
            attention backend, e.g. ``CPU_ATTN``, ``FLASH_ATTN``; transformers: the model
            config's ``_attn_implementation``, e.g. ``sdpa``, ``eager``); :data:`ATTENTION_UNKNOWN`
            when it cannot be read (never a guess).
        head: the head (None for kinds without one: DPO, judge, length).
    """

    engine: str
    attention: str = ATTENTION_UNKNOWN
    head: RewardHead | None = None


RB2_SUBSETS: tuple[str, ...] = ("Factuality", "Precise IF", "Math", "Safety", "Focus", "Ties")
"""RewardBench 2 subsets in leaderboard column order."""


class Message(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One chat turn: ``role`` (``system``/``user``/``assistant``/…) and its text."""

    role: str
    content: str


class GroupKey(msgspec.Struct, frozen=True, order=True, array_like=True):
    """Identity of a group: (benchmark, domain or subset, id).

    Ids repeat across RM-Bench domains and RewardBench 2 subsets, so the id alone is never
    a key. ``str(key)`` is ``benchmark/domain/id`` and is what travels as the wire ``id``.
    """

    benchmark: str
    domain: str
    id: str

    def __str__(self) -> str:
        return f"{self.benchmark}/{self.domain}/{self.id}"

    @classmethod
    def parse(cls, text: str) -> GroupKey:
        """Inverse of ``str(key)``; raises ``ValueError`` when ``text`` has fewer than 3 parts.

        The id may itself contain ``/``; the benchmark and domain never do.
        """
        parts = text.split("/", 2)
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"group key {text!r} is not 'benchmark/domain/id'")
        return cls(parts[0], parts[1], parts[2])


class Group(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One benchmark item: a conversation and the responses to score against it.

    Attributes:
        benchmark: ``"rm-bench"`` or ``"rewardbench2"``.
        domain: RM-Bench domain (``chat``, ``code``, ``math``, ``safety-refuse``,
            ``safety-response``) or RewardBench 2 subset (``Factuality`` … ``Ties``).
        id: the dataset's id as a string (not unique across domains/subsets).
        messages: the conversation before the response, oldest first; the last one is the
            user turn the responses answer.
        responses: the completions; the first ``num_chosen`` are chosen, the rest rejected.
        num_chosen: how many leading responses are chosen (RM-Bench 3, RewardBench 2
            ``num_correct``).
        styles: RM-Bench only: the style of each response (see ``RMBENCH_STYLES``), else None.
    """

    benchmark: str
    domain: str
    id: str
    messages: tuple[Message, ...]
    responses: tuple[str, ...]
    num_chosen: int
    styles: tuple[str, ...] | None = None

    @property
    def key(self) -> GroupKey:
        return GroupKey(self.benchmark, self.domain, self.id)

    @property
    def num_rejected(self) -> int:
        return len(self.responses) - self.num_chosen


class Truncation(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A request to cut over-length sequences instead of rejecting them.

    ``side="left"`` drops tokens from the start (keeps the end, as RM-Bench's harness does);
    ``side="right"`` drops from the end (as RewardBench 2's does). ``max_tokens`` is the
    length each scored sequence is cut to (≥ 2, ≤ the model's max length).
    """

    side: Literal["left", "right"]
    max_tokens: int


class RequestGroup(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One group on the wire: exactly one of ``messages`` or ``prompt`` (a single user turn).

    ``num_chosen`` (how many leading responses are chosen), ``styles``, ``benchmark`` and
    ``domain`` (the benchmark's subset or domain the group comes from) are needed by a
    generative judge, whose prompts depend on which answer is correct and on the benchmark's
    protocol. Other kinds ignore them, and the client sends them only to a judge. A judge
    server still reads the benchmark and domain from an ``id`` of the form
    ``benchmark/domain/id`` (see :class:`GroupKey`) when both fields are absent; that form is
    deprecated and read for one more release (the server logs a warning).
    """

    id: str
    responses: tuple[str, ...]
    messages: tuple[Message, ...] | None = None
    prompt: str | None = None
    num_chosen: int | None = None
    styles: tuple[str, ...] | None = None
    benchmark: str | None = None
    domain: str | None = None


class ScoreRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Body of ``POST /v1/score``."""

    groups: tuple[RequestGroup, ...]
    model: str | None = None
    truncation: Truncation | None = None
    fingerprint: str | None = None
    """The served model's fingerprint the caller expects; another one is refused with 409
    ``conflict`` (field ``fingerprint``) before any engine work, so a checkpoint swap never
    mixes models within a run. Left out of the JSON when None (any model scores it)."""


RESPONSE_ERROR_TYPES: tuple[str, ...] = (
    "sequence_too_long", "non_finite_reward", "no_answer_tokens", "unsupported_group", "request_over_limit",
)
"""Why one response of a group could not be scored (``ResponseError.type``):
``sequence_too_long`` — its sequence is longer than the model's max length and no truncation
was asked (for a judge: a judge prompt leaves no room to generate); ``non_finite_reward`` — the
model gave NaN or ±inf for it; ``no_answer_tokens`` — a DPO implicit reward had no answer token
to sum over; ``unsupported_group`` — a generative judge's protocol cannot take the group (a
multi-turn conversation, or not the number of responses or styles the protocol shows);
``request_over_limit`` — written by the client, never sent by a server: the group alone costs
more than the user's whole ``tokens_per_minute`` budget, so the server refused it (413
``request_over_limit``) and no request holding it can ever be admitted."""


class ResponseError(msgspec.Struct, frozen=True):
    """Why one response of a group has no reward (its ``rewards`` entry is null).

    ``type`` is one of :data:`RESPONSE_ERROR_TYPES` (readers accept others, from newer
    servers); ``message`` says what was found and the limit, e.g. ``"2,613 tokens (chat
    template included), over max_model_len=512"``.
    """

    type: str
    message: str


class JudgeSampling(msgspec.Struct, frozen=True):
    """How a generative judge decodes every call: the sampling settings its figures depend on.

    Defined once here and used by every judge engine (the vLLM ``SamplingParams``, the
    transformers ``generate`` settings, the OpenAI-compatible request body), by the fingerprint
    (:func:`rmserve.fingerprint.judge_fingerprint`) and by the records that carry it
    (:class:`ModelInfo`, :class:`GroupResult`, :class:`ScoreRecord`). The defaults are the
    official RewardBench 2 settings of its vLLM judge runs: greedy decoding (temperature 0,
    top_p 1) and at most 2,048 generated tokens per call (``SamplingParams(max_tokens=2048)``;
    its API paths use 2,048 for OpenAI ranking, 1,024 for Anthropic ranking and API ratings).

    Attributes:
        temperature: sampling temperature (≥ 0; 0 = greedy).
        top_p: nucleus-sampling mass kept, in (0, 1] (1 = the whole distribution).
        max_tokens: generated tokens per call at most (≥ 1).

    Raises:
        ValueError: a field outside its range (naming it, the value and the limit).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 2048

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name}: {value!r} must be a finite number")
        if self.temperature < 0:
            raise ValueError(f"temperature: {self.temperature!r} must be ≥ 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: {self.top_p!r} must lie in (0, 1]")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens: {self.max_tokens!r} must be an integer ≥ 1")

    @property
    def greedy(self) -> bool:
        """True for greedy decoding (temperature 0; top_p then changes nothing)."""
        return self.temperature == 0


class JudgeEngineInfo(msgspec.Struct, frozen=True):
    """What produced a generative judge's texts, beside the model and its settings.

    Attributes:
        engine: ``vllm`` (embedded vLLM), ``hf`` (transformers ``generate``) or ``openai`` (an
            OpenAI-compatible endpoint); other names for other engines.
        version: ``vllm``: vLLM's version; ``hf``: transformers' version; ``openai``: the model
            id the endpoint answered the start-up probe call with (a hosted API names the
            snapshot behind an alias there), with the ``root`` its model list gives when that
            differs (``id (root /models/x)``). None: unknown.
        batch_invariant: whether a call's output is independent of the other calls the engine
            runs beside it (batch size and composition): True, False, or None when unknown.
            Greedy texts of an engine that is not batch-invariant can change with the load.
        batch_invariant_note: why (one sentence, e.g. that vLLM's batch-invariant mode is off).
    """

    engine: str
    version: str | None = None
    batch_invariant: bool | None = None
    batch_invariant_note: str = ""


JUDGE_SETUP_FIELDS: tuple[tuple[str, str], ...] = (
    ("judge_sampling", "temperature"),
    ("judge_sampling", "top_p"),
    ("judge_sampling", "max_tokens"),
    ("judge_engine", "engine"),
    ("judge_engine", "version"),
    ("judge_engine", "batch_invariant"),
)
"""The fields of a judge's set-up that its figures depend on, as (record field, attribute):
score sets and comparisons whose records differ in one of them are refused
(``rmserve.metrics``). ``batch_invariant_note`` is an explanation and is not compared."""


JUDGE_REWARDS_DOC = (
    "the rating read (1-10; -1 where none was read, the official value) for the rating protocols; "
    "1 for the answer the ranking verdict names and 0 for the others (0.25 each when no verdict was read), "
    "so the correct answer's value is the group's credit; for RM-Bench pairwise, the answer's mean "
    "preference over the 6 calls showing it (a rejected answer's is 1 minus the preference for the chosen one)"
)
"""What a generative judge's per-response ``rewards`` are (:class:`GroupResult`). The benchmark
figures are computed from the ``judge`` record, never from these values."""


class GroupResult(msgspec.Struct, frozen=True, omit_defaults=True):
    """Scores of one group, response order kept.

    ``rewards`` are raw reward-head logits (no sigmoid), ``null`` for a response that could
    not be scored; ``errors`` then says why, per response (``null`` where scored; the field is
    absent when every response was scored). ``num_tokens`` the sequence lengths in tokens
    (template included; for an over-length response, its length); ``num_cached_tokens`` the
    tokens served from the prefix cache; ``truncated_tokens`` tokens cut per response when
    truncation was asked.

    ``extras`` holds what only some kinds of reward model produce, per response: name → one
    value per response, response order (for example summed log-probabilities of a policy and
    its reference, or a generative judge's text); values are numbers, texts or null. Absent
    (None) for classifiers, and then omitted on the wire.

    ``judge`` (generative judges only): every call the judge made for the group — its text,
    what was read from it, token counts — and the group's score under the protocol (see
    :class:`~rmserve.judge_records.JudgeGroupResult`). ``rewards`` then hold, per response,
    :data:`JUDGE_REWARDS_DOC`. A group the judge could not judge (a prompt over the model's
    length, a multi-turn conversation) has null rewards, ``errors`` and no ``judge``. A judge's
    ``num_tokens`` / ``num_cached_tokens`` are each response's share of the prompt tokens /
    prefix-cache hits of the calls showing it (a call's count split evenly over the responses
    it shows, the remainder one token each to the first shown), so their sums are the calls'
    totals; generated tokens are per call in ``judge.calls``.

    ``from_result_cache`` is true (and only then sent) when the server answered the group from
    its result cache: the same model scored the same rendered group before, and this answer is
    that one (no engine work; a client leaves such groups out of its throughput).

    ``judge_sampling`` and
    ``judge_engine`` (generative judges only, every group, judged or not): how the judge
    decoded and what decoded (:class:`JudgeSampling`, :class:`JudgeEngineInfo`), as the
    server's ``GET /v1/models`` reports them; None when its engine does not say.
    """

    id: str
    rewards: tuple[float | None, ...]
    num_tokens: tuple[int, ...]
    num_cached_tokens: tuple[int, ...]
    truncated_tokens: tuple[int, ...] | None = None
    extras: dict[str, tuple[float | int | str | None, ...]] | None = None
    errors: tuple[ResponseError | None, ...] | None = None
    judge: JudgeGroupResult | None = None
    from_result_cache: bool = False
    judge_sampling: JudgeSampling | None = None
    judge_engine: JudgeEngineInfo | None = None


class ScoreResponse(msgspec.Struct, frozen=True, omit_defaults=True):
    """Body of a successful ``POST /v1/score`` reply.

    ``scorer`` says what scored the rewards (engine, attention implementation, head; see
    :class:`Scorer`), as the served model's :class:`ModelInfo` reports it
    (:meth:`ModelInfo.scorer`); left out when the engine reports neither a head nor an
    attention implementation.
    """

    model: str
    fingerprint: str
    results: tuple[GroupResult, ...]
    scorer: Scorer | None = None


class ModelInfo(msgspec.Struct, frozen=True):
    """Body of ``GET /v1/models`` (one entry): what the server scores with.

    ``fingerprint`` hashes config, weight index, tokenizer and chat template, so a stored
    score can be tied to exactly one model. ``swap_count`` counts the checkpoint swaps
    (``POST /v1/models/load``) since start; ``last_swap_time`` is the Unix time (seconds) the
    last one finished, None before any. ``kind`` is ``classifier`` or ``dpo``; for DPO ``mode``
    is ``reference`` or the reference-free mode (``avg``/``sum``/``norm``) and ``ref_model``
    the reference's name; ``compat`` is ``official`` when the official script's defects are
    reproduced (the fingerprint covers all four). All default so older replies decode unchanged.

    For kind ``judge``, ``mode`` is the protocol choice (``auto``, ``ranking``, ``ratings``,
    ``pairwise``), ``judge_max_tokens`` the generated tokens per call at most and
    ``judge_seed`` the seed of the ranking positions, ``judge_thinking`` the chat template's
    thinking switch (``on`` / ``off``; UNSET when not set); ``compat`` says which readers read
    the outputs; the fingerprint then covers the judge
    model and every setting that changes verdicts (:func:`rmserve.fingerprint.judge_fingerprint`).
    ``judge_sampling`` is how every call is decoded (:class:`JudgeSampling`; the fingerprint
    covers it) and ``judge_engine`` what decodes it (:class:`JudgeEngineInfo`: engine, version,
    batch invariance), both as the judge engine reports them. The ``judge_*`` fields are
    ``msgspec.UNSET`` for other kinds (and for a judge engine that does not report them) and
    then left out of the JSON, so other kinds' replies are unchanged (:meth:`judge_settings`
    reads the first two).

    ``lease_holder`` names the user whose checkpoint load holds the model's lease and
    ``lease_since`` the Unix time (seconds) it was taken; both ``msgspec.UNSET`` (left out of
    the JSON) while nobody holds it (:mod:`rmserve.server.sharing.leases`).

    ``head`` (kind ``classifier``) is the head the reward is read from (:class:`RewardHead`;
    the fingerprint covers it, :func:`rmserve.fingerprint.model_fingerprint`) and
    ``attention`` the attention implementation the engine runs (:attr:`Scorer.attention`);
    both ``msgspec.UNSET`` (left out of the JSON) for an engine that does not report them.

    ``chat_template_override`` is set when the server renders with a chat template given at its
    start (``--chat-template``) instead of each checkpoint's own: the first
    :data:`~rmserve.fingerprint.FINGERPRINT_HEX_CHARS` hex characters of the sha256 of that
    file's text. The fingerprint covers the template either way; this field lets a client that
    keys its score store by checkpoint folder (``rmserve sweep``) tell the two apart without
    loading the checkpoint. ``msgspec.UNSET`` (left out of the JSON) otherwise.
    """

    name: str
    max_model_len: int
    dtype: str
    fingerprint: str
    engine: str
    swap_count: int = 0
    last_swap_time: float | None = None
    kind: ModelKind = CLASSIFIER_KIND
    mode: str | None = None
    ref_model: str | None = None
    compat: str = "none"
    judge_max_tokens: int | msgspec.UnsetType = msgspec.UNSET
    judge_seed: int | msgspec.UnsetType = msgspec.UNSET
    judge_thinking: str | msgspec.UnsetType = msgspec.UNSET
    judge_sampling: JudgeSampling | msgspec.UnsetType = msgspec.UNSET
    judge_engine: JudgeEngineInfo | msgspec.UnsetType = msgspec.UNSET
    lease_holder: str | msgspec.UnsetType = msgspec.UNSET
    lease_since: float | msgspec.UnsetType = msgspec.UNSET
    head: RewardHead | msgspec.UnsetType = msgspec.UNSET
    attention: str | msgspec.UnsetType = msgspec.UNSET
    chat_template_override: str | msgspec.UnsetType = msgspec.UNSET

    def scorer(self) -> Scorer | None:
        """What scores with this model (:class:`Scorer`: ``engine``, ``attention``, ``head``);
        None when the engine reports neither a head nor an attention implementation."""
        if self.head is msgspec.UNSET and self.attention is msgspec.UNSET:
            return None
        return Scorer(
            engine=self.engine,
            attention=ATTENTION_UNKNOWN if self.attention is msgspec.UNSET else self.attention,
            head=None if self.head is msgspec.UNSET else self.head,
        )

    def judge_settings(self) -> tuple[int | None, int | None]:
        """``(judge_max_tokens, judge_seed)``, each None when not sent (other kinds)."""
        max_tokens = None if self.judge_max_tokens is msgspec.UNSET else self.judge_max_tokens
        seed = None if self.judge_seed is msgspec.UNSET else self.judge_seed
        return max_tokens, seed


class LoadModelRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Body of ``POST /v1/models/load``: serve the checkpoint folder ``path`` as ``name``.

    ``force`` (admins only): swap even though another user holds the model's lease or has
    pinned work in flight on it; left out of the JSON when false. ``model``: on a server
    serving several models, the served name of the one to replace (may be left out when the
    server serves one model); left out of the JSON when None.
    """

    name: str
    path: str
    force: bool = False
    model: str | None = None


class ReleaseModelRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Body of ``POST /v1/models/release``: end the lease on the model ``name``."""

    name: str


class ModelList(msgspec.Struct, frozen=True):
    """Body of ``GET /v1/models``: the models this server scores with (one, or one per
    ``--model NAME=PATH`` of a server serving several)."""

    models: tuple[ModelInfo, ...]


class LoadModelResponse(ModelList, frozen=True):
    """Body of a successful ``POST /v1/models/load``: ``GET /v1/models``'s reply plus how the
    checkpoint was loaded — ``swap_kind`` ``reload`` (weights into the running engine) or
    ``restart`` (the engine restarted on it: another architecture or tokenizer). Decodes as
    :class:`ModelList` too."""

    swap_kind: str


HealthStatus = Literal["ready", "loading", "failed", "stopping", "restarting", "restoring"]
"""Server states reported by ``GET /health``; only ``ready`` answers 200."""


class HealthReply(msgspec.Struct, frozen=True):
    """Body of ``GET /health``: 200 when ``status`` is ``ready``, else 503 with ``Retry-After``.

    Attributes:
        status: ``ready`` (scoring); ``loading`` (the engine is starting); ``failed`` (the
            engine did not start, or a restart after a checkpoint swap failed); ``stopping``
            (shutting down); ``restarting`` (a checkpoint swap restarts the engine);
            ``restoring`` (a failed in-place reload: the previous weights are loaded again).
        version: the server's rmserve version (``rmserve.__version__``), sent in every
            state; ``""`` when decoding the reply of a server that does not send it.
    """

    status: HealthStatus
    version: str = ""


class LimitDetail(msgspec.Struct, frozen=True):
    """The limit a request broke on its own (``error.limit`` of a 413 ``request_over_limit``).

    Attributes:
        name: which limit: ``user.tokens_per_minute`` (the user's prompt-token budget per
            minute), ``user.max_inflight_groups`` (the user's groups in flight) or
            ``server.max_inflight_groups`` (the model's ``--max-inflight-groups``).
        unit: what it counts: ``tokens`` or ``groups``.
        limit: the limit's value, in ``unit``.
        requested: what the request alone holds, in ``unit`` (more than ``limit``).
    """

    name: str
    unit: str
    limit: int
    requested: int
# --- vLLM-compatible pooling routes (``POST /classify``, ``POST /pooling``) ---------------------

ActivationApplied = Literal["none", "sigmoid"]
"""What a vLLM-compatible reply's values are: ``none`` — the raw reward logit; ``sigmoid`` —
σ(logit) = 1 / (1 + e^(−logit)), vLLM's default activation for a one-label classifier."""


class ClassifyRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Body of ``POST /classify``: the fields of vLLM's classification request (text form)
    that rmserve honours; each input is scored as it is, without a chat template.

    Attributes:
        input: one text, a list of texts, one token-id list, or a list of token-id lists
            (one list of one kind; checked by the server, which names ``input[i]``).
        model: the served model's name (None: the only model).
        truncate_prompt_tokens: keep at most this many tokens of each input (``-1``: the
            model's max length); None: an input over the max length is not scored.
        truncation_side: which end a cut removes tokens from (``left`` keeps the end);
            None: the tokenizer's ``truncation_side`` (``right`` when it has none).
        use_activation: vLLM ≥ 0.11's switch; False answers raw logits.
        activation: the older vLLM name of the same switch (verl sends it); False answers
            raw logits. With neither False the values are σ(logit), as vLLM answers.
        add_special_tokens: tokenize texts with the tokenizer's special tokens (BOS), as
            vLLM does by default; ignored for token-id inputs.
        user, request_id: carried for vLLM clients; ``request_id`` names the reply's ``id``.
        priority: vLLM's scheduling priority; only 0 (rmserve's fair queue orders requests,
            see the ``X-RMServe-Priority`` header).
    """

    input: str | list[str | int | list[int]]
    model: str | None = None
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None
    use_activation: bool | None = None
    activation: bool | None = None
    add_special_tokens: bool = True
    user: str | None = None
    request_id: str | None = None
    priority: int = 0


class PoolingRequest(ClassifyRequest, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Body of ``POST /pooling``: :class:`ClassifyRequest`'s fields plus vLLM's pooling ones,
    of which rmserve serves one value each: ``task`` None or ``classify`` (the sequence
    classifier's one pooled value), ``encoding_format`` ``float``, ``dimensions`` None."""

    task: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None


class PromptTokensDetails(msgspec.Struct, frozen=True):
    """``usage.prompt_tokens_details``: prompt tokens served from the prefix cache."""

    cached_tokens: int


class PoolingUsage(msgspec.Struct, frozen=True):
    """``usage`` of a vLLM-compatible reply: tokens of the inputs sent to the engine.

    vLLM's own keys, all present: ``completion_tokens`` is 0 and ``completion_tokens_details``
    null, as vLLM sends them; ``prompt_tokens_details`` holds the prefix-cache hits where vLLM
    0.32's pooling routes send null."""

    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: None = None


class PoolingNote(msgspec.Struct, frozen=True, omit_defaults=True):
    """The ``rmserve`` member of a vLLM-compatible reply (vLLM clients ignore it): which
    activation the values carry, the served fingerprint, and the tokens cut per input when
    ``truncate_prompt_tokens`` was given."""

    activation: ActivationApplied
    fingerprint: str
    truncated_tokens: tuple[int, ...] | None = None


class ClassifyData(msgspec.Struct, frozen=True, omit_defaults=True):
    """One input's entry in a ``POST /classify`` reply (vLLM's fields, plus ``error``).

    ``probs`` holds one value per class (the served classifier has one): σ(logit) or the raw
    logit (see :class:`PoolingNote`); null, with ``error``, for an input that was not scored
    (over the max length, a non-finite reward). ``label`` is the checkpoint's ``id2label``
    name of the largest value (null when unknown or not scored)."""

    index: int
    label: str | None
    probs: tuple[float, ...] | None
    num_classes: int
    error: ResponseError | None = None


class ClassifyResponse(msgspec.Struct, frozen=True):
    """Body of a successful ``POST /classify`` reply: vLLM's fields plus ``rmserve``."""

    id: str
    object: str
    created: int
    model: str
    data: tuple[ClassifyData, ...]
    usage: PoolingUsage
    rmserve: PoolingNote


class PoolingData(msgspec.Struct, frozen=True, omit_defaults=True):
    """One input's entry in a ``POST /pooling`` reply: ``data`` is the pooled output, one value
    per class (null, with ``error``, for an input that was not scored)."""

    index: int
    object: str
    data: tuple[float, ...] | None
    error: ResponseError | None = None


class PoolingResponse(msgspec.Struct, frozen=True):
    """Body of a successful ``POST /pooling`` reply: vLLM's fields plus ``rmserve``."""

    id: str
    object: str
    created: int
    model: str
    data: tuple[PoolingData, ...]
    usage: PoolingUsage
    rmserve: PoolingNote


# --- OpenRLHF's remote reward model (``POST /get_reward``) -------------------------------------


class GetRewardRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Body of ``POST /get_reward``, as OpenRLHF's remote-RM client sends it.

    Attributes:
        query: one text per sample: prompt + response as the policy's tokenizer decodes them
            (its chat template applied, special tokens kept).
        prompts: per sample, the prompt text (OpenRLHF sends it; used to split prompt and
            response where the query starts with it); None or the same length as ``query``.
        labels: per sample, the dataset label (OpenRLHF sends it; a reward model does not use
            it; any JSON value); None or the same length as ``query``.
        model: the model to score with, on a server of several (OpenRLHF sends none).
    """

    query: list[str]
    prompts: list[str | None] | None = None
    labels: list[msgspec.Raw] | None = None
    model: str | None = None


class GetRewardNote(msgspec.Struct, frozen=True):
    """The ``rmserve`` member of a ``POST /get_reward`` reply (OpenRLHF reads only ``rewards``,
    ``scores`` and ``extra_logs``).

    Attributes:
        template: how the queries became the reward model's input: ``re-templated
            FAMILY→rm`` (conversation recovered from the policy's template, rendered with the
            RM's) or ``passed through`` (tokenized as sent, no BOS added).
        model: the served model's name.
        fingerprint: the served model's fingerprint.
        num_tokens: per query, the tokens the reward model scored.
    """

    template: str
    model: str
    fingerprint: str
    num_tokens: tuple[int, ...]


class GetRewardResponse(msgspec.Struct, frozen=True):
    """Body of a successful ``POST /get_reward`` reply (OpenRLHF's ``serve_rm`` fields plus
    ``rmserve``).

    Attributes:
        rewards: one raw reward per query (the reward head's logit, as ``/v1/score`` gives).
        scores: the same values (OpenRLHF's own server sends its rewards again; its trainer
            logs them as ``score`` and its dynamic filtering reads them).
        extra_logs: name → one number per query, which OpenRLHF logs per sample: ``rm_tokens``,
            the tokens the reward model scored (as floats).
        rmserve: :class:`GetRewardNote`.
    """

    rewards: tuple[float, ...]
    scores: tuple[float, ...]
    extra_logs: dict[str, tuple[float, ...]]
    rmserve: GetRewardNote


class ErrorDetail(msgspec.Struct, frozen=True):
    """The ``error`` member of an error reply.

    Attributes:
        type: the stable error type (e.g. ``invalid_request``, ``engine_not_ready``; see
            :mod:`rmserve.errors`), or an HTTP reason in snake case (``not_found``,
            ``method_not_allowed``) for faults outside rmserve's own classes.
        message: what went wrong, for people; names the field and the limit where one
            applies. Decodes as ``""`` when a (foreign) reply leaves it out.
        field: path of the offending request value (e.g. ``groups[2].responses[1]``), or
            None. Always written, as ``null`` when None.
        limit: for ``request_over_limit`` only, the limit the request broke and what it held
            (:class:`LimitDetail`), so a client can split it; left out of the JSON otherwise.
    """

    type: str
    message: str = ""
    field: str | None = None
    limit: LimitDetail | msgspec.UnsetType = msgspec.UNSET


class ErrorBody(msgspec.Struct, frozen=True):
    """Body of every non-200 reply except ``GET /health``: ``{"error": {"type", "message", "field"}}``
    (and ``limit`` for a ``request_over_limit``)."""

    error: ErrorDetail


class ScoreKind(msgspec.Struct, frozen=True, omit_defaults=True):
    """What kind of score a run's rewards are: the ``kind``, ``mode``, ``ref_model`` and
    ``compat`` of the :class:`ModelInfo` it started with (see there), as every
    :class:`ScoreRecord` of the run carries them. Defaults describe a classifier."""

    kind: ModelKind = CLASSIFIER_KIND
    mode: str | None = None
    ref_model: str | None = None
    compat: str = "none"

    @classmethod
    def of(cls, info: ModelInfo) -> ScoreKind:
        """The score kind of a server's model."""
        return cls(kind=info.kind, mode=info.mode, ref_model=info.ref_model, compat=info.compat)

    def describe(self, *, name: str | None = None, mode_word: str = "mode", protocols: Sequence[str] = ()) -> str:
        """Words for messages and report headers: ``classifier``, or e.g. ``dpo (mode reference,
        reference 'ref-7b', compat none)``.

        ``name`` replaces the kind's name at the front (e.g. ``DPO implicit reward``) and
        ``mode_word`` the word before the mode (e.g. ``--protocol`` for a judge); the compat is
        left out only for a classifier of compat ``none``. ``protocols`` (a judge's, as its
        records name them) come first, and the mode then says how they were chosen:
        ``judge (protocol rmbench-pairwise, chosen by --protocol auto, compat none)``.
        """
        parts = [f"{mode_word} {self.mode}"] if self.mode is not None else []
        if protocols:
            chosen = [] if self.mode is None else [
                f"chosen by {mode_word} {self.mode}" if self.mode == "auto" else f"{mode_word} {self.mode}"
            ]
            parts = [f"protocol{'s' if len(protocols) > 1 else ''} {', '.join(protocols)}", *chosen]
        if self.ref_model is not None:
            parts.append(f"reference {self.ref_model!r}")
        if self.kind != CLASSIFIER_KIND or self.compat != "none":
            parts.append(f"compat {self.compat}")
        name = self.kind if name is None else name
        return f"{name} ({', '.join(parts)})" if parts else name


class ScoreRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """One scored group as stored (one JSONL line) and read back by the metrics.

    Attributes:
        benchmark, domain, id: the group key.
        num_chosen: how many leading rewards belong to chosen responses.
        rewards: one raw reward per response, response order; ``None`` where scoring that
            response failed (see ``errors``) — metrics treat it as NaN.
        num_tokens: scored sequence length per response (tokens, template included).
        num_cached_tokens: prefix-cache hit tokens per response.
        truncated_tokens: tokens cut per response, when truncation was requested.
        model: the model name the server reported.
        fingerprint: the model fingerprint the server reported.
        styles: RM-Bench response styles, copied from the group.
        errors: per response, why it has no reward (a :class:`ResponseError`), ``None``
            where scored; absent when every response was scored.
        truncation: the truncation the group was scored under (None: none was asked). A
            rerun with other options scores a group that failed again; one with the same
            options does not.
        extras: the engine's per-response values beside the reward (:attr:`GroupResult.extras`,
            copied unchanged): name → one value per response, response order. For ``kind``
            ``dpo``: ``policy_logp`` (sum of the policy's answer-token log-probs, nats),
            ``ref_logp`` (the reference's; null when reference-free), ``policy_logp_norm``
            (L2 norm of the policy's per-token log-probs), ``answer_tokens`` (count) and
            ``bos`` (what the sequence starts with: ``template``, ``bos-prepended (official)``
            or ``eos-as-bos (official)``). None (omitted) when the engine sent none, as for
            classifiers.
        kind: what kind of score ``rewards`` are, copied from the :class:`ModelInfo` the run
            started with: ``classifier`` (default; a reward head's logits) or ``dpo`` (a DPO
            policy's implicit reward).
        mode: DPO only: ``reference`` or the reference-free ``avg``/``sum``/``norm``; else None.
        ref_model: DPO with a reference only: the reference model's name; else None.
        compat: ``none`` (default) or ``official`` (the official script's defects reproduced).

        judge: kind ``judge`` only: the judge's calls and the group's score under its
            protocol (:attr:`GroupResult.judge`, copied unchanged); ``rewards`` are then
            per-response summaries (:data:`JUDGE_REWARDS_DOC`) and ``mode`` is the protocol.
        judge_sampling, judge_engine: kind ``judge`` only: how the judge decoded and what
            decoded (:attr:`GroupResult.judge_sampling`, :attr:`GroupResult.judge_engine`,
            copied unchanged). None (omitted) in records written before rmserve recorded
            them: their settings are unknown (the metrics say so).
        scorer: what scored the group (engine, attention implementation, head), copied from
            the reply (:attr:`ScoreResponse.scorer`). None (omitted) in records written
            before rmserve recorded it, or from an engine that reports none.

    The last nine are omitted when at their defaults.
    """

    benchmark: str
    domain: str
    id: str
    num_chosen: int
    rewards: tuple[float | None, ...]
    num_tokens: tuple[int, ...] = ()
    num_cached_tokens: tuple[int, ...] = ()
    model: str = ""
    fingerprint: str = ""
    truncated_tokens: tuple[int, ...] | None = None
    styles: tuple[str, ...] | None = None
    errors: tuple[ResponseError | None, ...] | None = None
    truncation: Truncation | None = None
    extras: dict[str, tuple[float | int | str | None, ...]] | None = None
    kind: ModelKind = CLASSIFIER_KIND
    mode: str | None = None
    ref_model: str | None = None
    compat: str = "none"
    judge: JudgeGroupResult | None = None
    judge_sampling: JudgeSampling | None = None
    judge_engine: JudgeEngineInfo | None = None
    scorer: Scorer | None = None

    @property
    def key(self) -> GroupKey:
        return GroupKey(self.benchmark, self.domain, self.id)

    @property
    def score_kind(self) -> ScoreKind:
        """What kind of score the rewards are (kind, mode, reference, compat)."""
        return ScoreKind(kind=self.kind, mode=self.mode, ref_model=self.ref_model, compat=self.compat)

    @property
    def first_error(self) -> ResponseError | None:
        """Why the first unscored response has no reward; None when every response was scored."""
        return next((e for e in self.errors or () if e is not None), None)

    @property
    def scored(self) -> bool:
        """Whether every response has a reward (no ``errors``)."""
        return self.first_error is None

    def rewards_as_float(self) -> list[float]:
        """Rewards with ``None`` mapped to NaN."""
        return [math.nan if r is None else float(r) for r in self.rewards]


_encoder = msgspec.json.Encoder()


def encode(record: msgspec.Struct) -> bytes:
    """Serialise a record to compact JSON bytes (NaN/inf are written as ``null``)."""
    return _encoder.encode(record)


def decode(data: bytes | str, type_: type[msgspec.Struct]):
    """Decode JSON into ``type_``; raises ``msgspec.ValidationError`` naming the field path."""
    return msgspec.json.decode(data, type=type_)

"""OpenRLHF's remote reward model, ``POST /get_reward``: policy-templated queries scored with
the reward model's own chat template.

OpenRLHF (``--reward.remote_url``, ``--remote_rm_url`` before 0.9) posts ``{"query": [text, …],
"prompts": [text, …], "labels": […]}``, each query the prompt its policy's chat template
rendered plus the generated response, decoded with the special tokens kept. This kind is the
classifier kind (:mod:`rmserve.server.kinds.classifier`) with another ``prepare``; one query is
one group of the one scoring path (admission, users' limits, pins, fair queue, result cache,
``/metrics``). How a query becomes the reward model's tokens (:func:`template_path`):

- **re-templated** — the server's ``--policy-template`` names a family, or a template file of
  one that is not the reward model's template: the conversation is read back from the query
  (:func:`rmserve.server.render.policy_template.parse_query`, the query's ``prompts`` entry
  fixing where the response starts when the query starts with it) and rendered with the reward
  model's template as ``POST /v1/score`` renders it (:meth:`Renderer.render_request`: the same
  token ids, so the same reward);
- **passed through** — ``--policy-template rm``, a template file whose text is the reward
  model's template, or no ``--policy-template``: the query is tokenized as it is, without
  special tokens (the BOS in the text, written by the template, is the only one: none is
  added, and a text starting with two is refused). When the reward model's template is one of
  the families its form is checked first (BOS included); without ``--policy-template`` it must
  be one, or the request is refused (nothing would say the text is in the RM's format).

A query that cannot be scored fails the whole request, naming ``query[i]`` (400: not in the
policy template's form, with the character offset and what was expected there; 413: over
``max_model_len``): OpenRLHF 0.11's trainer turns each reward into a tensor, so a null would
crash it, and a made-up number would train the policy on it. OpenRLHF sends one query per
request, so this costs no other sample.
"""

from __future__ import annotations

from dataclasses import dataclass

from rmserve.server.kinds.base import PreparedGroup
from rmserve.server.kinds.classifier import ClassifierKind, prepared_group
from rmserve.server.render.chat import RenderedGroup, Renderer
from rmserve.server.render.policy_template import (
    FAMILIES,
    SAME_AS_RM,
    Family,
    QueryParseError,
    check_form,
    detect_family,
    parse_query,
)

from rmserve.errors import EngineError, InvalidRequest, SequenceTooLong
from rmserve.schema import (
    GetRewardNote,
    GetRewardRequest,
    GetRewardResponse,
    ModelInfo,
    RequestGroup,
    ScoreRequest,
    ScoreResponse,
)

PASSED_THROUGH = "passed through"
"""``rmserve.template`` of a reply whose queries were tokenized as sent."""


@dataclass(frozen=True, slots=True)
class TemplatePath:
    """How the queries become the reward model's input (module docstring).

    Attributes:
        policy: the policy's family, to read queries with (None: passed through).
        check: passed through only: the family the queries' form is checked against (the
            reward model's), None when it is none of the families (``--policy-template rm``).
    """

    policy: Family | None
    check: Family | None = None

    @property
    def note(self) -> str:
        """``re-templated FAMILY→rm`` or ``passed through``."""
        return PASSED_THROUGH if self.policy is None else f"re-templated {self.policy.name}→rm"


def rm_family(renderer: Renderer) -> Family | None:
    """The family of the reward model's chat template (the probe rendered by its tokenizer),
    None when it is none of them."""
    def render(messages: list[dict[str, str]], family: Family) -> str:
        return renderer.tokenizer.apply_chat_template(
            messages, chat_template=renderer.chat_template, tokenize=False, add_generation_prompt=False
        )

    return detect_family(render)


def template_path(setting: str | None, family: str | None, file_text: str | None, renderer: Renderer) -> TemplatePath:
    """The path of a server's ``--policy-template`` (``setting``; its ``family`` and, for a
    file, ``file_text``: :class:`~rmserve.server.config.ServerConfig`) for the reward model
    ``renderer`` renders.

    Raises:
        InvalidRequest: no ``--policy-template`` and the reward model's template is none of
            the families (field ``query``: the server must be told what the queries are).
    """
    if family is not None and (file_text is None or file_text != renderer.chat_template):
        return TemplatePath(policy=FAMILIES[family])
    check = rm_family(renderer)
    if setting is None and check is None:
        raise InvalidRequest(
            "this server was started without --policy-template and the reward model's chat template is none of "
            f"{', '.join(FAMILIES)}, so nothing says the queries are in its format: restart it with "
            f"--policy-template FAMILY or FILE (the policy's template: queries are re-templated) or "
            f"--policy-template {SAME_AS_RM} (queries are in the reward model's format: scored as sent)",
            field="query",
        )
    return TemplatePath(policy=None, check=check)


def start_warning(setting: str | None, renderer: Renderer) -> str | None:
    """What the start log says when ``POST /get_reward`` would refuse every query: no
    ``--policy-template`` (``setting`` None) and the reward model's template is none of the
    families (:func:`template_path` raises for each request then). None when it would work.
    Said at start because a trainer retries each refused request (OpenRLHF: 5 tries a sample)."""
    if setting is not None or rm_family(renderer) is not None:
        return None
    return (
        "POST /get_reward (OpenRLHF) will refuse every query: no --policy-template was given and the reward "
        f"model's chat template is none of the known families ({', '.join(FAMILIES)}); restart with "
        f"--policy-template FAMILY or FILE (the policy's template) or --policy-template {SAME_AS_RM} to serve "
        "trainers on it"
    )


class GetRewardKind(ClassifierKind):
    """The classifier kind over OpenRLHF's queries (module docstring); built per request.

    Args:
        request: the decoded body.
        setting, family, file_text: the server's ``--policy-template`` (:func:`template_path`).

    Attributes:
        path: after :meth:`prepare`, the :class:`TemplatePath` used.
    """

    def __init__(self, request: GetRewardRequest, *, setting: str | None, family: str | None,
                 file_text: str | None) -> None:
        self.request = request
        self.setting = setting
        self.family = family
        self.file_text = file_text
        self.path: TemplatePath | None = None

    def prepare(
        self, request: ScoreRequest, checked: None, info: ModelInfo, renderer: Renderer | None
    ) -> list[PreparedGroup]:
        """One group per query, its token ids by :attr:`path` (runs on a render thread).

        Raises:
            InvalidRequest: a query not in the expected form (field ``query[i]``, the message
                naming the character offset and what was expected), a query with no token or
                one starting with two BOS, or :func:`template_path`'s refusal.
            SequenceTooLong: a query over ``max_model_len`` tokens (field ``query[i]``).
        """
        assert renderer is not None
        self.path = template_path(self.setting, self.family, self.file_text, renderer)
        if self.path.policy is None:
            sequences = self._passed_through(renderer)
        else:
            sequences = self._retemplated(self.path.policy, renderer)
        limit = info.max_model_len
        groups = []
        for i, ids in enumerate(sequences):
            if len(ids) > limit:
                raise SequenceTooLong(
                    f"query[{i}] is {len(ids):,} tokens as the reward model scores it ({self.path.note}), over "
                    f"max_model_len={limit:,}; nothing of the request was scored",
                    field=f"query[{i}]", value=len(ids), limit=limit,
                )
            rendered = RenderedGroup(id=str(i), token_ids=(ids,), prompt_tokens=len(ids))
            groups.append(prepared_group(info.fingerprint, rendered))
        return groups

    def _passed_through(self, renderer: Renderer) -> list[list[int]]:
        check = self.path.check if self.path is not None else None
        if check is not None:
            for i, text in enumerate(self.request.query):
                try:
                    check_form(text, check)
                except QueryParseError as exc:
                    raise _parse_error(i, exc, "the reward model's template") from None
        sequences = renderer.encode_texts(self.request.query, add_special_tokens=False)
        bos = renderer.bos_token_id
        for i, ids in enumerate(sequences):
            if not ids:
                raise InvalidRequest(f"query[{i}] has no token; nothing to score", field=f"query[{i}]", value=0, limit=1)
            sequences[i] = ids = renderer.lead(ids)  # the tokenizer's BOS where the template wrote none, as /v1/score
            if bos is not None and ids[:2] == [bos, bos]:
                raise InvalidRequest(
                    f"query[{i}] starts with the BOS token twice; a query passed through is tokenized as sent: "
                    "send it with one", field=f"query[{i}]",
                )
        return sequences

    def _retemplated(self, family: Family, renderer: Renderer) -> list[list[int]]:
        prompts = self.request.prompts or [None] * len(self.request.query)
        groups = []
        for i, (text, prompt) in enumerate(zip(self.request.query, prompts, strict=True)):
            try:
                conversation = parse_query(text, family, prompt)
            except QueryParseError as exc:
                raise _parse_error(i, exc, f"the policy template ({family.name})") from None
            groups.append(RequestGroup(id=str(i), messages=conversation.messages, responses=(conversation.response,)))
        try:
            rendered = renderer.render_request(ScoreRequest(groups=tuple(groups)), too_long="mark")
        except InvalidRequest as exc:  # the RM's template rejected a conversation: name the query
            field = exc.field or ""
            if not field.startswith("groups["):
                raise
            index = field[len("groups["):].split("]", 1)[0]
            raise InvalidRequest(f"query[{index}]: {exc.message}", field=f"query[{index}]") from None
        return [group.token_ids[0] for group in rendered]


def _parse_error(i: int, exc: QueryParseError, against: str) -> InvalidRequest:
    return InvalidRequest(f"query[{i}] is not in the form of {against}: {exc}", field=f"query[{i}]",
                          value=exc.offset)


def reply(scored: ScoreResponse, kind: GetRewardKind) -> GetRewardResponse:
    """OpenRLHF's reply for the scored queries (``scored.results[i]`` answers ``query[i]``):
    ``rewards`` the raw rewards, ``scores`` the same, ``extra_logs`` ``{"rm_tokens": […]}``.

    Raises:
        EngineError: a query the engine gave no reward (a non-finite one, or an engine
            error), naming ``query[i]``: no reward is made up.
    """
    rewards = []
    for i, result in enumerate(scored.results):
        reward = result.rewards[0]
        if reward is None:
            error = result.errors[0] if result.errors is not None else None
            why = error.message if error is not None else "no reward"
            raise EngineError(f"query[{i}] has no reward: {why}; nothing of the request is answered", field=f"query[{i}]")
        rewards.append(reward)
    tokens = tuple(result.num_tokens[0] for result in scored.results)
    assert kind.path is not None
    note = GetRewardNote(template=kind.path.note, model=scored.model, fingerprint=scored.fingerprint,
                         num_tokens=tokens)
    return GetRewardResponse(rewards=tuple(rewards), scores=tuple(rewards),
                             extra_logs={"rm_tokens": tuple(float(n) for n in tokens)}, rmserve=note)

"""The judge's start-up probe: the conversations a judge will send, checked before any group.

A chat template that refuses a system message (Gemma-style templates call
``raise_exception('System role not supported')``; an OpenAI-compatible server in front of one
answers 400) would otherwise end a run at its first ranking call. So every judge engine checks,
when it loads (and when it loads another checkpoint), that the conversations its protocol
choice sends can be sent: a local engine renders them with its chat template
(:func:`check_chat_template`), a remote one sends one of them with ``max_tokens`` 1
(``rmserve.server.engines.openai_judge``). A refusal is a start-up error
(:class:`~rmserve.errors.ServerFault`) naming the option that fixes it.

The probe conversations (:func:`probe_calls`) are the first planned call of one small made-up
group per protocol the choice covers (:func:`~rmserve.server.kinds.judge_protocols.plan_group`
with the server's settings): RewardBench 2 non-Ties (``ranking``, or ``ratings``), Ties (rated)
and RM-Bench (``pairwise``), so they carry exactly the roles and instructions real calls carry.
Each comes with its counterpart under ``--no-judge-system-prompt`` (the instructions merged into
the user turn) when that differs, so a refusal can be pinned on the system message: the
counterpart is tried too, and only when it passes does the error say that the system message is
what the template refuses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rmserve.errors import InvalidRequest, ServerFault
from rmserve.schema import RMBENCH_STYLES, Group, Message
from rmserve.server.kinds.judge import JudgeSettings
from rmserve.server.kinds.judge_protocols import plan_group

NO_SYSTEM_PROMPT_FLAG = "--no-judge-system-prompt"
"""The option that merges the ranking instructions into the user turn (``EngineConfig.judge_system_prompt``
false; the command line form of every ``EngineConfig`` boolean is ``--no-`` + its name)."""

CHAT_TEMPLATE_FLAG = "--chat-template"
"""The option that gives a judge another chat template (``EngineConfig.chat_template``)."""

_QUESTION = "What is 2 + 2?"
_ANSWERS = ("4", "5", "3", "22")

_PROBE_GROUPS: dict[str, Group] = {
    "ranking": Group("rewardbench2", "Factuality", "probe", (Message("user", _QUESTION),), _ANSWERS, 1),
    "ties": Group("rewardbench2", "Ties", "ref:0", (Message("user", _QUESTION),), _ANSWERS[:2], 1),
    "pairwise": Group(
        "rm-bench", "chat", "probe", (Message("user", _QUESTION),),
        ("4", "4.", "**4**", "5", "5.", "**5**"), 3, RMBENCH_STYLES + RMBENCH_STYLES,
    ),
}

_COVERS: dict[str, tuple[str, ...]] = {
    "auto": ("ranking", "ties", "pairwise"),
    "ranking": ("ranking", "ties"),
    "ratings": ("ranking", "ties"),
    "pairwise": ("pairwise",),
}
"""Per protocol choice, the probe groups its calls look like (a RewardBench 2 choice rates Ties)."""


@dataclass(frozen=True)
class ProbeCall:
    """One conversation the judge will send, and how it reads without a system message.

    Attributes:
        protocol: the protocol of the call (e.g. ``rb2-ranking``).
        messages: the chat messages, as the server's settings plan them.
        merged: the same call planned with the instructions in the user turn
            (``--no-judge-system-prompt``) when that differs from ``messages``; else None.
    """

    protocol: str
    messages: tuple[Message, ...]
    merged: tuple[Message, ...] | None = None

    @property
    def roles(self) -> list[str]:
        """The roles of ``messages``, in order."""
        return [m.role for m in self.messages]


def probe_calls(settings: JudgeSettings) -> tuple[ProbeCall, ...]:
    """The probe conversations of a judge with ``settings`` (see the module docstring), those
    with a system message first, each conversation once.

    E.g. the defaults (``auto``, system prompt on) give the ranking call (system + user), the
    Ties rating call (user) and the pairwise call (user).
    """
    merged_settings = dataclasses.replace(settings, system_prompt=False)
    calls: dict[tuple[Message, ...], ProbeCall] = {}
    for name in _COVERS[settings.protocol]:
        group = _PROBE_GROUPS[name]
        plan = plan_group(group, settings.protocol_config())
        messages = plan.prompts[0].messages
        merged = plan_group(group, merged_settings.protocol_config()).prompts[0].messages
        calls.setdefault(messages, ProbeCall(plan.protocol, messages, merged if merged != messages else None))
    return tuple(sorted(calls.values(), key=lambda call: "system" not in call.roles))


def system_role_refused(who: str, protocol: str, detail: str) -> ServerFault:
    """The start-up error of a judge whose template (or endpoint) refuses the system message of
    ``protocol``'s call but takes the same call with the instructions in the user turn; names
    :data:`NO_SYSTEM_PROMPT_FLAG` (field ``judge_system_prompt``)."""
    return ServerFault(
        f"judge_system_prompt: {who} refuses the judge's {protocol} call, which sends its instructions as a system "
        f"message ({detail}); the same call with the instructions in the user turn is accepted (the server checks "
        f"every call its protocol choice may send at start, whichever benchmark comes). Start it (serve, run, eval) "
        f"with {NO_SYSTEM_PROMPT_FLAG} (the ranking instructions then open the user turn, as the official "
        "--no_system_prompt does)",
        field="judge_system_prompt",
    )


def check_chat_template(render: Callable[[Sequence[Message]], object], settings: JudgeSettings, *, model: str) -> None:
    """Render every probe call (:func:`probe_calls`) with ``render`` (a judge renderer's
    ``render_text``: the chat template with its generation prompt), before any group is judged.

    Raises:
        ServerFault: the template refuses a call: when it is the call's system message
            (the call without it renders), field ``judge_system_prompt`` and the message names
            ``--no-judge-system-prompt`` (:func:`system_role_refused`); otherwise field
            ``chat_template``, naming the call's roles, the template's reason and
            ``--chat-template FILE``.
    """
    for call in probe_calls(settings):
        try:
            render(call.messages)
            continue
        except InvalidRequest as exc:
            detail = exc.message
        if call.merged is not None:
            try:
                render(call.merged)
            except InvalidRequest:
                pass
            else:
                raise system_role_refused(f"the chat template of {model!r}", call.protocol, detail)
        raise ServerFault(
            f"chat_template: the chat template of {model!r} refuses the judge's {call.protocol} call (roles "
            f"{call.roles}): {detail}; give the judge a chat template that renders it ({CHAT_TEMPLATE_FLAG} FILE)",
            field="chat_template",
        )

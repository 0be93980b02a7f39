"""Conversations recovered from texts a policy's chat template wrote (``POST /get_reward``).

OpenRLHF sends a reward server each sample as one text: the prompt its policy's chat template
rendered and the response the policy generated, decoded with the special tokens kept. To score
it with the reward model's *own* template, the conversation is recovered from that text and
rendered again (:mod:`rmserve.server.kinds.get_reward`). This module knows the policy
templates by *family*: how a family writes a turn, and how to read turns back.

A :class:`Family` writes ``bos``, then per turn ``turn_start + role + role_end + content +
turn_end + separator``; a generation prompt is ``turn_start + assistant_role + role_end``:

- ``chatml`` (Qwen2, Qwen2.5, Qwen3): ``<|im_start|>role\\n…<|im_end|>\\n``, no BOS;
- ``llama3`` (Llama 3, 3.1, 3.2, 3.3): ``<|begin_of_text|>``, then
  ``<|start_header_id|>role<|end_header_id|>\\n\\n…<|eot_id|>``;
- ``gemma`` (Gemma 2, 3): ``<bos>``, then ``<start_of_turn>role\\n…<end_of_turn>\\n``, the
  assistant's role written ``model``.

A template file (``--policy-template FILE``) is not parsed in general: it is rendered with a
probe conversation (sentinel contents, each family's special tokens) and taken as the first
family whose reader gets the probe's turns back (:func:`detect_family`); a template of no
family is refused when the server starts. The same probe names the family of the reward
model's own template (used to check texts passed through unchanged).

Reading (:func:`parse_query`) is strict: the text must be, from its first character, an
optional BOS and whole turns, the last one the assistant's (left open when the generation
stopped at its length limit), then nothing but the family's end-of-text tokens. Anything
else raises :class:`QueryParseError` with the character offset and what was expected there —
never a guess. What the policy generated is kept as it is (special tokens inside it included),
less its closing ``turn_end`` and end-of-text tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rmserve.schema import Message


@dataclass(frozen=True, slots=True)
class Family:
    """How a family of chat templates writes a conversation (see the module docstring).

    Attributes:
        name: the name ``--policy-template`` takes.
        bos: text written once before the first turn ("" for none).
        turn_start, role_end, turn_end, separator: a turn is ``turn_start + role + role_end +
            content + turn_end + separator``.
        role_names: template role → message role, where they differ (gemma's ``model``).
        end_tokens: texts a generation may end with besides ``turn_end`` (the tokenizers'
            end-of-text tokens), dropped at the end of a text.
        eos: the ``eos_token`` a template file is probed with.
    """

    name: str
    bos: str
    turn_start: str
    role_end: str
    turn_end: str
    separator: str
    role_names: dict[str, str] = field(default_factory=dict)
    end_tokens: tuple[str, ...] = ()
    eos: str = ""

    def message_role(self, role: str) -> str:
        """The message role of a template role (``model`` → ``assistant`` for gemma)."""
        return self.role_names.get(role, role)

    def template_role(self, role: str) -> str:
        """The template role of a message role."""
        return next((t for t, m in self.role_names.items() if m == role), role)

    def render(self, messages: Sequence[tuple[str, str]], *, generation_prompt: bool = False) -> str:
        """The text this family writes for ``(role, content)`` turns (and an open assistant turn)."""
        parts = [self.bos]
        for role, content in messages:
            parts.append(f"{self.turn_start}{self.template_role(role)}{self.role_end}{content}{self.turn_end}{self.separator}")
        if generation_prompt:
            parts.append(f"{self.turn_start}{self.template_role('assistant')}{self.role_end}")
        return "".join(parts)


FAMILIES: dict[str, Family] = {
    "chatml": Family("chatml", "", "<|im_start|>", "\n", "<|im_end|>", "\n",
                     end_tokens=("<|endoftext|>",), eos="<|im_end|>"),
    "llama3": Family("llama3", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>", "",
                     end_tokens=("<|end_of_text|>", "<|eom_id|>"), eos="<|eot_id|>"),
    "gemma": Family("gemma", "<bos>", "<start_of_turn>", "\n", "<end_of_turn>", "\n",
                    role_names={"model": "assistant"}, end_tokens=("<eos>",), eos="<eos>"),
}
"""The families ``--policy-template`` names, by name."""

SAME_AS_RM = "rm"
"""``--policy-template rm``: the policy's template is the reward model's (texts pass through)."""

MAX_ROLE_CHARS = 64
"""Longest role name read (a longer one means the text is not in the family's form)."""


class QueryParseError(ValueError):
    """A text that is not a conversation in a family's form.

    Attributes:
        offset: character offset in the text where reading stopped.
        expected: what was expected there, in words.
    """

    def __init__(self, offset: int, expected: str, family: str) -> None:
        super().__init__(f"does not parse as a {family} conversation: at character {offset}, expected {expected}")
        self.offset = offset
        self.expected = expected


@dataclass(frozen=True, slots=True)
class Conversation:
    """A recovered sample: the turns before the response (last one ``user``) and the response."""

    messages: tuple[Message, ...]
    response: str


def _turns(text: str, family: Family, *, open_last: bool) -> tuple[list[tuple[str, str, int]], bool]:
    """``(role, content, offset of the turn)`` of every turn of ``text`` (module docstring), and
    whether the last turn was left open (no ``turn_end``: a generation cut at its length, or a
    generation prompt). Trailing end-of-text tokens are dropped.

    Raises:
        QueryParseError: naming the offset and what was expected there.
    """
    pos = len(family.bos) if family.bos and text.startswith(family.bos) else 0
    turns: list[tuple[str, str, int]] = []
    opened = False
    expect_start = f"{family.turn_start!r} (the start of a turn)"
    if pos >= len(text):
        raise QueryParseError(pos, expect_start, family.name)
    while pos < len(text):
        rest = text[pos:]
        if turns and _only_end_tokens(rest, family):
            break
        if not text.startswith(family.turn_start, pos):
            raise QueryParseError(pos, expect_start if not turns else f"{expect_start} or the end of the text",
                                  family.name)
        role_at = pos + len(family.turn_start)
        role_stop = text.find(family.role_end, role_at, role_at + MAX_ROLE_CHARS + len(family.role_end))
        role = text[role_at:role_stop] if role_stop >= 0 else ""
        if role_stop < 0 or not role or family.turn_start in role or family.turn_end in role:
            raise QueryParseError(role_at, f"a role name followed by {family.role_end!r}", family.name)
        content_at = role_stop + len(family.role_end)
        end = text.find(family.turn_end, content_at)
        if end < 0:
            if not open_last:
                raise QueryParseError(len(text), f"{family.turn_end!r} (the end of the {role} turn)", family.name)
            turns.append((family.message_role(role), _strip_end_tokens(text[content_at:], family), pos))
            opened = True
            break
        content = text[content_at:end]
        nested = content.find(family.turn_start)
        if nested >= 0:  # a turn that never ended before the next one began
            raise QueryParseError(content_at + nested, f"{family.turn_end!r} (the end of the {role} turn)", family.name)
        turns.append((family.message_role(role), content, pos))
        pos = end + len(family.turn_end)
        if family.separator and text.startswith(family.separator, pos):
            pos += len(family.separator)
    return turns, opened


def _only_end_tokens(rest: str, family: Family) -> bool:
    """Whether ``rest`` is made of end-of-text tokens only (at least one)."""
    if not rest:
        return False
    while rest:
        token = next((t for t in family.end_tokens if rest.startswith(t)), None)
        if token is None:
            return False
        rest = rest[len(token):]
    return True


def _strip_end_tokens(content: str, family: Family) -> str:
    """``content`` less the end-of-text tokens it ends with."""
    stripped = True
    while stripped:
        stripped = False
        for token in family.end_tokens:
            if token and content.endswith(token):
                content = content[: -len(token)]
                stripped = True
    return content


def _conversation(turns: list[tuple[str, str, int]], end: int, family: Family) -> Conversation:
    """The turns as a sample: the last turn the response, the one before it ``user``.

    Raises:
        QueryParseError: no turn, a last turn other than the assistant's, or no user turn
            right before it.
    """
    if not turns:
        raise QueryParseError(end, f"{family.turn_start!r} (the start of a turn)", family.name)
    role, response, at = turns[-1]
    if role != "assistant":
        raise QueryParseError(at, f"the assistant's response as the last turn (found a {role!r} turn)", family.name)
    if len(turns) < 2 or turns[-2][0] != "user":
        found = f"a {turns[-2][0]!r} turn" if len(turns) >= 2 else "no turn"
        raise QueryParseError(at, f"a 'user' turn before the response ({found} there)", family.name)
    return Conversation(tuple(Message(r, c) for r, c, _ in turns[:-1]), response)


def parse_query(text: str, family: Family, prompt: str | None = None) -> Conversation:
    """The conversation and response of a policy-templated ``text`` (module docstring).

    ``prompt``, when ``text`` starts with it and it reads as turns ending in an open assistant
    turn (the generation prompt), fixes where the response starts: the response is the open
    turn's text (a template's prefill, often empty) plus everything after the prompt, less one
    closing ``turn_end`` (+ ``separator``) and end-of-text tokens at its end; anything else after
    that closing ``turn_end`` is an error. Otherwise the whole text is read.

    Raises:
        QueryParseError: naming the character offset in ``text`` and what was expected there.
    """
    if prompt and text.startswith(prompt):
        try:
            turns, opened = _turns(prompt, family, open_last=True)
        except QueryParseError:
            turns, opened = [], False
        if opened and turns and turns[-1][0] == "assistant":
            role, prefill, at = turns[-1]
            tail = text[len(prompt):]
            stop = tail.find(family.turn_end)
            if stop >= 0:
                after = len(prompt) + stop + len(family.turn_end)
                if family.separator and text.startswith(family.separator, after):
                    after += len(family.separator)
                if after < len(text) and not _only_end_tokens(text[after:], family):
                    raise QueryParseError(after, "the end of the text after the response's "
                                          f"{family.turn_end!r}", family.name)
                tail = tail[:stop]
            turns[-1] = (role, prefill + _strip_end_tokens(tail, family), at)
            return _conversation(turns, len(text), family)
    turns, _ = _turns(text, family, open_last=True)
    return _conversation(turns, len(text), family)


def check_form(text: str, family: Family) -> None:
    """Check that ``text`` is a whole conversation in ``family``'s form, BOS included when the
    family writes one (a text passed through unchanged).

    Raises:
        QueryParseError: as :func:`parse_query`, or a missing BOS (offset 0).
    """
    if family.bos and not text.startswith(family.bos):
        raise QueryParseError(0, f"{family.bos!r} (the BOS the reward model's template writes; a text passed "
                              "through is tokenized as it is, with no BOS added)", family.name)
    parse_query(text, family)


PROBE: tuple[tuple[str, str], ...] = (
    ("user", "rmserve-probe-user-1"), ("assistant", "rmserve-probe-assistant-1"),
    ("user", "rmserve-probe-user-2"), ("assistant", "rmserve-probe-assistant-2"),
)
"""The probe conversation a template is rendered with to name its family (sentinel contents)."""


def detect_family(render: Callable[[list[dict[str, str]], Family], str]) -> Family | None:
    """The first family (:data:`FAMILIES` order) whose reader gets :data:`PROBE` back from the
    template ``render`` applies: the same roles in order (after any system turns the template
    adds itself), each content holding its sentinel. ``render(messages, family)`` renders a
    conversation with that family's special tokens (a template file needs them given; a
    tokenizer's own template has its own). None when no family reads it, or the template
    refuses the probe.
    """
    messages = [{"role": role, "content": content} for role, content in PROBE]
    for family in FAMILIES.values():
        try:
            text = render(messages, family)
            turns, opened = _turns(text, family, open_last=False)
        except Exception:  # noqa: BLE001 - a template may raise anything on a probe; it is not this family
            continue
        while turns and turns[0][0] == "system":
            turns = turns[1:]
        if not opened and len(turns) == len(PROBE) and all(
            role == want and sentinel in content for (role, content, _), (want, sentinel) in zip(turns, PROBE)
        ):
            return family
    return None


def render_template_file(template: str, messages: list[dict[str, str]], family: Family) -> str:
    """``template`` (Jinja text) rendered as transformers renders a chat template (sandboxed,
    ``trim_blocks``/``lstrip_blocks``, ``raise_exception``, ``tojson``), with ``family``'s BOS
    and EOS as ``bos_token`` / ``eos_token``, no generation prompt."""
    import json

    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value, **kw: json.dumps(value, ensure_ascii=False, **kw)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: "26 Jul 2024"
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=False, bos_token=family.bos, eos_token=family.eos,
    )


def family_of_template_file(template: str) -> Family | None:
    """The family of a Jinja chat-template text (:func:`detect_family` over
    :func:`render_template_file`); None when it is none of :data:`FAMILIES`."""
    return detect_family(lambda messages, family: render_template_file(template, messages, family))

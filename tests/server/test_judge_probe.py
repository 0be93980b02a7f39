"""The judge's start-up probe: which conversations it renders, and the errors a refusing template gives.

No torch, no tokenizers: the tokenizer here renders real Jinja templates with jinja2 and the
``raise_exception`` helper transformers gives templates, so a Gemma-style template (no system
role) fails exactly as it fails in transformers. The engines' own probes (vLLM, transformers) are
in ``test_judge_probe_engines.py``; the OpenAI-compatible endpoint's in ``test_judge_openai.py``.
"""

from __future__ import annotations

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from rmserve.server.kinds.judge import JudgeSettings
from rmserve.server.kinds.judge_probe import (
    CHAT_TEMPLATE_FLAG,
    NO_SYSTEM_PROMPT_FLAG,
    check_chat_template,
    probe_calls,
)
from rmserve.server.kinds.judge_protocols import RANKING_SYSTEM_PROMPT
from rmserve.server.render.judge import JudgeRenderer

from rmserve.cli_common import engine_options
from rmserve.errors import ServerFault
from rmserve.schema import Message

NO_SYSTEM_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "<turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}</turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<turn>model\n{% endif %}"
)
"""A Gemma-style template: refuses a system message with ``raise_exception``."""

ANY_ROLE_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)

USER_FIRST_TEMPLATE = (
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}"
    "{{ raise_exception('The first message must be the system prompt') }}{% endif %}{{ m['content'] }}{% endfor %}"
)
"""A template that refuses every conversation without a system message (so merging cannot help)."""


class JinjaTokenizer:
    """``apply_chat_template`` as transformers runs it: a sandboxed Jinja environment with
    ``raise_exception`` (raising ``TemplateError``); records every rendered text."""

    def __init__(self) -> None:
        self.rendered: list[str] = []

    def apply_chat_template(self, chat, *, chat_template, tokenize, add_generation_prompt):
        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        text = env.from_string(chat_template).render(
            messages=chat, add_generation_prompt=add_generation_prompt, bos_token="<bos>"
        )
        self.rendered.append(text)
        return text


def render_with(template: str) -> tuple[JinjaTokenizer, JudgeRenderer]:
    tokenizer = JinjaTokenizer()
    return tokenizer, JudgeRenderer(tokenizer, chat_template=template, max_prompt_tokens=1)


def refusal(template: str, settings: JudgeSettings, model: str) -> tuple[ServerFault, JinjaTokenizer]:
    """The start-up error of ``template`` under ``settings``, and what it rendered before it."""
    tokenizer, renderer = render_with(template)
    with pytest.raises(ServerFault) as caught:
        check_chat_template(renderer.render_text, settings, model=model)
    return caught.value, tokenizer


def test_probe_calls_of_each_protocol_choice():
    calls = probe_calls(JudgeSettings())
    assert [(c.protocol, c.roles) for c in calls] == [
        ("rb2-ranking", ["system", "user"]),
        ("rb2-rating-ties", ["user"]),
        ("rmbench-pairwise", ["user"]),
    ]
    ranking = calls[0]
    # The made-up group: "What is 2 + 2?" with the answers 4, 5, 3 and 22 in some order.
    user = ranking.messages[1].content
    assert ranking.messages[0] == Message("system", RANKING_SYSTEM_PROMPT)
    assert user.startswith("[User Question]\nWhat is 2 + 2?\n\n[The Start of Assistant A's Answer]\n")
    assert sorted(line for line in user.split("\n") if line in ("4", "5", "3", "22")) == ["22", "3", "4", "5"]
    assert ranking.merged == (Message("user", RANKING_SYSTEM_PROMPT + "\n\n" + user),)
    assert calls[1].merged is None and calls[2].merged is None

    merged = probe_calls(JudgeSettings(system_prompt=False))
    assert [(c.protocol, c.roles, c.merged) for c in merged][0] == ("rb2-ranking", ["user"], None)
    assert [(c.protocol, c.roles) for c in probe_calls(JudgeSettings(protocol="ratings"))] == [
        ("rb2-rating", ["user"]), ("rb2-rating-ties", ["user"]),
    ]
    assert [c.protocol for c in probe_calls(JudgeSettings(protocol="pairwise"))] == ["rmbench-pairwise"]


def test_a_template_without_a_system_role_is_a_start_error_naming_the_flag():
    err, tokenizer = refusal(NO_SYSTEM_TEMPLATE, JudgeSettings(), "gemma-like")
    assert err.field == "judge_system_prompt"
    assert err.message.startswith(
        "judge_system_prompt: the chat template of 'gemma-like' refuses the judge's rb2-ranking call, which sends "
        "its instructions as a system message (the judge's chat template rejected the messages (['system', 'user']): "
        "TemplateError: System role not supported); the same call with the instructions in the user turn is accepted "
        "(the server checks every call its protocol choice may send at start, whichever benchmark comes). Start it "
        "(serve, run, eval) with --no-judge-system-prompt"
    )
    # Rendered: the ranking call refused, then its merged form (accepted); nothing else needed.
    assert len(tokenizer.rendered) == 1 and tokenizer.rendered[0].startswith("<bos><turn>user\nPlease act as")


def test_the_flag_named_is_the_command_line_form_of_judge_system_prompt():
    (option,) = [o for o in engine_options() if o.name == "judge_system_prompt"]
    assert option.argv(False) == [NO_SYSTEM_PROMPT_FLAG] == ["--no-judge-system-prompt"]
    (template,) = [o for o in engine_options() if o.name == "chat_template"]
    assert template.flag == CHAT_TEMPLATE_FLAG == "--chat-template"


def test_the_same_template_passes_without_the_system_prompt():
    tokenizer, renderer = render_with(NO_SYSTEM_TEMPLATE)
    check_chat_template(renderer.render_text, JudgeSettings(system_prompt=False), model="gemma-like")
    # ranking (merged into the user turn), Ties rating, pairwise: three renders, all accepted.
    assert len(tokenizer.rendered) == 3
    assert all(text.startswith("<bos><turn>user\n") and text.endswith("<turn>model\n") for text in tokenizer.rendered)


def test_a_template_with_a_system_role_passes():
    tokenizer, renderer = render_with(ANY_ROLE_TEMPLATE)
    check_chat_template(renderer.render_text, JudgeSettings(), model="chat-model")
    assert len(tokenizer.rendered) == 3
    assert tokenizer.rendered[0].startswith("<system>Please act as an impartial judge")


def test_a_refusal_the_system_message_does_not_explain_names_the_chat_template():
    # The ranking call (system first) renders; the Ties rating call (user only) is refused.
    err, _ = refusal(USER_FIRST_TEMPLATE, JudgeSettings(), "odd")
    assert err.field == "chat_template"
    assert err.message == (
        "chat_template: the chat template of 'odd' refuses the judge's rb2-rating-ties call (roles ['user']): "
        "the judge's chat template rejected the messages (['user']): TemplateError: The first message must be the "
        "system prompt; give the judge a chat template that renders it (--chat-template FILE)"
    )
    # With the system prompt off even the ranking call has no system message: refused, and the
    # merged form is the call itself, so the error is the template's, not the system message's.
    err, _ = refusal(USER_FIRST_TEMPLATE, JudgeSettings(system_prompt=False), "odd")
    assert err.field == "chat_template" and "rb2-ranking call (roles ['user'])" in err.message

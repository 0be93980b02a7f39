"""A tiny tokenizer shaped like Qwen2.5's, built locally with ``tokenizers`` (no download).

Byte-level BPE with a hand-made vocabulary, so every id can be worked out by hand:

- byte ``b`` → id ``b`` (the 256 byte symbols of byte-level BPE, in byte order), so a plain
  ASCII piece is its bytes: ``[*b"user\\n"]``;
- the special tokens ``<|endoftext|>`` = 256 (pad), ``<|im_start|>`` = 257,
  ``<|im_end|>`` = 258 (EOS), and **no BOS** (``bos_token`` None), as Qwen2 / Qwen2.5 / Qwen3;
- two merges: ``"\\n\\n"`` → 259 (made only where the pre-tokenizer keeps the two newlines
  together: before a space or at the end of a piece) and ``"Hi"`` → 260.

The pre-tokenizer is byte-level with the GPT-2 split, so a newline before a letter stands
alone. The chat template is ChatML with a default system block when the conversation has no
system turn (:data:`CHATML_TEMPLATE`)::

    <|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n
    <|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n{response}<|im_end|>\\n

``tokenizers`` and ``transformers`` are imported inside :func:`chatml_tokenizer` (tests that
use it are marked ``model``).
"""

from __future__ import annotations

from pathlib import Path

ENDOFTEXT, IM_START, IM_END, NEWLINES, HI = 256, 257, 258, 259, 260
"""Ids of the special tokens and of the two merged tokens."""

DEFAULT_SYSTEM = "You are a helpful assistant."
"""The system prompt the template writes when the conversation has none."""

CHATML_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if not (loop.first and message['role'] == 'system') -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
"""A ChatML template with a default system block (the layout of Qwen2.5's, without tools)."""


def byte_symbols() -> list[str]:
    """The printable character byte-level BPE uses for each byte, in byte order (GPT-2's map:
    printable Latin-1 bytes stand for themselves, the others take 256, 257, … in byte order)."""
    kept = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    symbols, extra = [], 0
    for byte in range(256):
        if byte in kept:
            symbols.append(chr(byte))
        else:
            symbols.append(chr(256 + extra))
            extra += 1
    return symbols


def chatml_tokenizer(folder: Path):
    """Write the tokenizer to ``folder`` (``tokenizer.json``, ``tokenizer_config.json``) and load
    it back with ``transformers.AutoTokenizer``, as the server loads a model's tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    symbols = byte_symbols()
    newline = symbols[ord("\n")]
    vocab = {symbol: byte for byte, symbol in enumerate(symbols)}
    vocab.update({"<|endoftext|>": ENDOFTEXT, "<|im_start|>": IM_START, "<|im_end|>": IM_END,
                  newline + newline: NEWLINES, "Hi": HI})
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[(newline, newline), ("H", "i")]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
    )
    folder = Path(folder)
    tokenizer.save_pretrained(folder)
    loaded = AutoTokenizer.from_pretrained(str(folder))
    assert loaded.bos_token_id is None and loaded.eos_token_id == IM_END
    return loaded

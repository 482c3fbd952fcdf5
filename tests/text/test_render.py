"""Prompt rendering: the chat template or a plain prompt, BOS, the answer prefix, and the encoded frame."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from longeval.errors import ConfigError
from longeval.text.render import CONTEXT_MARKER, Frame, PromptFormat, render_frame, render_messages, turn_layout
from longeval.text.tokenizer import Encoder, load_encoder

USER = "Read this.\n{context}\nWhat is the magic number?"
PREFIX = " The magic number is"
BOS = 1  # <|im_start|> in SmolLM2's vocabulary; any id will do for the fake BOS tokenizer


class Wrapped:
    """A real tokenizer with one behaviour changed: a BOS token, or no chat template."""

    def __init__(self, inner: Any, *, bos: int | None = None, chat_template: str | None = "keep") -> None:
        self._inner = inner
        self._bos = bos
        self.chat_template = inner.chat_template if chat_template == "keep" else chat_template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self._inner.encode(text, add_special_tokens=False)
        return ([self._bos] if add_special_tokens and self._bos is not None else []) + ids

    def __call__(self, texts: list[str], add_special_tokens: bool = True) -> dict[str, list[list[int]]]:
        return {"input_ids": [self.encode(t, add_special_tokens=add_special_tokens) for t in texts]}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.fixture(scope="module")
def encoder(smollm2_path: Path) -> Encoder:
    return load_encoder(str(smollm2_path))


def _ids(encoder: Encoder, text: str) -> list[int]:
    return [int(t) for t in encoder.encode(text)]


def _check_frame_ids(encoder: Encoder, frame: Frame, special: list[int]) -> None:
    """head ids + context ids + tail ids == the encoding of the whole prompt text (after the special prefix)."""
    assert frame.head_ids.dtype == np.int32 and frame.tail_ids.dtype == np.int32
    assert frame.head_ids.tolist()[: len(special)] == special
    assert frame.tail_ids.tolist() == _ids(encoder, frame.tail)
    assert frame.overhead == len(frame.head_ids) + len(frame.tail_ids)
    for context in ("Word and more words.", "The grass is green.\nNext line"):
        body = frame.context_lead + context
        whole = frame.head_ids.tolist() + _ids(encoder, body) + frame.tail_ids.tolist()
        assert whole == special + _ids(encoder, frame.head + body + frame.tail)


def test_chat_template_on(encoder: Encoder) -> None:
    frame = render_frame(encoder, PromptFormat(), USER, PREFIX)
    context = "SOME CONTEXT"
    expected = encoder.tokenizer.apply_chat_template(
        [{"role": "user", "content": USER.replace("{context}", context)}], tokenize=False, add_generation_prompt=True
    )
    assert frame.head + context + frame.tail == expected + PREFIX
    assert frame.head.startswith("<|im_start|>")
    assert frame.tail.endswith("<|im_start|>assistant\n" + PREFIX)
    assert frame.answer_prefix == PREFIX
    assert CONTEXT_MARKER not in frame.head + frame.tail
    _check_frame_ids(encoder, frame, [])
    # The special tokens of the template are single tokens, not spelled out.
    assert frame.head_ids[0] == encoder.tokenizer.convert_tokens_to_ids("<|im_start|>")


def test_system_prompt_is_a_system_turn(encoder: Encoder) -> None:
    frame = render_frame(encoder, PromptFormat(system_prompt="Be terse."), USER, PREFIX)
    assert frame.head.startswith("<|im_start|>system\nBe terse.<|im_end|>")
    _check_frame_ids(encoder, frame, [])


def test_chat_template_off_is_the_plain_text(encoder: Encoder) -> None:
    frame = render_frame(encoder, PromptFormat(chat_template=False), USER, PREFIX)
    assert frame.head == "Read this.\n"
    assert frame.tail == "\nWhat is the magic number?" + PREFIX
    assert encoder.special_prefix() == []  # SmolLM2 adds no BOS to plain text
    _check_frame_ids(encoder, frame, [])


def test_plain_mode_adds_the_tokenizers_bos(encoder: Encoder) -> None:
    bos_encoder = Encoder(Wrapped(encoder.tokenizer, bos=BOS))
    assert bos_encoder.special_prefix() == [BOS]
    frame = render_frame(bos_encoder, PromptFormat(chat_template=False), USER, PREFIX)
    assert frame.head_ids[0] == BOS
    _check_frame_ids(bos_encoder, frame, [BOS])
    # With the chat template the template's own text carries the special tokens: no extra BOS.
    chat = render_frame(bos_encoder, PromptFormat(), USER, PREFIX)
    _check_frame_ids(bos_encoder, chat, [])


@pytest.mark.parametrize("fmt", [PromptFormat(answer_prefix=False), PromptFormat(reasoning=True),
                                 PromptFormat(chat_template=False, answer_prefix=False)])
def test_no_answer_prefix(encoder: Encoder, fmt: PromptFormat) -> None:
    frame = render_frame(encoder, fmt, USER, PREFIX)
    assert frame.answer_prefix == ""
    assert PREFIX not in frame.tail
    assert frame.tail.endswith("<|im_start|>assistant\n" if fmt.chat_template else "What is the magic number?")
    _check_frame_ids(encoder, frame, [])


@pytest.mark.parametrize("user", ["no context here", "{context} and {context}", "{ context }"])
def test_context_placeholder_must_appear_exactly_once(encoder: Encoder, user: str) -> None:
    with pytest.raises(ConfigError, match="exactly once"):
        render_frame(encoder, PromptFormat(), user, PREFIX)
    with pytest.raises(ConfigError, match="exactly once"):
        render_frame(encoder, PromptFormat(chat_template=False), user, PREFIX)


def test_missing_chat_template_says_how_to_fix_it(encoder: Encoder) -> None:
    base = Encoder(Wrapped(encoder.tokenizer, chat_template=None))
    with pytest.raises(ConfigError, match=r"model\.chat_template=false"):
        render_frame(base, PromptFormat(), USER, PREFIX)
    frame = render_frame(base, PromptFormat(chat_template=False), USER, PREFIX)  # the fix works
    assert frame.head == "Read this.\n"


def test_braces_in_the_user_text_survive(encoder: Encoder) -> None:
    user = "JSON like {\"a\": 1} stays.\n{context}\nQ?"
    frame = render_frame(encoder, PromptFormat(chat_template=False), user, PREFIX)
    assert frame.head == "JSON like {\"a\": 1} stays.\n"
    _check_frame_ids(encoder, frame, [])


@pytest.mark.parametrize(
    ("user", "lead"),
    [("Documents:\n\n{context}\n\nQuestion?", ""), ("Coded words. {context}\nQuestion?", " "),
     ("{context}\nQ", ""), ("Tab\t{context}\nQ", "")],
)
@pytest.mark.parametrize("chat", [True, False])
def test_whitespace_before_the_context_tokenizes_as_in_the_whole_text(
    encoder: Encoder, user: str, lead: str, chat: bool
) -> None:
    frame = render_frame(encoder, PromptFormat(chat_template=chat), user, PREFIX)
    assert frame.context_lead == lead
    before = user.split("{context}")[0]
    assert (frame.head + frame.context_lead).endswith(before)
    _check_frame_ids(encoder, frame, [])


# -- conversations as chat messages -----------------------------------------------------------------


def _conversation(n: int) -> list[dict[str, str]]:
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Message {i}.\nLine two."}
             for i in range(2 * n)]
    return [*turns, {"role": "user", "content": "The question?"}]


@pytest.mark.parametrize("fmt", [PromptFormat(), PromptFormat(system_prompt="Be brief."),
                                 PromptFormat(chat_template=False)], ids=["chat", "system", "plain"])
@pytest.mark.parametrize("preamble", [[], [{"role": "user", "content": "Examples first."}]], ids=["bare", "preamble"])
def test_turn_layout_rebuilds_the_rendered_conversation(encoder: Encoder, fmt: PromptFormat,
                                                        preamble: list[dict[str, str]]) -> None:
    """head + turns + tail == the template applied to the messages, and the ids add up to its encoding."""
    layout = turn_layout(encoder, fmt, preamble)
    for n in (1, 4):
        messages = [*preamble, *_conversation(n)]
        text, special = render_messages(encoder, fmt, messages)
        turns = [layout.turn(messages[len(preamble) + 2 * i]["content"], messages[len(preamble) + 2 * i + 1]["content"])
                 for i in range(n)]
        assert layout.head + "".join(turns) + layout.tail("The question?") == text
        frame = layout.frame(encoder, "The question?")
        followed = [t for u in turns for t in encoder.encode_followed(u, layout.open).tolist()]  # as MRCR encodes
        ids = frame.head_ids.tolist() + followed + frame.tail_ids.tolist()
        assert ids == special + _ids(encoder, text)
        assert not layout.open[:1].isspace()
    if fmt.chat_template:
        expected = encoder.tokenizer.apply_chat_template(
            ([{"role": "system", "content": fmt.system_prompt}] if fmt.system_prompt else []) + messages,
            tokenize=False, add_generation_prompt=True)
        assert text == expected
    else:
        assert text.endswith("User:\nThe question?\n\nAssistant:\n") and text.startswith("User:\n")


def test_a_template_that_numbers_turns_is_refused(encoder: Encoder) -> None:
    numbered = copy.copy(encoder.tokenizer)
    numbered.chat_template = "{% for m in messages %}[{{ loop.index }}] {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(ConfigError, match="layout=text"):
        turn_layout(Encoder(numbered), PromptFormat(), [])


def test_a_template_that_rejects_the_roles_says_so(encoder: Encoder) -> None:
    strict = copy.copy(encoder.tokenizer)
    strict.chat_template = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                            "{{ raise_exception('roles must alternate') }}{% endif %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(ConfigError, match="cannot render"):
        turn_layout(Encoder(strict), PromptFormat(), [{"role": "user", "content": "Examples."}])

"""Prompt rendering: the model's chat template (or a plain template), and the answer prefix.

A prompt is `head + context + tail`. We render the full prompt once with a marker where the context
goes, split it there, and encode head and tail separately: the long context in between is then built
in token space from pre-encoded pieces (see `text.pieces`), so it is never re-tokenized.

Both choices that silently change scores (chat template, answer prefix; RULER #54, HELMET #12) are
explicit options and are recorded with every instance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from longeval.errors import ConfigError
from longeval.text.ruler_format import RULER_MODEL_TEMPLATES, ruler_wrap
from longeval.text.tokenizer import Encoder

CONTEXT_MARKER = "\u2063LONGEVAL_CONTEXT\u2063"


@dataclass(frozen=True)
class PromptFormat:
    """How a task's text becomes the model's input."""

    chat_template: bool = True
    """Wrap the task text as a user turn with the tokenizer's chat template (off for base models)."""
    answer_prefix: bool = True
    """Append the task's answer prefix after the template so the model completes it (RULER does)."""
    system_prompt: str | None = None
    """An optional system turn."""
    reasoning: bool = False
    """Reasoning-model mode: no answer prefix, `<think>` stripped before scoring."""
    ruler_template: str | None = None
    """RULER's per-model template by name (`model.prompt_format=ruler`, see `text.ruler_format`) instead of
    the chat template; None: the chat template (or the plain text, with `chat_template=False`)."""

    def __post_init__(self) -> None:
        if self.ruler_template is not None and self.ruler_template not in RULER_MODEL_TEMPLATES:
            raise ConfigError(f"model.ruler_template={self.ruler_template!r}; RULER's templates: "
                              f"{', '.join(RULER_MODEL_TEMPLATES)}")
        if self.ruler_template is not None and self.system_prompt:
            raise ConfigError("RULER's templates have no system turn; unset model.system_prompt with "
                              "model.prompt_format=ruler")

    def identity(self) -> dict[str, Any]:
        """The fields that name instances: every field, RULER's template only when set (so the ids of
        chat-template instances did not change when it was added)."""
        values = asdict(self)
        if values["ruler_template"] is None:
            del values["ruler_template"]
        return values


def prompt_format(model: Any) -> PromptFormat:
    """The prompt format of a `ModelConfig`: `prompt_format` chat (the model's chat template, the default)
    or ruler (RULER's `ruler_template`)."""
    kind = getattr(model, "prompt_format", "chat")
    if kind not in ("chat", "ruler"):
        raise ConfigError(f"model.prompt_format={kind!r}; choices: chat, ruler")
    return PromptFormat(chat_template=model.chat_template, answer_prefix=model.answer_prefix,
                        system_prompt=model.system_prompt, reasoning=model.reasoning,
                        ruler_template=model.ruler_template if kind == "ruler" else None)


@dataclass(frozen=True)
class Frame:
    """The prompt around the context, encoded: prompt ids = head_ids + context ids + tail_ids."""

    head: str
    tail: str
    head_ids: np.ndarray
    tail_ids: np.ndarray
    answer_prefix: str
    context_lead: str = ""
    """" " when the template puts a space before the context: the context then keeps its leading space,
    so the first word is tokenized as it would be in the whole text."""

    @property
    def overhead(self) -> int:
        return int(len(self.head_ids) + len(self.tail_ids))


CONTEXT_SLOT = "{context}"
"""Where a template puts the context. Found by plain text search, not `str.format`: other braces (a JSON
example, `{"key": "value"}`) stay as written and need no escaping."""


def render_frame(encoder: Encoder, fmt: PromptFormat, user_text: str, answer_prefix: str, *,
                 example: tuple[str, str] = ("", "")) -> Frame:
    """Render a user message that contains `{context}` exactly once into an encoded frame.

    The slot is split on as text (not `str.format`), so fill the template's other fields with `str.replace`
    or an f-string before, never `.format` over JSON braces; `render_parts` takes the texts around the context.

    Raises:
        ConfigError: the slot is missing, repeated, or escaped as for `str.format` (`{{context}}`).
    """
    if "{{context}}" in user_text:
        raise ConfigError("a task template has '{{context}}': the frame splits on the text '{context}' (it is "
                          "not str.format), so write it with single braces; other braces stay as written")
    if user_text.count(CONTEXT_SLOT) != 1:
        raise ConfigError(f"a task template must contain '{{context}}' exactly once (found "
                          f"{user_text.count(CONTEXT_SLOT)}); to keep a literal '{{context}}' in data, use "
                          "render_parts (GenContext.frame_around) with the texts before and after the context")
    before, after = user_text.split(CONTEXT_SLOT)
    return render_parts(encoder, fmt, before, after, answer_prefix, example=example)


def render_parts(encoder: Encoder, fmt: PromptFormat, before: str, after: str, answer_prefix: str, *,
                 example: tuple[str, str] = ("", "")) -> Frame:
    """Render the user message `before + context + after` into an encoded frame.

    For texts that are data rather than templates (a LongBench v2 question, a TAIL option): they may hold a
    literal "{context}", which must stay as written. `example`: a solved example (its text, then what follows it:
    answer prefix and answer), a turn of its own in RULER's templates (CWE's few-shot: RULER formats its wrapped
    template with the example), else the start of the user message.
    """
    outside = ""
    if fmt.ruler_template is not None and example[0]:
        outside = ruler_wrap(fmt.ruler_template, example[0]) + example[1]
    else:
        before = example[0] + example[1] + before
    marked = before + CONTEXT_MARKER + after
    prefix = "" if (fmt.reasoning or not fmt.answer_prefix) else answer_prefix
    tokenizer = encoder.tokenizer
    if fmt.ruler_template is not None:
        full = outside + ruler_wrap(fmt.ruler_template, marked)
        special = _bos_unless_present(encoder, full)
    elif fmt.chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                "the model's tokenizer has no chat template; set model.chat_template=false for a base model"
            )
        messages = []
        if fmt.system_prompt:
            messages.append({"role": "system", "content": fmt.system_prompt})
        messages.append({"role": "user", "content": marked})
        full = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        special: list[int] = []
    else:
        full = f"{fmt.system_prompt}\n\n{marked}" if fmt.system_prompt else marked
        special = encoder.special_prefix()
    full = full + prefix
    head, tail = full.split(CONTEXT_MARKER)
    lead = ""
    if head.endswith(" ") and not head.endswith("  "):
        head, lead = head[:-1], " "
    # Encode the head as followed by text, so a trailing "\n\n" splits as it does before the context.
    head_ids = np.concatenate([np.asarray(special, dtype=np.int32), encoder.encode_followed(head)]).astype(np.int32)
    return Frame(head=head, tail=tail, head_ids=head_ids, tail_ids=encoder.encode(tail), answer_prefix=prefix,
                 context_lead=lead)


def _bos_unless_present(encoder: Encoder, text: str) -> list[int]:
    """The tokenizer's BOS before a RULER-format prompt, unless the template's text already starts with it."""
    special = encoder.special_prefix()
    if special and encoder.encode(text[:64])[: len(special)].tolist() == special:
        return []
    return special


# -- conversations as chat messages ---------------------------------------------------------------

PLAIN_ROLES = {"system": "System", "user": "User", "assistant": "Assistant"}
"""Role labels of the plain transcript (base models, `model.chat_template=false`)."""


def render_messages(encoder: Encoder, fmt: PromptFormat, messages: list[dict[str, str]]) -> tuple[str, list[int]]:
    """A conversation's prompt text, ending where the assistant's answer starts, and the ids before it.

    With the chat template: `apply_chat_template(messages, add_generation_prompt=True)` (the system prompt,
    if any, first). Without one (base models) a plain transcript: every message as `"{Role}:\\n{content}"`,
    joined by blank lines, then `"\\n\\nAssistant:\\n"`, after the tokenizer's BOS; the answer starts on a
    line of its own, so a model that continues the transcript writes no leading space.
    """
    if fmt.ruler_template is not None:
        raise ConfigError("RULER's templates hold a single user turn, not a conversation; for MRCR use "
                          "suite.params.mrcr.layout=text with model.prompt_format=ruler")
    if fmt.system_prompt:
        messages = [{"role": "system", "content": fmt.system_prompt}, *messages]
    if fmt.chat_template:
        tokenizer = encoder.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                "the model's tokenizer has no chat template; set model.chat_template=false for a base model"
            )
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # jinja raises its own errors (e.g. roles that must alternate)
            raise ConfigError(f"the model's chat template cannot render this conversation ({exc})") from exc
        return text, []
    body = "\n\n".join(f"{PLAIN_ROLES.get(m['role'], m['role'].capitalize())}:\n{m['content']}" for m in messages)
    return f"{body}\n\n{PLAIN_ROLES['assistant']}:\n", encoder.special_prefix()


@dataclass(frozen=True)
class TurnLayout:
    """How the template renders `preamble + (user, assistant) turns + a final user message`.

    prompt = `head + turn(u1, a1) + ... + turn(un, an) + tail(question)` with
    `turn(u, a) = open + u + mid + a + close`: every turn renders alike, so a long conversation is built
    from turns encoded once (see `turn_layout`).
    """

    head: str
    open: str
    mid: str
    close: str
    after: str
    """What follows the final user message (the end of its turn and the generation prompt)."""
    special: tuple[int, ...] = ()
    """Ids before the text (the BOS of a plain transcript)."""

    def turn(self, user: str, assistant: str) -> str:
        return self.open + user + self.mid + assistant + self.close

    def tail(self, question: str) -> str:
        return self.open + question + self.after

    def frame(self, encoder: Encoder, question: str) -> Frame:
        """The encoded frame around a conversation of whole turns (no answer prefix: the turn is the cue)."""
        follower = self.open or "x"
        head_ids = np.concatenate([np.asarray(self.special, dtype=np.int32),
                                   encoder.encode_followed(self.head, follower)]).astype(np.int32)
        tail = self.tail(question)
        return Frame(head=self.head, tail=tail, head_ids=head_ids, tail_ids=encoder.encode(tail), answer_prefix="")


_MARK = "\u2063{}\u2063"


def turn_layout(encoder: Encoder, fmt: PromptFormat, preamble: list[dict[str, str]]) -> TurnLayout:
    """Find the turn pattern by rendering three marked turns and a marked question, and check it.

    Raises:
        ConfigError: the template renders turns differently from one another (e.g. it numbers them or
            rewrites earlier answers), so the conversation cannot be built from encoded turns.
    """
    marks = [_MARK.format(f"T{i}") for i in range(7)]  # u1 a1 u2 a2 u3 a3 question
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": m} for i, m in enumerate(marks[:6])]
    text, special = render_messages(encoder, fmt, [*preamble, *turns, {"role": "user", "content": marks[6]}])
    at = [text.find(m) for m in marks]
    if any(a < 0 for a in at) or at != sorted(at):
        raise ConfigError("the model's chat template drops or reorders messages; use suite.params.mrcr.layout=text")
    start = at
    end = [a + len(m) for a, m in zip(at, marks, strict=True)]
    between = [text[end[i] : start[i + 1]] for i in range(6)]  # after u1, a1, u2, a2, u3, a3
    mids, seps = between[0::2], between[1::2]
    if len(set(mids)) != 1 or len(set(seps)) != 1:
        raise ConfigError(
            "the model's chat template does not render every turn alike, so MRCR's conversation cannot be built "
            "from encoded turns; use suite.params.mrcr.layout=text"
        )
    sep, lead = seps[0], text[: start[0]]
    # The separator between turns is split into the end of one turn and the opening of the next, the
    # opening being what the head already ends with (e.g. "<|im_start|>user\n"); an opening never starts
    # with whitespace, so the context's first character is not a space the frame would move.
    opening = next(sep[k:] for k in range(len(sep) + 1)
                   if lead.endswith(sep[k:]) and not sep[k:][:1].isspace())
    return TurnLayout(head=lead[: len(lead) - len(opening)], open=opening, mid=mids[0],
                      close=sep[: len(sep) - len(opening)], after=text[end[6] :], special=tuple(special))

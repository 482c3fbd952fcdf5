"""Prompt rendering: the model's chat template (or a plain template), and the answer prefix.

A prompt is `head + context + tail`. We render the full prompt once with a marker where the context
goes, split it there, and encode head and tail separately: the long context in between is then built
in token space from pre-encoded pieces (see `text.pieces`), so it is never re-tokenized.

Both choices that silently change scores (chat template, answer prefix; RULER #54, HELMET #12) are
explicit options and are recorded with every instance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from longeval.errors import ConfigError
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


def render_frame(encoder: Encoder, fmt: PromptFormat, user_text: str, answer_prefix: str) -> Frame:
    """Render a user message that contains `{context}` exactly once into an encoded frame."""
    if user_text.count("{context}") != 1:
        raise ConfigError("a task template must contain '{context}' exactly once")
    before, after = user_text.split("{context}")
    return render_parts(encoder, fmt, before, after, answer_prefix)


def render_parts(encoder: Encoder, fmt: PromptFormat, before: str, after: str, answer_prefix: str) -> Frame:
    """Render the user message `before + context + after` into an encoded frame.

    For texts that are data rather than templates (a LongBench v2 question, a TAIL option): they may hold a
    literal "{context}", which must stay as written.
    """
    marked = before + CONTEXT_MARKER + after
    prefix = "" if (fmt.reasoning or not fmt.answer_prefix) else answer_prefix
    tokenizer = encoder.tokenizer
    if fmt.chat_template:
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

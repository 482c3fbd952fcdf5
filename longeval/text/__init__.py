"""Text layer: tokenizer, prompt rendering, haystack corpora, and contexts built in token space.

The exact-length API a generator uses, in the order it calls it (docs/adding-a-family.md walks through a family
built with it):

1. frame: `render_frame(encoder, fmt, user_text, answer_prefix)` (`GenContext.frame`) renders the prompt around
   the context once and encodes its head and tail; `render_parts` (`GenContext.frame_around`) takes the texts
   before and after the context instead of a template with `{context}`.
2. budget: `context_budget(frame, target_length, max_new_tokens)`: the tokens the context may use.
3. pieces: `piece`, `concat`, `UnitStream` (filler units cut at a word), `cut_words`: text with its token ids,
   encoded once and joined in token space; `piece(encoder, text, follower=frame.tail)` for the context's last
   piece when it ends in whitespace. Haystacks (`text.haystack`): `EssayHaystack` (`GenContext.essay_haystack()`),
   `insert_between_sentences` / `insert_between_lines` put pieces at depths (percent of the context) between
   sentences or lines, `depth_for(index, depths)` cycles a family's depths over instances.
4. fit: `choose_lengths(lengths, budget)` picks whole items (pairs, needles) that sum to the budget;
   `fit_context(encoder, frame, budget, build)` fixes the first word and retries on overflow.
5. draft: `longeval.tasks.base.draft(frame, context, references, ...)` joins frame and context (`assemble`) into
   the task's Draft; it lives with the task records, since text never imports tasks.
"""

from longeval.text.fit import choose_lengths, context_budget, fit_context
from longeval.text.haystack import EssayHaystack, depth_for, insert_between_lines, insert_between_sentences
from longeval.text.pieces import EMPTY, Piece, UnitStream, assemble, concat, cut_words, open_context, piece
from longeval.text.render import Frame, PromptFormat, render_frame, render_parts
from longeval.text.tokenizer import Encoder, load_encoder

__all__ = [
    "EMPTY",
    "Encoder",
    "EssayHaystack",
    "Frame",
    "Piece",
    "PromptFormat",
    "UnitStream",
    "assemble",
    "choose_lengths",
    "concat",
    "context_budget",
    "cut_words",
    "depth_for",
    "fit_context",
    "insert_between_lines",
    "insert_between_sentences",
    "load_encoder",
    "open_context",
    "piece",
    "render_frame",
    "render_parts",
]

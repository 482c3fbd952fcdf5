"""TAIL evaluation (§3.3, §3.5, §4.2): each built question asked at every target length, gold at its depth.

Instance `index` is the `index`-th question of the benchmark (cycling when there are more instances than
questions), in an order that interleaves domains and runs through the depths, so a small `suite.samples` still
covers every domain. The test document is cut around the question's gold segment in the evaluated model's tokens,
with the gold placed at the question's depth (`testdocs`), so the same questions are asked at every length.
The model thinks step by step and ends with "Answer: X" (512 output tokens, §4.2), or with `cot=false` answers
straight after a prefilled "Answer:" (32 tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from longeval.errors import ConfigError
from longeval.tasks.base import Draft, GenContext, context_budget, draft
from longeval.tasks.tail import prompts
from longeval.tasks.tail.dataset import DATASET_KEY, TailDataset, TailQuestion, load_tail_dataset
from longeval.tasks.tail.depths import DEFAULT_DEPTHS, check_depths
from longeval.tasks.tail.scoring import UNMAPPED, score_tail
from longeval.tasks.tail.testdocs import EncodedDomain, build_test_document, encode_domain
from longeval.text.pieces import Piece
from longeval.text.render import Frame

COT_MAX_NEW_TOKENS = 512
"""§4.2: outputs are limited to 512 tokens (the model reasons, then answers)."""
DIRECT_MAX_NEW_TOKENS = 32
"""Without chain of thought the answer is one letter after the prefilled "Answer:"."""
JUDGE_MAX_NEW_TOKENS = 8
"""The judge replies with one letter (or X)."""


@dataclass(frozen=True)
class TailParams:
    """Which benchmark, which depths, and whether the model reasons before answering."""

    dataset: str | None = None
    """The built benchmark's folder (local, file:// or s3://), written by the TAIL builder."""
    depths: tuple[float, ...] = DEFAULT_DEPTHS
    """Ask only the questions at these depths (fractions; default 5 % … 95 % in steps of 5 %, §4.1)."""
    cot: bool = True
    """Think step by step, then answer (the paper's setting); false asks for the letter only."""
    judge: bool = False
    """Send the outputs the deterministic parser cannot map to an LLM judge (a second call to the evaluated model,
    `judge_draft`); the judged instances carry `"mapped_by": "judge"` in their meta."""


def max_new_tokens(params: TailParams) -> int:
    """The output budget: 512 tokens with chain of thought, 32 without."""
    return COT_MAX_NEW_TOKENS if params.cot else DIRECT_MAX_NEW_TOKENS


def load(ctx: GenContext, params: TailParams) -> TailDataset:
    """The benchmark, read and checked once per process."""
    return ctx.cached(("tail", params.dataset), lambda: load_tail_dataset(params.dataset, key=DATASET_KEY))


def selected(ctx: GenContext, params: TailParams) -> tuple[TailQuestion, ...]:
    """The questions at the params' depths, interleaved: domain by domain within each depth rank."""
    data = load(ctx, params)
    depths = tuple(params.depths)
    return ctx.cached(("tail-select", params.dataset, data.fingerprint, depths), lambda: _select(data, depths))


def _select(data: TailDataset, depths: tuple[float, ...]) -> tuple[TailQuestion, ...]:
    wanted = {round(d, 6) for d in check_depths(depths, key="suite.params.tail.depths")}
    kept = [q for q in data.questions if round(q.depth, 6) in wanted]
    if not kept:
        raise ConfigError(
            f"suite.params.tail.depths {list(depths)} match no question of {data.path!r}; its depths are "
            f"{', '.join(f'{d:g}' for d in data.depths)}"
        )
    by_domain: dict[str, list[TailQuestion]] = {}
    for q in sorted(kept, key=lambda q: (q.domain, q.depth, q.question_id)):
        by_domain.setdefault(q.domain, []).append(q)
    rounds = max(len(qs) for qs in by_domain.values())
    return tuple(qs[r] for r in range(rounds) for _, qs in sorted(by_domain.items()) if r < len(qs))


def question_at(ctx: GenContext, params: TailParams, index: int) -> TailQuestion:
    """Instance `index`'s question; asking for more instances than questions is an error, not a repeat (a
    repeated question would count twice in every accuracy)."""
    questions = selected(ctx, params)
    if index >= len(questions):
        raise ConfigError(
            f"TAIL dataset {params.dataset!r} has {len(questions)} questions at the chosen depths; set "
            f"suite.samples to at most {len(questions)}"
        )
    return questions[index]


def encoded(ctx: GenContext, data: TailDataset, domain: str) -> EncodedDomain:
    """A domain's segments in the evaluated model's tokens, encoded once per process."""
    return ctx.cached(("tail-encoded", data.path, data.fingerprint, domain, ctx.encoder.fingerprint),
                      lambda: encode_domain(ctx.encoder, data.segments[domain]))


def render(ctx: GenContext, before: str, after: str, answer_prefix: str) -> Frame:
    """The frame `before + {context} + after`; a question or option may hold a literal "{context}"."""
    return ctx.frame_around(before, after, answer_prefix)


def generate(
    ctx: GenContext, params: TailParams, *, target_length: int, max_new_tokens: int, rng: np.random.Generator,
    index: int,
) -> Draft:
    """The prompt for question `index` with a test document of the length's budget, gold at its depth.

    `rng` is unused: the question follows from `index` and the document from the question.
    """
    data = load(ctx, params)
    question = question_at(ctx, params, index)
    before, after, prefix = prompts.evaluation_parts(question.question, question.options, cot=params.cot)
    frame = render(ctx, before, after, prefix)
    budget = context_budget(frame, target_length, max_new_tokens)
    doc = build_test_document(ctx.encoder, encoded(ctx, data, question.domain), question.gold_segment,
                              question.depth, budget, lead=frame.context_lead, name=question.domain)
    meta = {
        "question_id": question.question_id,
        "domain": question.domain,
        "depth": round(100.0 * question.depth, 2),
        "realised_depth": round(100.0 * doc.depth, 2),
        "gold_start_fraction": round(doc.start_fraction, 4),
        "question": question.question,
        "options": list(question.options),
        "answer": question.answer,
        "gold_segment": question.gold_segment,
        "segments": [doc.first_segment, doc.last_segment],
        "cot": params.cot,
        "followup": params.judge,  # unmapped outputs get a judge call (the pipeline's `followup`)
        "answer_prefix": frame.answer_prefix,
        "prompt_fingerprint": prompts.fingerprint(),
        "dataset_fingerprint": data.fingerprint,
        "dataset_version": data.manifest.version,
        "generator_model": question.generator_model,
    }
    return draft(frame, doc.piece, [question.answer], depth=round(100.0 * doc.depth, 2), complexity=question.domain,
                 meta=meta)


def judge_draft(
    ctx: GenContext, params: TailParams, first_instance_meta: dict, output: str, *, target_length: int,
    max_new_tokens: int,
) -> Draft | None:
    """The judge call for an output the deterministic parser leaves unmapped; None when the parser maps it.

    The reference maps every answer with GPT-4o-mini; here the parser goes first and the evaluated model judges
    only the rest, so most answers stay deterministic and the judged ones are marked (`mapped_by`).
    """
    meta = dict(first_instance_meta)
    text = output.strip() if isinstance(output, str) else ""
    if score_tail(text, [str(meta.get("answer", ""))], meta).error_type != UNMAPPED:
        return None
    before, after, prefix = prompts.judge_parts(str(meta.get("question", "")), list(meta.get("options") or []))
    frame = render(ctx, before, after, prefix)
    response = frame.context_lead + text
    piece = Piece(response, ctx.encoder.encode(response))
    meta.update(call="judge", mapped_by="judge", answer_prefix=frame.answer_prefix, judged_output=text,
                prompt_fingerprint=prompts.fingerprint())
    return draft(frame, piece, [str(meta.get("answer", ""))], depth=meta.get("realised_depth", 0.0),
                 complexity=str(meta.get("domain", "")), meta=meta)

"""Michelangelo §2.1, Latent List: track a Python list through a long stream of operations.

The list starts as `a = [1, 2, 3, 4, 5, 6]`. A fixed number of *relevant* operations (append, insert,
pop, remove, sort, reverse; values drawn uniformly from [-4000, 4000]) change it; the complexity of an
instance is that number (1, 5 or 20, equally represented: instance `i` has `complexities[i % 3]`). Each
relevant operation is chosen so that it changes the list (no sort of a sorted list, no reverse of a
palindrome, no pop that would empty it). They are spread uniformly at random through the context,
between filler that leaves the list as it was, drawn uniformly from the paper's three strategies:
`print("Do nothing.")` lines, even runs of `a.reverse()`, and blocks that cancel locally
(`a.append(x)` … `a.pop()`, `a.insert(0, x)` … `a.pop(0)`, nested). The question is a view of the final
list: `print`, `sum`, `min` or `max` of a slice, or `len(a)` (instance `i` asks `views[(i // 3) % 5]`).

The answer is computed by running the operations on a real Python list. Scoring is the paper's §2.1
metric: exact string match for `print`; `1 - min(1, |answer - target| / |target|)` for the numeric views,
0 when the answer is not an integer (a target of 0 needs an exact answer, as the `1e-10` in the
paper's code implies).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from longeval.errors import ConfigError, LengthError
from longeval.scoring.judgement import Judgement
from longeval.tasks.base import Draft, GenContext, context_budget, draft, fit_context
from longeval.tasks.michelangelo import prompts
from longeval.tasks.michelangelo._units import (
    UnitPool,
    depth_of,
    encode_units,
    fill_units,
    interleave,
    positions_among,
)
from longeval.text.pieces import Piece

INITIAL = (1, 2, 3, 4, 5, 6)
OPERATIONS = ("append", "insert", "pop", "remove", "sort", "reverse")
VIEWS = ("print", "sum", "min", "max", "len")
NOOP = 'print("Do nothing.")'

FILLER_VERSION = "1"
FILLER_SEED = 20240918  # the filler blocks are fixed data, like a corpus; instances sample from them
CANCELLING_BLOCKS = 4096

Op = tuple[str, tuple[int, ...]]
"""An operation: its name ("append", ..., or "print" for the do-nothing line) and integer arguments."""


@dataclass(frozen=True)
class LatentListParams:
    """The paper's settings (§2.1)."""

    complexities: tuple[int, ...] = (1, 5, 20)
    """Numbers of relevant operations; instance `i` uses `complexities[i % len(complexities)]`."""
    views: tuple[str, ...] = VIEWS
    """View operations, cycled over instances after the complexities."""
    low: int = -4000
    """Smallest value an operation inserts."""
    high: int = 4000
    """Largest value an operation inserts."""
    few_shot: bool = True
    """Show the two solved examples of Appendix A.1 before the task."""

    def __post_init__(self) -> None:
        if not self.complexities or any(int(c) < 1 for c in self.complexities):
            raise ConfigError(f"latent_list.complexities must be positive integers, got {self.complexities!r}")
        unknown = [v for v in self.views if v not in VIEWS]
        if not self.views or unknown:
            raise ConfigError(f"latent_list.views must be some of {', '.join(VIEWS)}; got {self.views!r}")
        if self.low > self.high:
            raise ConfigError(f"latent_list.low ({self.low}) must not exceed latent_list.high ({self.high})")


# -- the operation grammar and a tiny interpreter ---------------------------------------------------

_LINE = re.compile(r'>> (?:print\("Do nothing\."\)|a\.(append|insert|pop|remove|sort|reverse)\(([-\d, ]*)\))\n?')
_ARITY = {"append": (1,), "insert": (2,), "pop": (0, 1), "remove": (1,), "sort": (0,), "reverse": (0,)}


def render(op: Op) -> str:
    """The Python statement of an operation, without the `>> ` prompt."""
    name, args = op
    if name == "print":
        return NOOP
    return f"a.{name}({', '.join(str(a) for a in args)})"


def parse_line(line: str) -> Op:
    """The operation on a `>> ...` line of the grammar above; anything else is a ValueError."""
    match = _LINE.fullmatch(line)
    if match is None:
        raise ValueError(f"not a Latent List operation: {line!r}")
    name, raw = match.group(1), match.group(2)
    if name is None:
        return ("print", ())
    args = tuple(int(x) for x in raw.split(",")) if raw.strip() else ()
    if len(args) not in _ARITY[name]:
        raise ValueError(f"{name} takes {_ARITY[name]} arguments: {line!r}")
    return (name, args)


def apply(values: list[int], op: Op) -> None:
    """Run one operation on a real Python list (list methods, no eval)."""
    name, args = op
    if name == "append":
        values.append(args[0])
    elif name == "insert":
        values.insert(args[0], args[1])
    elif name == "pop":
        values.pop(*args)
    elif name == "remove":
        values.remove(args[0])
    elif name == "sort":
        values.sort()
    elif name == "reverse":
        values.reverse()
    elif name != "print":
        raise ValueError(f"unknown operation {name!r}")


def run(ops: Sequence[Op], initial: Sequence[int] = INITIAL) -> list[int]:
    """The list after running `ops` on a copy of `initial`."""
    values = list(initial)
    for op in ops:
        apply(values, op)
    return values


def query(view: str, start: int, stop: int) -> str:
    """The view statement: `sum(a[2:5])`, or `len(a)`."""
    return "len(a)" if view == "len" else f"{view}(a[{start}:{stop}])"


def view_answer(values: Sequence[int], view: str, start: int, stop: int) -> str:
    """What the interpreter prints for the view (the reference answer)."""
    if view == "len":
        return str(len(values))
    part = list(values[start:stop])
    if view == "print":
        return str(part)
    return str({"sum": sum, "min": min, "max": max}[view](part))


def _changes(name: str, values: list[int]) -> bool:
    """Whether the operation can be applied and changes the list (relevant operations must)."""
    if name in ("pop", "remove"):
        return len(values) >= 2  # never empty the list: every view needs an element
    if name == "sort":
        return values != sorted(values)
    if name == "reverse":
        return values != values[::-1]
    return True


def relevant_ops(
    rng: np.random.Generator, count: int, *, low: int = -4000, high: int = 4000
) -> tuple[list[Op], list[int]]:
    """`count` operations, each uniformly one of those that would change the current list.

    Returns:
        The operations and the list after them (run on a real list as they are drawn).
    """
    values = list(INITIAL)
    ops: list[Op] = []
    for _ in range(count):
        valid = [name for name in OPERATIONS if _changes(name, values)]
        name = valid[int(rng.integers(len(valid)))]
        if name == "append":
            op: Op = (name, (int(rng.integers(low, high + 1)),))
        elif name == "insert":
            op = (name, (int(rng.integers(0, len(values) + 1)), int(rng.integers(low, high + 1))))
        elif name == "pop":
            op = (name, (int(rng.integers(0, len(values))),))
        elif name == "remove":
            op = (name, (int(values[int(rng.integers(len(values)))]),))
        else:
            op = (name, ())
        apply(values, op)
        ops.append(op)
    return ops, values


def choose_slice(rng: np.random.Generator, length: int) -> tuple[int, int]:
    """A non-empty slice [start, stop) of a list of `length` elements."""
    start = int(rng.integers(0, length))
    return start, int(rng.integers(start + 1, length + 1))


# -- filler that never changes the list -----------------------------------------------------------


def filler_blocks(seed: int = FILLER_SEED) -> tuple[list[str], list[int]]:
    """The filler blocks of the three strategies, and each block's strategy (0, 1, 2).

    Every block leaves any non-empty list as it found it, whatever the list holds: do-nothing prints,
    an even number of reverses, or pushes undone by pops of the same end.
    """
    line = ">> {}\n".format
    prints = [line(NOOP) * k for k in (1, 2, 3)]
    reverses = [line("a.reverse()") * k for k in (2, 4)]
    rng = np.random.default_rng(seed)
    shapes = (
        ("a.append({x})", "a.pop()"),
        ("a.insert(0, {x})", "a.pop(0)"),
        ("a.append({x})", "a.insert(0, {y})", "a.pop(0)", "a.pop()"),
        ("a.reverse()", "a.append({x})", "a.pop()", "a.reverse()"),
        ("a.insert(0, {x})", "a.append({y})", "a.pop()", "a.pop(0)"),
    )
    cancelling = []
    for _ in range(CANCELLING_BLOCKS):
        shape = shapes[int(rng.integers(len(shapes)))]
        x, y = (int(v) for v in rng.integers(-4000, 4001, size=2))
        cancelling.append("".join(line(s.format(x=x, y=y)) for s in shape))
    texts = prints + reverses + cancelling
    groups = [0] * len(prints) + [1] * len(reverses) + [2] * len(cancelling)
    return texts, groups


@dataclass(frozen=True)
class FillerPool:
    """The filler blocks (`filler_blocks`) encoded once, grouped by strategy: what the context is drawn from."""

    pool: UnitPool
    offsets: np.ndarray  # first pool index of each strategy
    counts: np.ndarray  # blocks per strategy
    lines: np.ndarray  # lines per block

    def draw(self, rng: np.random.Generator):
        """A sampler: each block's strategy uniformly, then a block of that strategy uniformly."""

        def sample(n: int) -> np.ndarray:
            strategy = rng.integers(0, len(self.counts), size=n)
            return self.offsets[strategy] + rng.integers(0, self.counts[strategy])

        return sample


def filler_pool(ctx: GenContext) -> FillerPool:
    """The filler blocks for the model's tokenizer, built once per generation context."""

    def build() -> FillerPool:
        texts, groups = filler_blocks()
        counts = np.bincount(np.asarray(groups))
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
        lines = np.array([t.count("\n") for t in texts], dtype=np.int64)
        return FillerPool(UnitPool.build(ctx.encoder, texts, follower=">"), offsets, counts, lines)

    return ctx.cached(("michelangelo/latent_list/filler", FILLER_VERSION), build)


# -- the prompt ------------------------------------------------------------------------------------


def _example(ops: Sequence[str], view: str, bounds: tuple[int, int]) -> str:
    values = run([parse_line(f">> {op}") for op in ops])
    start, stop = bounds
    body = "".join(f">> {op}\n" for op in ops)
    return (f"{prompts.LATENT_LIST_INIT}{body}>> {query(view, start, stop)}\n"
            f"{prompts.LATENT_LIST_CUE} {view_answer(values, view, start, stop)}\n")


def user_text(view: str, question: str, *, few_shot: bool = True) -> str:
    """Appendix A.1: the instruction, two solved examples, then the task with `{context}` in it."""
    rule = prompts.LATENT_LIST_RULE
    if few_shot:
        text = prompts.LATENT_LIST_INTRO
        for n, (ops, bounds) in enumerate(prompts.LATENT_LIST_EXAMPLES, start=1):
            text += f"{rule}Example {n}:\n{_example(ops, view, bounds)}"
        text += f"{rule}Example {len(prompts.LATENT_LIST_EXAMPLES) + 1}:\n"
    else:
        text = prompts.LATENT_LIST_INTRO.split(" Here are")[0] + "\n" + rule
    return text + prompts.LATENT_LIST_INIT + "{context}" + f">> {question}\n"


# -- the generator ---------------------------------------------------------------------------------


def generate(
    ctx: GenContext, params: LatentListParams, *, target_length: int, max_new_tokens: int,
    rng: np.random.Generator, index: int, context_rng: np.random.Generator | None = None,
) -> Draft:
    """One Latent List instance of exactly the target length (whole lines only)."""
    complexities = tuple(params.complexities)
    complexity = int(complexities[index % len(complexities)])
    view = tuple(params.views)[(index // len(complexities)) % len(params.views)]
    ops, values = relevant_ops(rng, complexity, low=params.low, high=params.high)
    start, stop = (0, len(values)) if view == "len" else choose_slice(rng, len(values))
    question = query(view, start, stop)
    target = view_answer(values, view, start, stop)

    frame = ctx.frame(user_text(view, question, few_shot=params.few_shot), prompts.LATENT_LIST_CUE)
    budget = context_budget(frame, target_length, max_new_tokens)
    lines = [f">> {render(op)}\n" for op in ops]
    items = [Piece(t, ids) for t, ids in zip(lines, encode_units(ctx.encoder, lines, follower=">"), strict=True)]
    fixed = sum(len(p) for p in items)
    if fixed > budget:
        raise LengthError(
            f"michelangelo/latent_list at {target_length} tokens: the {complexity} relevant operations need "
            f"{fixed} tokens but only {budget} are left after the prompt and output budget; "
            "use larger suite.lengths values"
        )
    filler = filler_pool(ctx)
    fill_seed = int((context_rng if context_rng is not None else rng).integers(2**63))
    place_seed = int(rng.integers(2**63))
    placed: dict[str, Any] = {}

    def build(room: int) -> Piece:
        order, _ = fill_units(filler.pool.lengths, filler.draw(np.random.default_rng(fill_seed)), room - fixed)
        at = positions_among(len(order), len(items), np.random.default_rng(place_seed))
        context, offsets = interleave(filler.pool, order, items, at)
        lines_before = np.concatenate([[0], np.cumsum(filler.lines[order])])
        placed.update(offsets=offsets, units=len(order), lines=[int(lines_before[p]) + j for j, p in enumerate(at)])
        return context

    context = fit_context(ctx.encoder, frame, budget, build)
    return draft(
        frame, context, [target],
        depth=depth_of(placed["offsets"], len(context)),
        complexity=f"ops={complexity}",
        meta={
            "view": view,
            "query": question,
            "target": target,
            "slice": None if view == "len" else [start, stop],
            "complexity": complexity,
            "relevant_ops": [render(op) for op in ops],
            "relevant_lines": placed["lines"],
            "final_list": values,
            "filler_blocks": placed["units"],
            "prompt_fingerprint": prompts.fingerprint(),
        },
    )


# -- the metric ------------------------------------------------------------------------------------

# Possessive quantifiers: every piece starts with a character the piece before cannot take, so nothing given
# back can match, and without them "[1" + a run of spaces backtracks quadratically (19K spaces: seconds).
INT_LIST = re.compile(r"\[\s*+(?:[-+]?+\d{1,12}+\s*+(?:,\s*+[-+]?+\d{1,12}+\s*+)*+,?+\s*+)?+\]")
"""A printed list of integers ("[3, -4]", "[]"), as `parse_list` finds it in an answer."""
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])")
_MAX_DIGITS = 200
_SCAN_CHARS = 20_000


def latent_list_metric(model_answer: object, true_target: str, view_op: str) -> float:
    """The paper's §2.1 metric, on an already parsed answer (an int for numeric views, a string else).

    Exact string match for `print`; otherwise 1 minus the absolute error normalised by |target|
    (plus 1e-10), capped at 1, and 0 for an answer that is not an int.
    """
    exact = float(str(model_answer) == true_target)
    if view_op == "print":
        return exact
    if not isinstance(model_answer, int):
        return 0.0
    try:
        norm = abs(float(true_target))
        err = min(1.0, abs(float(true_target) - model_answer) / (1e-10 + norm))
    except (TypeError, ValueError, OverflowError):
        err = 1.0
    return 1.0 - err


def _answer_region(output: str) -> str:
    """The text after the last "Output:" cue (models often repeat it), without code fences."""
    text = output[-_SCAN_CHARS:] if len(output) > _SCAN_CHARS else output
    cut = text.lower().rfind(prompts.LATENT_LIST_CUE.lower())
    if cut >= 0:
        text = text[cut + len(prompts.LATENT_LIST_CUE) :]
    return text.replace("`", " ").replace("\u2212", "-").strip().lstrip("*").strip()


def parse_list(output: str) -> list[int] | None:
    """A printed list of integers: the one the answer starts with, else the last one in it."""
    region = _answer_region(output)
    found = list(INT_LIST.finditer(region))
    if not found:
        return None
    match = found[0] if found[0].start() == 0 else found[-1]
    inner = match.group(0)[1:-1].replace(" ", "").strip(",")
    return [int(x) for x in inner.split(",") if x.strip()] if inner.strip() else []


def parse_number(output: str) -> int | float | None:
    """The number the answer starts with, else the last number in it (an int unless it has decimals)."""
    region = _answer_region(output)
    found = list(_NUMBER.finditer(region))
    if not found:
        return None
    token = (found[0] if found[0].start() == 0 else found[-1]).group(0).replace(",", "")
    digits = token.lstrip("+-").split(".")[0]
    if len(digits) > _MAX_DIGITS:
        sign = -1 if token.startswith("-") else 1
        return sign * 10**_MAX_DIGITS  # too large to be right; keeps int() within its digit limit
    return float(token) if "." in token else int(token)


def score_latent_list(output: str, references: Sequence[str], meta: dict[str, Any]) -> Judgement:
    """Score one answer with the paper's metric; never raises on any output."""
    view = str(meta.get("view", "print"))
    target = str(meta.get("target", references[0] if references else ""))
    if view == "print":
        values = parse_list(output)
        if values is None:
            return Judgement(0.0, "", "no_list")
        parsed = str(values)
        score = latent_list_metric(parsed, target, view)
        return Judgement(score, parsed, "" if score == 1.0 else "wrong_list")
    number = parse_number(output)
    if number is None:
        return Judgement(0.0, "", "not_a_number")
    if not isinstance(number, int):  # the paper's code scores any non-int answer 0
        return Judgement(0.0, str(number)[:64], "not_an_integer")
    score = latent_list_metric(number, target, view)
    error = "" if score == 1.0 else ("inexact" if score > 0.0 else "wrong_value")
    return Judgement(score, str(number)[:64], error)

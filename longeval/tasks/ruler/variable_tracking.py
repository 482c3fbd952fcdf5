"""RULER §3.2, Multi-hop tracing: variable tracking (VT).

A variable is initialised with a 5-digit value (`VAR ABCDE = 12345`) and bound along a chain
(`VAR FGHIJ = VAR ABCDE`), the statements scattered in order among repeated noise lines. The model must
return every variable that holds the value. RULER's configuration: 1 chain of 4 hops, 5-letter names,
and one in-context example (about 500 tokens) before the task. Layout as RULER's
(scripts/data/synthetic/variable_tracking.py, generate_input_output): one noise paragraph or statement per line.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

from longeval.errors import ConfigError, LengthError
from longeval.tasks.base import Draft, GenContext, context_budget, draft, fit_context
from longeval.tasks.ruler.templates import fill
from longeval.text.corpus import NOISE
from longeval.text.pieces import Piece, UnitStream, concat, end_line
from longeval.text.tokenizer import Encoder

ICL_TOKENS = 500
"""RULER builds its in-context example at max_seq_length=500 (variable_tracking.py, main): the largest number of
noise lines whose filled template, answer prefix included, is at most 500 tokens."""


ICL_NAME_LENGTH = 3
"""RULER's in-context example names its variables with 3 letters: 26**3 = 17,576 names."""
DRAWS_PER_NAME = 32
"""Draws allowed per distinct name before `draw_chains` gives up: drawing all 17,576 three-letter names takes about
10.4 draws each (the coupon collector's N ln N), so only a limit this check missed can reach it."""


@dataclass(frozen=True)
class VtParams:
    num_chains: int = 1
    num_hops: int = 4
    name_length: int = 5
    icl_example: bool = True

    def __post_init__(self) -> None:
        """Refuse chains that need more distinct variable names than there are: drawing them would never end."""
        for name, least in (("num_chains", 1), ("num_hops", 0), ("name_length", 1)):
            if getattr(self, name) < least:
                raise ConfigError(f"{name}={getattr(self, name)}: must be at least {least}")
        need = self.num_chains * (self.num_hops + 1)
        letters = min(self.name_length, ICL_NAME_LENGTH) if self.icl_example else self.name_length
        if need > 26**letters:
            most = 26**letters // self.num_chains - 1
            where = ("the in-context example's" if self.icl_example and letters < self.name_length
                     else f"name_length={self.name_length}:")
            raise ConfigError(
                f"num_hops={self.num_hops}: num_chains x (num_hops + 1) = {need:,} variables need distinct names, "
                f"but {where} {letters}-letter names are only {26**letters:,}; use num_hops <= {most:,}")


NOISE_LINE = NOISE + "\n"
"""One noise paragraph per line, as RULER's "\n".join of the noise haystack."""


def draw_chains(params: VtParams, rng: np.random.Generator,
                name_length: int) -> tuple[list[list[str]], list[list[str]]]:
    """Variable names per chain, and each chain's statements in order (each a line); gives up, naming the
    parameters, rather than draw distinct names forever."""
    names: list[str] = []
    seen: set[str] = set()  # membership in a set, not the list: the same draws, without a quadratic scan
    need = params.num_chains * (params.num_hops + 1)
    for _ in range(DRAWS_PER_NAME * need + 1000):
        if len(names) == need:
            break
        name = "".join(rng.choice(list(string.ascii_uppercase), size=name_length))
        if name not in seen:
            seen.add(name)
            names.append(name)
    else:
        if len(names) < need:
            raise ConfigError(f"suite.params.vt: gave up drawing {need:,} distinct {name_length}-letter variable "
                              f"names (num_chains x (num_hops + 1)); lower num_hops or num_chains")
    chains_vars, chains_lines = [], []
    for c in range(params.num_chains):
        chain = names[c * (params.num_hops + 1) : (c + 1) * (params.num_hops + 1)]
        value = int(rng.integers(10000, 100000))
        lines = [f"VAR {chain[0]} = {value}\n"]
        lines += [f"VAR {chain[j + 1]} = VAR {chain[j]} \n" for j in range(params.num_hops)]
        chains_vars.append(chain)
        chains_lines.append(lines)
    return chains_vars, chains_lines


def _place(lines_per_chain: list[list[str]], noise_lines: int, rng: np.random.Generator) -> list[list[int]]:
    """For each chain, the noise lines its statements go before: RULER's sorted random.sample(range(n), k)."""
    out = []
    for lines in lines_per_chain:
        if noise_lines < len(lines):
            raise LengthError(
                f"the context holds {noise_lines} noise lines, too few for a {len(lines)}-statement chain; "
                "use a larger suite.lengths value"
            )
        out.append(sorted(int(p) for p in rng.choice(noise_lines, size=len(lines), replace=False)))
    return out


def _context(stream: UnitStream, encoder: Encoder, budget: int, chains_lines: list[list[str]], rng_state: int) -> Piece:
    """Whole noise lines with the chain statements between them; it ends on a whole noise line, as RULER's."""
    n = stream.units_within(budget)
    rng = np.random.default_rng(rng_state)
    positions = _place(chains_lines, n, rng)
    inserts: dict[int, list[str]] = {}
    for lines, where in zip(chains_lines, positions, strict=True):
        for line, at in zip(lines, where, strict=True):
            inserts.setdefault(at, []).append(line)
    parts: list[Piece] = []
    start = 0
    for at in sorted(inserts):
        parts.append(stream.slice(start, at))
        parts.extend(Piece(line, encoder.encode_followed(line)) for line in inserts[at])
        start = at
    parts.append(stream.slice(start, n))
    return end_line(encoder, concat(parts))


def _icl_text(params: VtParams, chains_vars: list[list[str]], chains_lines: list[list[str]], noise_lines: int,
              seed: int) -> tuple[str, str]:
    """The example's filled template (answer prefix included) with `noise_lines` noise lines, and its answer."""
    body = [NOISE] * noise_lines
    for lines in chains_lines:
        where = sorted(int(p) for p in np.random.default_rng(seed).choice(noise_lines, size=len(lines), replace=False))
        for offset, (line, at) in enumerate(zip(lines, where, strict=True)):
            body.insert(at + offset, line.rstrip("\n"))
    value = chains_lines[0][0].split("=")[-1].strip()
    user, prefix = fill("variable_tracking", query=value, num_v=params.num_hops + 1)
    return user.replace("{context}", "\n".join(body)) + prefix, " ".join(chains_vars[0])


def _icl_example(ctx: GenContext, params: VtParams, rng: np.random.Generator) -> str:
    """A solved example as RULER's: 3-letter names, filled to at most 500 tokens, then " " + the answer.

    RULER appends the answer after the prefix's trailing space (so two spaces after "they are:") and a newline.
    """
    chains_vars, chains_lines = draw_chains(params, rng, 3)
    seed = int(rng.integers(2**63))
    need = max(len(lines) for lines in chains_lines)
    lo, hi = need, need  # lo fits (or is the least that can hold the chain); hi grows until it does not fit
    while ctx.encoder.count(_icl_text(params, chains_vars, chains_lines, hi, seed)[0]) <= ICL_TOKENS:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        fits = ctx.encoder.count(_icl_text(params, chains_vars, chains_lines, mid, seed)[0]) <= ICL_TOKENS
        lo, hi = (mid, hi) if fits else (lo, mid)
    text, answer = _icl_text(params, chains_vars, chains_lines, lo, seed)
    return f"{text} {answer}\n"


def generate(
    ctx: GenContext, params: VtParams, *, target_length: int, max_new_tokens: int,
    rng: np.random.Generator, index: int,
) -> Draft:
    # RULER: example + "\n" + task, the example ending in its own newline (a blank line between them).
    example = _icl_example(ctx, params, rng) + "\n" if params.icl_example else ""
    chains_vars, chains_lines = draw_chains(params, rng, params.name_length)
    value = chains_lines[0][0].split("=")[-1].strip()
    user, prefix = fill("variable_tracking", query=value, num_v=params.num_hops + 1)
    frame = ctx.frame(example + user, prefix)
    budget = context_budget(frame, target_length, max_new_tokens)
    stream = ctx.cached(("vt-noise-lines",), lambda: UnitStream(ctx.encoder, (NOISE_LINE,), followed=True))
    line_tokens = sum(len(ctx.encoder.encode_followed(line)) for lines in chains_lines for line in lines)
    placement_seed = int(rng.integers(2**63))
    context = fit_context(
        ctx.encoder, frame, budget,
        lambda b: _context(stream, ctx.encoder, b - line_tokens, chains_lines, placement_seed),
    )
    first = context.text.find(chains_lines[0][0])
    return draft(
        frame, context, list(chains_vars[0]),
        depth=round(100.0 * first / max(1, len(context.text)), 2),
        complexity=f"chains{params.num_chains}-hops{params.num_hops}",
        meta={"value": value, "chains": chains_vars},
    )

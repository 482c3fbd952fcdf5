"""RULER §3.2, Multi-hop tracing: variable tracking (VT).

A variable is initialised with a 5-digit value (`VAR ABCDE = 12345`) and bound along a chain
(`VAR FGHIJ = VAR ABCDE`), the statements scattered in order among repeated noise lines. The model must
return every variable that holds the value. RULER's configuration: 1 chain of 4 hops, 5-letter names,
and one short in-context example before the task.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

from longeval.errors import LengthError
from longeval.tasks.base import Draft, GenContext, context_budget, draft, fit_context
from longeval.tasks.ruler.templates import fill
from longeval.text.corpus import NOISE
from longeval.text.pieces import Piece, UnitStream, concat

SENTENCES_PER_LINE = 5
ICL_NOISE_LINES = 5


@dataclass(frozen=True)
class VtParams:
    num_chains: int = 1
    num_hops: int = 4
    name_length: int = 5
    icl_example: bool = True


def _noise_units() -> tuple[str, ...]:
    """A noise line as five units (the first without a leading space, the last ending the line)."""
    parts = [s + "." for s in NOISE.rstrip(".").split(". ")]
    return tuple([parts[0]] + [" " + p for p in parts[1:-1]] + [" " + parts[-1] + "\n"])


def _chains(params: VtParams, rng: np.random.Generator, name_length: int) -> tuple[list[list[str]], list[list[str]]]:
    """Variable names per chain, and each chain's statements in order."""
    names: list[str] = []
    while len(names) < params.num_chains * (params.num_hops + 1):
        name = "".join(rng.choice(list(string.ascii_uppercase), size=name_length))
        if name not in names:
            names.append(name)
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
    """Sorted line positions for each chain's statements (RULER samples them without replacement)."""
    out = []
    for lines in lines_per_chain:
        if noise_lines + 1 < len(lines):
            raise LengthError(
                f"the context holds {noise_lines} noise lines, too few for a {len(lines)}-statement chain; "
                "use a larger suite.lengths value"
            )
        out.append(sorted(int(p) for p in rng.choice(noise_lines + 1, size=len(lines), replace=False)))
    return out


def _context(stream: UnitStream, encoder, budget: int, chains_lines, rng_state) -> Piece:
    n, tail = stream.fill(budget)
    noise_lines = n // SENTENCES_PER_LINE
    rng = np.random.default_rng(rng_state)
    positions = _place(chains_lines, noise_lines, rng)
    inserts: dict[int, list[str]] = {}
    for lines, where in zip(chains_lines, positions, strict=True):
        for line, at in zip(lines, where, strict=True):
            inserts.setdefault(at, []).append(line)
    parts: list[Piece] = []
    start = 0
    for at in sorted(inserts):
        unit = at * SENTENCES_PER_LINE
        parts.append(stream.slice(start, min(unit, n)))
        parts.extend(Piece(line, encoder.encode_followed(line)) for line in inserts[at])
        start = min(unit, n)
    parts.append(stream.slice(start, n))
    parts.append(tail)
    return concat(parts)


def _icl_example(ctx: GenContext, params: VtParams, rng: np.random.Generator) -> str:
    """A solved example at a small size (3-letter names, as RULER's in-context example)."""
    chains_vars, chains_lines = _chains(params, rng, 3)
    noise = "".join(_noise_units())
    body = [noise] * ICL_NOISE_LINES
    for lines in chains_lines:
        where = sorted(int(p) for p in rng.choice(len(body) + 1, size=len(lines), replace=False))
        for offset, (line, at) in enumerate(zip(lines, where, strict=True)):
            body.insert(at + offset, line)
    value = chains_lines[0][0].split("=")[-1].strip()
    user, prefix = fill("variable_tracking", query=value, num_v=params.num_hops + 1)
    return user.replace("{context}", "".join(body).rstrip("\n")) + prefix + " ".join(chains_vars[0])


def generate(
    ctx: GenContext, params: VtParams, *, target_length: int, max_new_tokens: int,
    rng: np.random.Generator, index: int,
) -> Draft:
    example = _icl_example(ctx, params, rng) + "\n\n" if params.icl_example else ""
    chains_vars, chains_lines = _chains(params, rng, params.name_length)
    value = chains_lines[0][0].split("=")[-1].strip()
    user, prefix = fill("variable_tracking", query=value, num_v=params.num_hops + 1)
    frame = ctx.frame(example + user, prefix)
    budget = context_budget(frame, target_length, max_new_tokens)
    stream = ctx.cached(("vt-noise",), lambda: UnitStream(ctx.encoder, _noise_units()))
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

"""Every registered task's scorer takes time linear in the output, on adversarial 100K-character outputs.

One output that makes a regular expression backtrack stalls the whole score stage, so each task gets a real
instance (generated the way the pipeline does, SmolLM2's tokenizer, its smallest length; tests/task_instances.py)
and is scored on outputs built to provoke backtracking: long runs of spaces after cue words, repeated cues, nested
brackets, long digit runs, newlines, the reference repeated, unicode. Each call must finish well under `BOUND_S`;
a quadratic pattern takes minutes to hours on these inputs.

The bound is on the calling thread's CPU time (`time.thread_time`), not the wall clock: a quadratic scorer burns
CPU however busy the machine is, while a wall-clock bound broke once when other test runs shared the two cores
(0.75 s over the window's bound). A wall-clock deadline still stops a call that never ends.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from longeval.scoring import score_prediction
from longeval.tasks import TASKS
from longeval.tasks.base import GenContext
from tests.task_instances import (  # noqa: F401  (task_ctx, task_encoder: fixtures)
    prediction,
    reference_answer,
    task_ctx,
    task_encoder,
    task_instance,
)

SIZE = 100_000
BOUND_S = 2.0
"""Per scorer call on SIZE characters. Measured after the fixes: the slowest call took 0.07 s (SYNC longest path on
repeated "Answer:"; up to 0.8 s on a machine shared with four other test runs); before them, IDK's calls took
seconds to hours and SYNC's did not finish in 10 s. Quadrupling the size quadruples every call's time."""
WINDOW = 19_000
"""Some parsers scan only the last 20K characters (IDK, Latent List): a trigger must sit inside that window."""
WINDOW_BOUND_S = 0.5
"""Per call on WINDOW characters: linear parsers take milliseconds, a quadratic one over a second."""


def adversarial(reference: str, size: int = SIZE) -> dict[str, str]:
    """Outputs built to trip backtracking regexes and quadratic loops, each about `size` characters."""
    ref = reference or "x"

    def _fill(unit: str, *, head: str = "", tail: str = "") -> str:
        room = max(size - len(head) - len(tail), len(unit))
        return head + unit * (room // max(len(unit), 1)) + tail

    cues = ("Answer", "answer is", "The correct answer is", "Final Answer", "Option", "choice", "Output:",
            "Node", "node #", "Shortest Path", "no", "does not", "final", "[1", "[1,", "\\boxed{", "Answer:")
    outputs = {f"{cue!r}+spaces+?": _fill(" ", head=cue, tail="?") for cue in cues}
    outputs |= {f"({cue!r}+spaces)*": _fill(cue + " " * 997 + "\n") for cue in cues}
    outputs |= {f"{cue!r}*": _fill(cue + " ") for cue in cues}
    outputs |= {
        "spaces between words": _fill(" ", head="x", tail="x"),
        "tabs and spaces": _fill(" \t", head="x", tail="x"),
        "newlines": _fill("\n", head="x", tail="x"),
        "blank lines with spaces": _fill(" \n", head="x", tail="x"),
        "nested parentheses": "(" * (size // 2) + ")" * (size // 2),
        "nested brackets": "[" * (size // 2) + "]" * (size // 2),
        "open parentheses": _fill("(", tail="x"),
        "open brackets": _fill("[", tail="x"),
        "unclosed int list": _fill(" ", head="[1", tail="x"),
        "long int list": _fill("1, ", head="[", tail="x"),
        "int list, spaces": _fill("1 , ", head="[", tail="x"),
        "digits": _fill("7"),
        "digits then word": _fill("7", tail="x"),
        "grouped digits": _fill(",000", head="1", tail="x"),
        "decimals": _fill(".5", head="1", tail="x"),
        "signs": _fill("-+"),
        "punctuation then word": _fill(".", tail="x"),
        "edge punctuation": _fill(" .,:;!?()[]\"'`", head="x", tail="x"),
        "stars": _fill("*", tail="A"),
        "stars and spaces": _fill("* ", head="Answer", tail="?"),
        "quotes": _fill("\"", tail="x"),
        "open quote": _fill("a", head="\u201c", tail="\n"),
        "letters": _fill("A B C D "),
        "parenthesised letters": _fill("(A) "),
        "reference repeated": _fill(ref + " "),
        "reference, no spaces": _fill(ref),
        "unicode letters": _fill("\u00e9\u4e2d\U0001f600"),
        "unicode spaces": _fill("\u2003\u00a0", head="Answer", tail="?"),
        "curly quotes": _fill("\u2019\u201c\u201d"),
        "think tags": _fill("<think>")[: size // 2] + "</think>" + _fill(" ", head="Answer", tail="?")[-size // 2 :],
    }
    return outputs


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Interrupt a runaway call (the regex engine checks for signals) instead of hanging the test run."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("key", sorted(TASKS))
def test_scorer_is_fast_on_adversarial_outputs(task_ctx: GenContext, key: str) -> None:  # noqa: F811
    instance = task_instance(task_ctx, key)
    slow: dict[str, float] = {}
    for size, bound in ((SIZE, BOUND_S), (WINDOW, WINDOW_BOUND_S)):
        for name, output in adversarial(reference_answer(instance), size).items():
            for label, text in ((f"{name} {size}", output), (f"{name} {size} reversed", output[::-1])):
                start = time.thread_time()
                try:
                    with deadline(5 * BOUND_S):
                        score = score_prediction(instance, prediction(instance, text), TASKS[key].judge)
                except TimeoutError:
                    slow[label] = float("inf")
                    continue
                elapsed = time.thread_time() - start
                assert 0.0 <= score.score <= 1.0
                if elapsed > bound:
                    slow[label] = round(elapsed, 2)
    assert not slow, f"{key}: scorer calls over the bound, CPU seconds: {slow}"


def test_adversarial_outputs_are_long() -> None:
    for size in (SIZE, WINDOW):
        outputs = adversarial("1234567", size)
        assert len(outputs) > 40
        assert all(0.9 * size <= len(text) <= 1.1 * size for text in outputs.values())

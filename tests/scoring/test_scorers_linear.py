"""Every registered task's scorer takes time linear in the output, on adversarial 100K-character outputs.

One output that makes a regular expression backtrack stalls the whole score stage, so each task gets a real
instance (generated the way the pipeline does, SmolLM2's tokenizer, a small length) and is scored on outputs
built to provoke backtracking: long runs of spaces after cue words, repeated cues, nested brackets, long digit
runs, newlines, the reference repeated, unicode. Each call must finish well under `BOUND_S`; a quadratic
pattern takes minutes to hours on these inputs.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from longeval.records import Instance, Prediction
from longeval.scoring import score_prediction
from longeval.tasks import TASKS
from longeval.tasks.base import DataPaths, GenContext, context_rng, instance_rng, make_instance, output_budget
from longeval.tasks.tail import TailParams
from longeval.text.render import PromptFormat
from longeval.text.tokenizer import Encoder, load_encoder
from tests.qa_fixtures import hotpotqa_file, squad_file  # noqa: F401
from tests.tasks.longbench_v2.lb2_helpers import make_item, write_json
from tests.tasks.tail.tail_helpers import build_dataset, domain_of

SIZE = 100_000
BOUND_S = 2.0
"""Per scorer call on SIZE characters. Measured after the fixes: the slowest call took 0.07 s (SYNC longest path on
repeated "Answer:"; up to 0.8 s on a machine shared with four other test runs); before them, IDK's calls took
seconds to hours and SYNC's did not finish in 10 s. Quadrupling the size quadruples every call's time."""
WINDOW = 19_000
"""Some parsers scan only the last 20K characters (IDK, Latent List): a trigger must sit inside that window."""
WINDOW_BOUND_S = 0.5
"""Per call on WINDOW characters: linear parsers take milliseconds, a quadratic one over a second."""
SEED = 97
LENGTHS = {"michelangelo/mrcr": 4096, "sync/single_hop_translation": 4096, "sync/multi_hop_translation": 4096,
           "sync/letter_coverage": 4096, "tail/tail": 8192}
DEFAULT_LENGTH = 2048


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


@pytest.fixture(scope="module")
def encoder(smollm2_path: Path) -> Encoder:
    return load_encoder(str(smollm2_path))


@pytest.fixture(scope="module")
def ctx(encoder: Encoder, squad_file: Path, hotpotqa_file: Path,  # noqa: F811
        tmp_path_factory: pytest.TempPathFactory) -> GenContext:
    folder = tmp_path_factory.mktemp("linear")
    longbench = write_json(folder / "longbench_v2.json", [make_item(i) for i in range(4)])
    tail = build_dataset(folder / "tail", [domain_of("finance", 1100), domain_of("law", 1000)], (0.25, 0.5, 0.75))
    data = DataPaths(squad_path=str(squad_file), hotpotqa_path=str(hotpotqa_file), longbench_v2_path=longbench)
    return GenContext(encoder=encoder, fmt=PromptFormat(), data=data,
                      task_overrides={"tail": {"dataset": tail}})


def _instance(ctx: GenContext, key: str) -> Instance:
    """Instance 0 of the task, the way `pipeline.generate_shard` builds it."""
    spec = TASKS[key]
    if key == "tail/tail":
        from longeval.tasks import configure

        spec = configure(spec, ctx.task_overrides)
        assert isinstance(spec.params, TailParams)
    length = LENGTHS.get(key, DEFAULT_LENGTH)
    shared = {"context_rng": context_rng(SEED, spec.context_group, length, 0)} if spec.context_group else {}
    draft = spec.generate(ctx, spec.params, target_length=length, max_new_tokens=output_budget(spec, ctx.fmt, length),
                          rng=instance_rng(SEED, spec.key, length, 0), index=0, **shared)
    return make_instance(spec, draft, ctx, target_length=length, seed=SEED, shard_index=0, index=0)


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


def _prediction(instance: Instance, output: str) -> Prediction:
    return Prediction(instance_id=instance.instance_id, model_id="adversary", output=output,
                      output_tokens=len(output) // 4, finish_reason="length", cached_prompt_tokens=0,
                      latency_s=0.0, error="")


def _reference(instance: Instance) -> str:
    meta = json.loads(instance.meta or "{}")
    return str(meta.get("target") or meta.get("answer") or (instance.references[0] if instance.references else ""))


@pytest.mark.parametrize("key", sorted(TASKS))
def test_scorer_is_fast_on_adversarial_outputs(ctx: GenContext, key: str) -> None:
    instance = _instance(ctx, key)
    slow: dict[str, float] = {}
    for size, bound in ((SIZE, BOUND_S), (WINDOW, WINDOW_BOUND_S)):
        for name, output in adversarial(_reference(instance), size).items():
            for label, text in ((f"{name} {size}", output), (f"{name} {size} reversed", output[::-1])):
                start = time.perf_counter()
                try:
                    with deadline(5 * BOUND_S):
                        score = score_prediction(instance, _prediction(instance, text), TASKS[key].judge)
                except TimeoutError:
                    slow[label] = float("inf")
                    continue
                elapsed = time.perf_counter() - start
                assert 0.0 <= score.score <= 1.0
                if elapsed > bound:
                    slow[label] = round(elapsed, 2)
    assert not slow, f"{key}: scorer calls over the bound, seconds: {slow}"


def test_adversarial_outputs_are_long() -> None:
    for size in (SIZE, WINDOW):
        outputs = adversarial("1234567", size)
        assert len(outputs) > 40
        assert all(0.9 * size <= len(text) <= 1.1 * size for text in outputs.values())

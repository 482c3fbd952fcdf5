"""A test plugin (`plugins=[tests.scoring.slow_judge]`): a task whose judge backtracks exponentially on a run of
spaces, the way a careless regex does on a pathological output."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from longeval.scoring import Judgement
from longeval.tasks import FAMILIES, TASKS, register
from longeval.tasks.family import Family

SLOW_METRIC = "slow_for_tests"
_NESTED = re.compile(r"(\s+)+\?!")  # nested quantifiers: 2^n ways to split n spaces before failing


def slow_judge(output: str, references: Sequence[str], meta: dict[str, Any]) -> Judgement:
    """1 if the output names a reference; stalls for ages on "Answer" + many spaces + "?"."""
    if _NESTED.search(output):
        return Judgement(0.0, output, "")
    return Judgement(float(any(r in output for r in references)), output, "")


SLOW_FAMILY = "slow_for_tests"
if SLOW_FAMILY not in FAMILIES:  # imported by the test and by the scoring child
    _SLOW_TASK = dataclasses.replace(TASKS["ruler/niah_single_1"], family=SLOW_FAMILY, name="slow_niah",
                                     metric=SLOW_METRIC, judge=slow_judge)
    register(Family(name=SLOW_FAMILY, title="slow (tests)", intro="A judge that stalls (tests).", tasks=(_SLOW_TASK,)))

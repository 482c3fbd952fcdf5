"""The `error` column's codec: `ErrorKind` writes what earlier run roots hold and reads all of it."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from longeval.records import PREDICTION_SCHEMA, ErrorKind, Prediction, latest_predictions

WRITTEN_BEFORE = {
    "prompt_too_long: 9000 tokens > max_model_len 8192": ErrorKind.PROMPT_TOO_LONG,
    "prompt_too_long: in the first call of the chain (prompt_too_long: 9000 tokens > max_model_len 8192)":
        ErrorKind.PROMPT_TOO_LONG,
    "engine_error: pool0/r1 failed 2 times: EngineDeadError: dead": ErrorKind.ENGINE_ERROR,
    "engine_error: api HTTP 503 (after 4 attempts)": ErrorKind.ENGINE_ERROR,
    "engine_error: RuntimeError: boom": ErrorKind.ENGINE_ERROR,
    "prompt_too_long": ErrorKind.PROMPT_TOO_LONG,
    "": None,
    "something_else: detail": None,
    "engine_errors: not this kind": None,
}


def test_format_writes_kind_colon_detail():
    assert ErrorKind.ENGINE_ERROR.format("api HTTP 503 (after 4 attempts)") == \
        "engine_error: api HTTP 503 (after 4 attempts)"
    assert ErrorKind.PROMPT_TOO_LONG.format("9000 tokens > max_model_len 8192") == \
        "prompt_too_long: 9000 tokens > max_model_len 8192"
    assert ErrorKind.ENGINE_ERROR == "engine_error" and ErrorKind.PROMPT_TOO_LONG == "prompt_too_long"


@pytest.mark.parametrize(("error", "kind"), list(WRITTEN_BEFORE.items()))
def test_of_reads_the_strings_run_roots_hold(error, kind):
    assert ErrorKind.of(error) is kind


def test_matches_agrees_with_of_over_a_column():
    errors = pa.chunked_array([list(WRITTEN_BEFORE), [None]], pa.string())
    for kind in ErrorKind:
        expected = [ErrorKind.of(e) is kind for e in WRITTEN_BEFORE] + [None]
        assert kind.matches(errors).to_pylist() == expected


@given(st.sampled_from(list(ErrorKind)), st.text())
def test_of_reads_back_what_format_wrote(kind, detail):
    assert ErrorKind.of(kind.format(detail)) is kind
    assert kind.matches(pa.array([kind.format(detail)])).to_pylist() == [True]


def test_latest_predictions_replaces_an_engine_error_by_its_retry_and_keeps_final_ones():
    def row(iid, output, error=""):
        return Prediction(iid, "m", output, 1, "stop", 0, 0.1, error=error).to_row()

    preds = pa.Table.from_pylist([
        row("a", "", ErrorKind.ENGINE_ERROR.format("boom")), row("a", "retried"),
        row("b", "", ErrorKind.PROMPT_TOO_LONG.format("9 tokens > max_model_len 8")), row("b", "later"),
        row("c", "", ErrorKind.ENGINE_ERROR.format("boom")),
    ], schema=PREDICTION_SCHEMA)
    latest = {r["instance_id"]: r["output"] for r in latest_predictions(preds).to_pylist()}
    assert latest == {"a": "retried", "b": "later", "c": ""}


def test_a_lost_replicas_late_row_of_a_prompt_given_away_gives_way_to_the_other_replicas():
    """pool0/r1 was declared lost holding b and c, which went to pool0/r0; its upload of b landed later anyway
    (its link came back). r0's answer is kept whichever part sorts last; a given-away row alone is still kept,
    over an engine error too."""
    def row(iid, output, replica, error=""):
        return {**Prediction(iid, "m", output, 1, "stop", 0, 0.1, error=error).to_row(), "replica": replica}

    away = {("pool0/r1", "b"), ("pool0/r1", "c"), ("pool0/r1", "d")}
    for order in (1, -1):
        rows = [row("b", "r0's", "pool0/r0"), row("b", "late", "pool0/r1")][::order]
        rows += [row("a", "kept", "pool0/r1"), row("c", "alone", "pool0/r1"),
                 row("d", "", "pool0/r0", ErrorKind.ENGINE_ERROR.format("boom")), row("d", "late", "pool0/r1")]
        latest = latest_predictions(pa.Table.from_pylist(rows, schema=PREDICTION_SCHEMA), away)
        assert {r["instance_id"]: r["output"] for r in latest.to_pylist()} == {
            "a": "kept", "b": "r0's", "c": "alone", "d": "late"}

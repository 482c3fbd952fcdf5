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

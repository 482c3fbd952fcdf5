"""`longeval report` and `compare` on s3:// run roots (a real SeaweedFS on loopback)."""

from __future__ import annotations

import pytest

from longeval.report.html import write_report
from longeval.report.runs import load_scores
from longeval.stages.summarise import summarise_root
from longeval.stats.compare import compare_scores
from longeval.store.run_root import RunRoot
from tests.report.report_helpers import build_run


@pytest.mark.s3
def test_report_reads_and_summarises_s3_run_roots(s3_env, tmp_path) -> None:
    a, b = f"s3://{s3_env.bucket}/runs/a", f"s3://{s3_env.bucket}/runs/b"
    build_run(a, "model-a")
    build_run(b, "model-b", summarise=False)
    result = write_report([a, b], tmp_path / "report.html", resamples=200, summarise=summarise_root)
    assert [r.computed for r in result.runs] == [False, True]
    assert RunRoot(b).exists("summary/headline.parquet")  # written back through the store
    # 184: LongBench v2 rows 10 and 11 lie beyond suite.samples=10, outside the plan
    assert result.pairs[0].comparison is not None and result.pairs[0].comparison.matched.n == 184
    html = result.path.read_text()
    assert f"{a}/scores/" in html  # remote folders are named, not linked
    assert len(result.data_files) == 2
    assert compare_scores(load_scores(a), load_scores(b), resamples=200).table.num_rows > 0

"""Human-readable views of aggregated results: the terminal tables (`table`, `adaptive`), the HTML report
(`html`, with its figures from `plots`) and the reading of run roots they share (`runs`).

The names below are the package's public surface; each lives in the module named beside it and is imported
when first used (matplotlib only once a figure is drawn). The figures are `longeval.report.plots`'s own."""

from longeval._lazy import lazy_exports

_EXPORTS = {
    "PairView": "html",
    "ReportResult": "html",
    "RunData": "runs",
    "SUMMARY_NAMES": "runs",
    "build_page": "html",
    "check_run": "runs",
    "effective_length_text": "adaptive",
    "essay_note": "runs",
    "essay_sentence": "runs",
    "format_length": "table",
    "instance_rows": "runs",
    "load_run": "runs",
    "load_scores": "runs",
    "provenance_pairs": "runs",
    "render_adaptive": "adaptive",
    "render_comparison": "table",
    "render_declared": "table",
    "render_errors": "table",
    "render_ladder": "table",
    "render_results": "table",
    "run_versions": "runs",
    "schedule_text": "adaptive",
    "unique_labels": "runs",
    "write_report": "html",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

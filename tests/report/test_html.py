"""The HTML builder: pure functions from summary tables to one self-contained, escaped page."""

from __future__ import annotations

import base64
import dataclasses
import html
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pyarrow as pa

from longeval.report.html import build_page
from longeval.report.runs import RunData, unique_labels
from longeval.report.sections import families
from longeval.report.view import PairView
from longeval.stats.aggregate import headline, length_table, summarise
from longeval.stats.compare import compare_scores

HOSTILE = '<script>alert("x")</script>'


class Page(HTMLParser):
    """What a browser would see: tags, data-key cells, image sources, section ids."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.cells: dict[str, str] = {}
        self._key: str | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs) -> None:
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == "td" and "data-key" in attrs:
            self._key = attrs["data-key"]
            self.cells[self._key] = ""

    def handle_endtag(self, tag) -> None:
        if tag == "td":
            self._key = None

    def handle_data(self, data) -> None:
        if self._key is not None:
            self.cells[self._key] += data

    def all(self, tag: str) -> list[dict]:
        return [attrs for t, attrs in self.tags if t == tag]

    @property
    def ids(self) -> set[str]:
        return {attrs["id"] for _, attrs in self.tags if "id" in attrs}


def ruler_run(label: str, per_length: dict[int, list[float]], *, tasks=("vt", "cwe"), uri: str = "",
              claimed: int | None = 131072) -> tuple[RunData, pa.Table]:
    """A run scored on RULER tasks: `per_length` gives each task's sample scores at that length."""
    rows = [{"instance_id": f"{t}{n}{i}", "model_id": label, "family": "ruler", "task": t, "target_length": n,
             "score": s, "error_type": "" if s else "null"}
            for t in tasks for n, samples in per_length.items() for i, s in enumerate(samples)]
    scores = pa.Table.from_pylist(rows)
    tasks_tbl = summarise(scores)
    lengths = length_table(tasks_tbl)
    return RunData(uri=uri or f"/runs/{label}", label=label, model=label, suite="ruler", claimed_length=claimed,
                   tables={"tasks": tasks_tbl, "lengths": lengths, "headline": headline(lengths)}), scores


def test_leaderboard_shows_rulers_table_3_numbers() -> None:
    a, _ = ruler_run("a", {4096: [1] * 10, 8192: [1] * 9 + [0], 16384: [1] * 5 + [0] * 5})
    b, _ = ruler_run("b", {4096: [1] * 10, 8192: [1] * 8 + [0] * 2, 16384: [1] * 7 + [0] * 3}, claimed=8192)
    page = Page(build_page([a, b]))
    cells = page.cells
    assert (cells["ruler/a/avg"], cells["ruler/a/wavg_inc"], cells["ruler/a/wavg_dec"]) == ("80.00", "71.67", "88.33")
    assert (cells["ruler/b/avg"], cells["ruler/b/wavg_inc"], cells["ruler/b/wavg_dec"]) == ("83.33", "78.33", "88.33")
    assert (cells["ruler/a/effective"], cells["ruler/b/effective"]) == ("8K", "4K")
    assert (cells["ruler/a/claimed"], cells["ruler/b/claimed"]) == ("128K", "8K")
    assert (cells["ruler/a/L4096"], cells["ruler/a/L8192"], cells["ruler/a/L16384"]) == ("100.00", "90.00", "50.00")
    passing = {a["data-key"] for a in page.all("td") if "pass" in a.get("class", "")}
    assert passing == {"ruler/a/L4096", "ruler/a/L8192", "ruler/b/L4096"}  # above 85.6: underlined
    board = [a["data-key"] for a in page.all("td") if a.get("data-key", "").endswith("/avg")]
    assert board == ["ruler/b/avg", "ruler/a/avg"]  # sorted by Avg


def test_no_length_above_the_threshold_reads_below_the_shortest() -> None:
    run, _ = ruler_run("weak", {4096: [0, 1], 8192: [0, 0]})
    assert Page(build_page([run])).cells["ruler/weak/effective"] == "< 4K"


def test_every_text_is_escaped() -> None:
    run, _ = ruler_run(HOSTILE, {4096: [1, 0]}, tasks=(f"<b>{HOSTILE}</b>",), uri=f"/runs/{HOSTILE}")
    html = build_page([run], links={HOSTILE: {"scores/": (HOSTILE, "x%20y/scores/")}},
                      pairs=[PairView(HOSTILE, HOSTILE, error=HOSTILE)])
    assert "<script" not in html and "<b>" not in html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html
    page = Page(html)
    assert not page.all("script")


def test_the_page_needs_no_network() -> None:
    a, scores_a = ruler_run("a", {4096: [1, 1, 0, 1], 8192: [1, 0, 0, 1]})
    b, scores_b = ruler_run("b", {4096: [1, 0, 0, 1], 8192: [0, 0, 0, 1]})
    html = build_page([a, b], pairs=[PairView("a", "b", compare_scores(scores_a, scores_b, resamples=200))])
    page = Page(html)
    assert not page.all("script") and not page.all("iframe")
    assert not [ln for ln in page.all("link") if ln.get("rel") != "icon"]
    external = [v for _, attrs in page.tags for k, v in attrs.items() if k in ("src", "href") and v
                and re.match(r"^(https?:)?//", v)]
    assert external == []
    images = page.all("img")
    assert len(images) >= 3
    for image in images:
        assert image["alt"]
        assert image["src"].startswith("data:image/svg+xml;base64,")
        svg = ET.fromstring(base64.b64decode(image["src"].split(",", 1)[1]))
        assert svg.tag.endswith("svg")


def test_only_sections_with_tables_are_shown() -> None:
    run, _ = ruler_run("a", {4096: [1, 0], 8192: [1, 1]})
    page = Page(build_page([run]))
    assert {"runs", "leaderboard", "ruler"} <= page.ids
    assert not {i for i in page.ids if i.startswith(("sync", "michelangelo", "longbench", "tail", "compar"))}
    nav = [a["href"] for a in page.all("a") if a.get("href", "").startswith("#")]
    assert nav == ["#runs", "#leaderboard", "#ruler"]


def test_comparison_section_shows_the_difference_or_why_there_is_none() -> None:
    a, scores_a = ruler_run("a", {4096: [0] * 20})
    b, scores_b = ruler_run("b", {4096: [1] * 20})
    comparison = compare_scores(scores_a, scores_b, resamples=200)
    page = Page(build_page([a, b, b], pairs=[PairView("a", "b", comparison),
                                             PairView("a", "c", error="no instance in common")]))
    assert page.cells["compare/b/ruler/vt/4096/diff"] == "100.00"
    assert page.cells["compare/b/ruler/overall/all/diff"] == "100.00"
    up = [a for a in page.all("td") if a.get("data-key") == "compare/b/ruler/vt/4096/diff"][0]
    assert "up" in up["class"]
    assert any(a["data-plot"] == "compare-b" for a in page.all("img"))
    assert "Not compared: no instance in common" in build_page([a], pairs=[PairView("a", "c", error="no instance "
                                                                                  "in common")])


def test_families_follow_the_report_order_and_unknown_ones_come_last() -> None:
    run, _ = ruler_run("a", {4096: [1]})
    tasks = run.tables["tasks"]
    extra = pa.concat_tables([tasks, tasks.set_column(1, "family", pa.array(["zeta"] * tasks.num_rows)),
                              tasks.set_column(1, "family", pa.array(["tail"] * tasks.num_rows))])
    assert families([RunData(uri="/x", label="a", model="a", suite="", claimed_length=None,
                             tables={"tasks": extra})]) == ["ruler", "tail", "zeta"]


def test_labels_are_made_unique() -> None:
    runs = [RunData(uri=f"/runs/{name}", label=label, model=label, suite="", claimed_length=None)
            for name, label in (("r1", "m"), ("r2", "m"), ("r2", "m"), ("r3", "n"))]
    assert [r.label for r in unique_labels(runs)] == ["m (r1)", "m (r2) #2", "m (r2) #3", "n"]


def test_the_same_inputs_give_the_same_page() -> None:
    run, _ = ruler_run("a", {4096: [1, 0], 8192: [1, 1]})
    assert build_page([run], generated="2026-01-01") == build_page([run], generated="2026-01-01")


def test_leaderboard_tooltips_give_the_headline_intervals() -> None:
    run, scores = ruler_run("a", {4096: [1] * 10, 8192: [1] * 9 + [0], 16384: [1] * 5 + [0] * 5})
    lengths = length_table(run.tables["tasks"], scores=scores)
    head = headline(lengths, scores=scores)
    with_ci = RunData(uri=run.uri, label="a", model="a", suite="ruler", claimed_length=131072,
                      tables={**run.tables, "lengths": lengths, "headline": head})
    titles = {attrs["data-key"]: attrs.get("title", "") for attrs in Page(build_page([with_ci])).all("td")
              if "data-key" in attrs}
    (row,) = head.to_pylist()
    assert titles["ruler/a/avg"] == f"95% CI {row['avg_ci_low']:.2f}–{row['avg_ci_high']:.2f}"
    assert titles["ruler/a/wavg_inc"].startswith("rank 1 of 1; 95% CI ")
    assert titles["ruler/a/effective"] == "95% CI 4K–8K"
    # Without intervals (summaries written before them, or built without the scores): no tooltip, no error.
    old = {attrs["data-key"]: attrs.get("title", "") for attrs in Page(build_page([run])).all("td")
           if "data-key" in attrs}
    assert old["ruler/a/avg"] == "" and old["ruler/a/effective"] == ""


def test_a_runs_note_reaches_the_page() -> None:
    run, _ = ruler_run("m", {4096: [1.0, 0.0]})
    note = "m: ruler/niah_single_2 ran on the essay haystack 'pydoc_data.topics (not RULER's)' ..."
    page = build_page([dataclasses.replace(run, notes=(note,))])
    assert "ran on the essay haystack" in html.unescape(page)
    assert "ran on the essay haystack" not in html.unescape(build_page([run]))


def test_the_html_table_gives_a_near_threshold_length_the_range_a_full_sweep_could_give() -> None:
    from longeval.report.runs import RunData
    from longeval.report.sections import adaptive_section
    from longeval.run.adaptive_rounds import CELL_SCHEMA, LENGTH_SCHEMA

    cells = pa.Table.from_pylist([{"task": "ruler/vt", "target_length": 4096, "instances": 500, "cap": 500,
                                   "decision": "above", "decided_early": False, "beats_shorter": False,
                                   "near_threshold": True}], schema=CELL_SCHEMA)
    lengths = pa.Table.from_pylist([{"scope": "task", "name": "ruler/vt", "effective_length": 4096,
                                     "effective_length_low": 4096, "effective_length_high": 4096, "decided": True,
                                     "near_threshold": True, "noise_low": None, "noise_high": 4096,
                                     "bound": "cells"}],
                                   schema=LENGTH_SCHEMA)
    run = RunData(uri="r", label="run", model="m", suite="ruler", claimed_length=None,
                  tables={"adaptive": cells, "adaptive_lengths": lengths},
                  adaptive_schedule={"round_start": 10, "growth": 1.0, "round_max": 0, "alpha_split": "equal",
                                     "near_stop": False, "shard_size": 10})
    section = adaptive_section([run])
    assert "run sampled in constant rounds of 10 instances per cell (shards of 10); α split equally" in section.intro
    [table] = [b for b in section.blocks if hasattr(b, "rows")]
    [row] = table.rows
    texts = [c.text for c in row.cells]
    assert any(t.startswith("undecided near the threshold") for t in texts) and "none – 4K" in texts
    assert "cells" in texts  # what decided the row


def test_a_new_family_gets_its_depth_heatmap_and_a_family_without_depths_none(tmp_path) -> None:
    """The example family (tests/example_family) declares no report section: its instances carry depths, so the
    report draws a depth x length heatmap binned from its scores, as docs/adding-a-family.md promises; no family
    name of the report's own code is involved (issue #47)."""
    from longeval.config import validate
    from longeval.report.html import write_report
    from longeval.tasks import FAMILIES, TASKS
    from tests.example_family import FAMILY
    from tests.report.report_helpers import instance, write_run

    cfg = validate({"model": {"name": "model-a", "path": "synthetic", "max_model_len": 16384},
                    "suite": {"name": "synthetic", "tasks": ["kv_retrieval"], "lengths": [4096, 8192], "samples": 10},
                    "plugins": ["tests.example_family.plugin"]})
    try:
        depths = (0.0, 25.0, 50.0, 75.0, 100.0)
        rows = [(instance(FAMILY.name, "kv_retrieval", n, i, depth=depths[i % 5]), float(i % 5 != 2), "")
                for n in (4096, 8192) for i in range(10)]  # the middle depth always wrong: the paper's U-shape
        write_run(tmp_path / "run", cfg, rows)
        page = write_report([str(tmp_path / "run")], tmp_path / "report.html", compare=False).path.read_text()
    finally:
        FAMILIES.pop(FAMILY.name, None)
        for spec in FAMILY.tasks:
            TASKS.pop(spec.key, None)
    section = re.search(r'<section[^>]*id="lost-in-the-middle-depths".*?</section>', page, re.S)
    assert section is not None, "no depth x length heatmap for the example family"
    assert "Lost in the Middle: depth × length" in section.group(0) and "<img" in section.group(0)
    assert 'id="longbench-v2-depths"' not in page


def test_each_familys_leaderboard_names_where_its_threshold_comes_from() -> None:
    """RULER's note cites RULER; another family's says the bar is borrowed; a suite override says so."""
    ruler, _ = ruler_run("a", {4096: [1] * 10})
    sync = dataclasses.replace(ruler, label="b", uri="/runs/b", tables={
        name: table.set_column(table.schema.get_field_index("family"), "family",
                               pa.array(["sync"] * table.num_rows, table.schema.field("family").type))
        for name, table in ruler.tables.items()})

    def note(page: str, family: str) -> str:
        return html.unescape(page.split(f'id="leaderboard-{family}"')[1].split("</table>")[1].split("<table")[0])

    page = build_page([ruler, sync])
    assert "RULER's threshold: Llama-2-7B's mean score at 4K (RULER §4, Table 3)" in note(page, "ruler")
    assert "borrowed: the SYNC paper defines no effective-length threshold" in note(page, "sync")
    lowered = dataclasses.replace(ruler, tables={**ruler.tables, "headline": headline(ruler.tables["lengths"],
                                                                                      threshold=50.0)})
    assert "exceeds 50 " in note(build_page([lowered]), "ruler")
    assert "the run's suite.effective_threshold" in note(build_page([lowered]), "ruler")


"""The HTML report in a real headless Chromium: it loads offline, logs no error, every plot renders, the
screenshot is not blank, and the leaderboard shows the numbers the synthetic runs were built to give."""

from __future__ import annotations

import io
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import pytest

from longeval.report.html import write_report
from longeval.stages.summarise import summarise_root
from tests.report.report_helpers import EXPECTED_HEADLINE

CHROMIUM = Path("/usr/bin/chromium")
PLOTS = {"compare-model-b", "ruler-lengths", "ruler-tasks", "sync-lengths", "sync-tasks", "sync-ladder", "sync-errors",
         "michelangelo-lengths", "michelangelo-tasks", "michelangelo-cumulative", "longbench_v2-tasks",
         "longbench-v2-breakdown", "tail-tasks", "tail-heatmap"}

pytestmark = pytest.mark.skipif(not CHROMIUM.is_file(), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)")


@dataclass
class Rendered:
    path: Path
    screenshot: bytes
    console: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    images: list[dict] = field(default_factory=list)
    plots: dict[str, bytes] = field(default_factory=dict)
    cells: dict[str, str] = field(default_factory=dict)
    title: str = ""
    scripts: int = 0
    csv_links: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def rendered(pristine_roots, tmp_path_factory) -> Rendered:
    """Build the report of both synthetic runs once, open it in Chromium and record what the browser saw."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package (dev extra) is needed")
    base = tmp_path_factory.mktemp("browser")
    roots = []
    for root in pristine_roots:
        shutil.copytree(root, base / "runs" / root.name)
        roots.append(str(base / "runs" / root.name))
    result = write_report(roots, base / "site" / "report.html", resamples=1000, summarise=summarise_root)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            seen = Rendered(path=result.path, screenshot=b"")
            page.on("console", lambda m: seen.console.append((m.type, m.text)))
            page.on("pageerror", lambda e: seen.errors.append(str(e)))
            page.on("request", lambda r: seen.requests.append(r.url))
            page.on("dialog", lambda d: (seen.dialogs.append(d.message), d.dismiss()))
            page.goto(result.path.as_uri(), wait_until="load")
            seen.title = page.title()
            seen.images = page.eval_on_selector_all("img", """els => els.map(e => ({
                plot: e.dataset.plot, complete: e.complete, width: e.naturalWidth, height: e.naturalHeight,
                shown: e.getBoundingClientRect().width}))""")
            for i in range(page.locator("img").count()):
                image = page.locator("img").nth(i)
                image.scroll_into_view_if_needed()
                seen.plots[image.get_attribute("data-plot")] = image.screenshot()
            seen.cells = page.eval_on_selector_all(
                "td[data-key]", "els => Object.fromEntries(els.map(e => [e.dataset.key, e.innerText.trim()]))")
            seen.scripts = page.locator("script").count()
            seen.csv_links = page.eval_on_selector_all("a[href$='.csv']", "els => els.map(e => e.href)")
            seen.screenshot = page.screenshot(full_page=True)
        finally:
            browser.close()
    (base / "report.png").write_bytes(seen.screenshot)  # kept beside the page for a look when a check fails
    return seen


def _colours(png: bytes) -> tuple[int, float]:
    """Distinct colours, and the share of pixels that are not white."""
    import numpy as np
    from PIL import Image

    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.uint32).reshape(-1, 3)
    packed = (rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2]
    return int(np.unique(packed).size), float(np.mean(packed != 0xFFFFFF))


@pytest.mark.browser
def test_the_page_loads_offline_without_errors(rendered) -> None:
    assert rendered.title == "longeval report"
    assert [m for m in rendered.console if m[0] in ("error", "warning")] == []
    assert rendered.errors == []
    assert rendered.dialogs == []  # model outputs with <script> stay text
    assert rendered.scripts == 0
    assert rendered.requests and all(u.startswith(("file://", "data:")) for u in rendered.requests), rendered.requests


@pytest.mark.browser
def test_every_plot_is_present_and_rendered(rendered) -> None:
    assert {i["plot"] for i in rendered.images} == PLOTS
    for image in rendered.images:
        assert image["complete"] and image["width"] > 100 and image["height"] > 100, image
        assert image["shown"] > 100, image
    for name, png in rendered.plots.items():
        distinct, inked = _colours(png)
        assert distinct > 20 and inked > 0.02, f"plot {name} looks blank ({distinct} colours, {inked:.1%} inked)"


@pytest.mark.browser
def test_the_screenshot_is_not_blank(rendered) -> None:
    distinct, inked = _colours(rendered.screenshot)
    assert distinct > 200
    assert inked > 0.05


@pytest.mark.browser
def test_the_leaderboard_shows_the_expected_numbers(rendered) -> None:
    for model, expected in EXPECTED_HEADLINE.items():
        key = f"ruler/{model}"
        assert rendered.cells[f"{key}/avg"] == expected["avg"]
        assert rendered.cells[f"{key}/wavg_inc"] == expected["wavg_inc"]
        assert rendered.cells[f"{key}/wavg_dec"] == expected["wavg_dec"]
        assert rendered.cells[f"{key}/effective"] == expected["effective"]
        assert rendered.cells[f"{key}/claimed"] == "32K"
    assert [rendered.cells[f"ruler/model-a/L{n}"] for n in (4096, 8192, 16384)] == ["100.00", "90.00", "50.00"]
    assert rendered.cells["compare/model-b/ruler/overall/all/diff"] == "3.33"


@pytest.mark.browser
def test_the_per_instance_data_are_linked(rendered) -> None:
    assert len(rendered.csv_links) == 2
    for href in rendered.csv_links:
        assert href.startswith("file://")
        target = Path(unquote(href.removeprefix("file://")))
        assert target.is_file() and target.parent == rendered.path.parent / "report_files"

"""report.html in a real headless Chromium: the timeline is drawn (SVG rectangles laid out, a
screenshot with the op-class colours), the inline script works (zoom, colour by layer), there
are no script errors, and no request leaves the page. Skips, saying why, when Chromium is
missing or does not start."""

from __future__ import annotations

import pytest

from report_browser import Browser, BrowserUnavailable, colour_histogram
from tpuflow.codegen.report import render_report

pytestmark = pytest.mark.browser

VIEWPORT = {"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": False}


@pytest.fixture(scope="module")
def report_file(bert_run, tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "report.html"
    path.write_text(render_report(bert_run[4]), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def loaded(report_file, tmp_path_factory):
    """A browser that has loaded report.html, with Network and Runtime events recorded."""
    try:
        browser = Browser(tmp_path_factory.mktemp("chromium-profile"))
    except BrowserUnavailable as exc:
        pytest.skip(f"browser test skipped: {exc}")
    try:
        for domain in ("Network", "Page", "Runtime", "Log"):
            browser.page(f"{domain}.enable")
        browser.page("Emulation.setDeviceMetricsOverride", VIEWPORT)
        browser.page("Page.navigate", {"url": report_file.as_uri()})
        browser.wait_for("Page.loadEventFired")
        yield browser, report_file
    finally:
        browser.close()


def test_no_request_leaves_the_page(loaded):
    browser, path = loaded
    requests = [e["params"]["request"]["url"] for e in browser.events if e["method"] == "Network.requestWillBeSent"]
    assert requests == [path.as_uri()], f"the page requested {requests}"
    assert not [e for e in browser.events if e["method"] in ("Network.webSocketCreated", "Network.loadingFailed")]


def test_no_script_errors(loaded):
    browser, _ = loaded
    errors = [e for e in browser.events if e["method"] == "Runtime.exceptionThrown"
              or (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]
    assert not errors, errors


def test_timeline_is_drawn(loaded, bert_run):
    browser, _ = loaded
    ctx = bert_run[4]
    layout = browser.evaluate("""(() => {
        const svg = document.querySelector('#timeline svg');
        const box = svg.getBoundingClientRect();
        const bars = [...svg.querySelectorAll('rect:not(.lane)')];
        const drawn = bars.filter(r => { const b = r.getBoundingClientRect(); return b.width > 0 && b.height > 0; });
        return {width: box.width, height: box.height, bars: bars.length, drawn: drawn.length,
                titles: svg.querySelectorAll('rect > title').length,
                top: box.top + window.scrollY, left: box.left};
    })()""")
    assert layout["bars"] == ctx["timeline"].rect_count > 0
    assert layout["drawn"] == layout["bars"] and layout["titles"] == layout["bars"]
    assert layout["width"] > 800 and layout["height"] == ctx["timeline"].height
    png = browser.screenshot({"x": layout["left"], "y": layout["top"], "width": layout["width"],
                              "height": layout["height"]})
    colours = colour_histogram(png)
    total = sum(colours.values())
    background = max(colours.values())
    assert background < 0.9 * total, "the timeline screenshot is (almost) blank"
    for rgb in ((0xe8, 0x88, 0x3a), (0x2c, 0xa5, 0x8d), (0x3d, 0x4a, 0x5c)):   # matmul, dma load, DRAM
        assert colours.get(rgb, 0) > 50, f"colour {rgb} hardly appears in the timeline"


def test_zoom_and_layer_colours_work(loaded):
    browser, _ = loaded
    result = browser.evaluate("""(() => {
        const inner = document.getElementById('tl-inner');
        const before = inner.getBoundingClientRect().width;
        document.querySelector('[data-zoom="4"]').click();
        const after = inner.getBoundingClientRect().width;
        const bars = [...document.querySelectorAll('#timeline svg rect:not(.lane):not(.bw)')];
        const fills = () => bars.map(b => getComputedStyle(b).fill);
        const byClass = fills();
        document.querySelector('[data-colour="layer"]').click();
        const byLayer = fills();
        document.querySelector('[data-zoom="1"]').click();
        document.querySelector('[data-colour="class"]').click();
        const changed = byClass.filter((f, i) => f !== byLayer[i]).length;
        return {before, after, changed, bars: bars.length, restored: JSON.stringify(fills()) === JSON.stringify(byClass),
                classColours: new Set(byClass).size, layerColours: new Set(byLayer).size};
    })()""")
    assert result["after"] == pytest.approx(4 * result["before"], rel=0.01)
    assert result["restored"] and result["changed"] > result["bars"] // 2
    assert result["layerColours"] > result["classColours"] >= 3


def test_missing_chromium_is_reported_not_passed(monkeypatch, tmp_path):
    import report_browser
    monkeypatch.setattr(report_browser, "CHROMIUM_CANDIDATES", ("/nonexistent/chromium",))
    with pytest.raises(BrowserUnavailable, match="no chromium executable.*install Debian's `chromium`"):
        Browser(tmp_path)

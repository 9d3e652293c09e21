"""sweep.html (`tpuflow sweep --html`): one plot per swept key with a line per model, the Pareto front
of latency against peak TOPS, and the table; self-contained, and drawn in headless Chromium (skips,
saying why, when Chromium is missing)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tpuflow import sweep

sys.path.insert(0, str(Path(__file__).parent / "reports"))

SPEC = {"models": ["mlp", "small_cnn"], "dtypes": ["fp16"], "chip": "sg2260",
        "grid": {"clocks.tiu_clock_mhz": [500.0, 1000.0], "ife.decode_cycles": [1, 4]}}


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """(spec, frame with one error row appended, html path) of a real 8-point sweep."""
    from dask.distributed import Client
    spec = sweep.load_spec(SPEC)
    with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as client:
        frame = sweep.run(spec, client=client)
    frame.loc[len(frame)] = {**frame.iloc[0].to_dict(), "point_id": "broken", "status": "error",
                             "error": "timing model: engines wait on each other forever", "latency_us": None}
    path = tmp_path_factory.mktemp("sweep") / "sweep.html"
    path.write_text(sweep.render_html(frame, spec, compiles=frame.attrs.get("compiles")), encoding="utf-8")
    return spec, frame, path


def test_page_has_a_plot_per_key_the_pareto_front_and_every_row(page):
    spec, frame, path = page
    html = path.read_text()
    assert html.count('<svg id="plot-') == len(spec.grid) == 2
    assert html.count('<svg id="pareto-plot"') == 1
    assert html.count("<polyline") == 3 * len(spec.models)          # a line per model in every plot
    assert len(re.findall(r"<tr(?: class=\"error\")?><td>", html)) == len(frame)
    assert html.count('class="error"') == 1
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), "the page must not fetch anything"


def test_pareto_table_is_the_front_of_each_model(page):
    spec, frame, path = page
    html = path.read_text()
    ok = frame[frame["status"] == "ok"]
    for model in spec.models:
        rows = ok[ok["model"] == model]
        front = sweep.pareto_front(list(zip(rows["peak_tops"], rows["latency_us"])))
        assert 1 <= len(front) < len(rows)       # clock 1000 MHz is faster and has more peak: both on the front
        for tops, latency in front:
            assert f"<td class=\"text\">{model}</td><td>{tops:.4g}</td><td>{latency:.4g}</td>" in html


@pytest.mark.browser
def test_page_is_drawn_in_chromium_without_requests_or_errors(page, tmp_path):
    from report_browser import Browser, BrowserUnavailable, colour_histogram
    _, frame, path = page
    try:
        browser = Browser(tmp_path / "profile")
    except BrowserUnavailable as exc:
        pytest.skip(f"browser test skipped: {exc}")
    try:
        for domain in ("Network", "Page", "Runtime", "Log"):
            browser.page(f"{domain}.enable")
        browser.page("Emulation.setDeviceMetricsOverride", {"width": 1400, "height": 1000, "deviceScaleFactor": 1,
                                                            "mobile": False})
        browser.page("Page.navigate", {"url": path.as_uri()})
        browser.wait_for("Page.loadEventFired")
        layout = browser.evaluate("""(() => {
            const plots = [...document.querySelectorAll('svg.plot')].map(svg => {
                const box = svg.getBoundingClientRect();
                const lines = [...svg.querySelectorAll('polyline')].map(l => l.getBBox().width);
                return {w: box.width, h: box.height, lines, dots: svg.querySelectorAll('circle').length,
                        top: box.top + window.scrollY, left: box.left};
            });
            return {plots, rows: document.querySelectorAll('#points tr').length - 1};
        })()""")
        requests = [e["params"]["request"]["url"] for e in browser.events if e["method"] == "Network.requestWillBeSent"]
        errors = [e for e in browser.events if e["method"] == "Runtime.exceptionThrown"
                  or (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]
        first = layout["plots"][0]
        png = browser.screenshot({"x": first["left"], "y": first["top"], "width": first["w"], "height": first["h"]})
    finally:
        browser.close()
    assert requests == [path.as_uri()] and not errors
    assert len(layout["plots"]) == 3 and layout["rows"] == len(frame)
    for plot in layout["plots"]:
        assert plot["w"] > 400 and plot["h"] > 200 and plot["dots"] == 8
        assert len(plot["lines"]) == 2
    assert all(width > 100 for width in layout["plots"][0]["lines"])   # key lines span the clock axis
    colours = colour_histogram(png)
    for rgb in ((0x1f, 0x77, 0xb4), (0xd6, 0x27, 0x28)):                   # the two models' colours
        assert colours.get(rgb, 0) > 30, f"colour {rgb} hardly appears in the plot"


def test_a_key_with_text_values_is_plotted_by_position():
    spec = sweep.load_spec({**SPEC, "grid": {"wdc.shared_region": [False, True], "core.description": ["a", "b"]}})
    rows = [{"model": m, "dtype": "fp16", "cores": 1, "wdc.shared_region": r, "core.description": d,
             "latency_us": 1.0 + r + 2 * (d == "b"), "peak_tops": 16.0, "status": "ok"}
            for m in spec.models for r in (False, True) for d in ("a", "b")]
    frame = sweep.to_frame(rows, spec)
    plot = sweep.key_plot(frame, "core.description", spec)
    assert [label for _, label in plot["ticks"]["x"]] == ["a", "b"]
    assert all(len(s["line"].split()) == 2 and len(s["dots"]) == 4 for s in plot["series"])
    assert "<svg" in sweep.render_html(frame, spec)

"""The report reads one way only: a layer's span is a span (no share that sums past 100%), the two
bounds are named apart, stall totals say they are summed over instructions, a user chip is itself."""

from __future__ import annotations

import html as html_lib
import re

import pytest

from tpuflow.codegen.report import render_report


def headers(html: str) -> list[str]:
    table = html.split('id="layer-table"', 1)[1].split("</thead>", 1)[0]
    return re.findall(r"<th[^>]*>([^<]*)</th>", table)


def test_layer_table_has_spans_not_shares(bert_run):
    program, sim, report, runs, ctx = bert_run
    html = render_report(ctx)
    cols = headers(html)
    assert "share" not in cols and "time us" in cols and "span us" in cols
    spans = sum(r["end_us"] - r["start_us"] for r in report["layers"])
    assert spans > report["latency_us"]        # why a span share would mislead: the spans overlap
    for row in ctx["layers"]:
        assert 0 <= row["time_of_longest"] <= 1
    assert max(row["time_of_longest"] for row in ctx["layers"]) == pytest.approx(1.0)


def test_report_names_the_model_bound_and_the_program_bound(bert_run):
    program, sim, report, runs, ctx = bert_run
    text = html_lib.unescape(re.sub(r"<[^>]+>", " ", render_report(ctx)))
    text = " ".join(text.split())
    assert report["model_bound_us"] and "Model bound" in text and "Program bound" in text
    assert f"{report['model_bound_us']:,.1f} us" in text and "tpuflow inspect prints its lower bound" in text
    assert "Lower bound" not in text
    assert "Summed over instructions" in text and "can exceed the latency" in text


def test_report_header_shows_the_chip_description(bert_run):
    program, sim, report, runs, ctx = bert_run
    assert f"chip {report['chip']}: {report['chip_description']}" in html_lib.unescape(render_report(ctx))

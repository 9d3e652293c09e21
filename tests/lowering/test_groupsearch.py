"""The layer-group search: its dynamic programme picks the same total saving as brute force over
every set of non-overlapping spans, on random runs and on the spans the planner offers for a real
sliced chain (costed on the timing model)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.lowering.groupsearch import SpanOption, best_selection, selection_saving

sys.path.insert(0, str(Path(__file__).parent))
from sliced_chain import pointwise_chain, small_lmem_chip  # noqa: E402


def brute_force(options: list[SpanOption]) -> int:
    best = 0
    for r in range(1, len(options) + 1):
        for subset in itertools.combinations(options, r):
            try:
                best = max(best, selection_saving(subset))
            except ValueError:          # overlapping spans
                continue
    return best


@st.composite
def runs(draw):
    length = draw(st.integers(1, 10))
    options = []
    for _ in range(draw(st.integers(0, 9))):
        lo = draw(st.integers(0, length - 1))
        hi = draw(st.integers(lo, length - 1))
        options.append(SpanOption(lo, hi, draw(st.integers(-50, 100))))
    return length, options


@settings(max_examples=300, deadline=None)
@given(runs())
def test_the_search_finds_the_brute_force_optimum(run):
    length, options = run
    total, chosen = best_selection(length, options)
    assert total == brute_force(options)
    assert selection_saving(chosen) == total            # the chosen spans do not overlap and add up
    assert all(o in options for o in chosen)


def test_a_span_that_saves_nothing_is_not_taken():
    assert best_selection(3, [SpanOption(0, 2, 0), SpanOption(1, 1, -5)]) == (0, [])


def test_two_small_spans_beat_one_wide_span_when_they_save_more():
    wide, left, right = SpanOption(0, 3, 10), SpanOption(0, 1, 6), SpanOption(2, 3, 6)
    assert best_selection(4, [wide, left, right]) == (12, [left, right])
    assert best_selection(4, [wide, left]) == (10, [wide])


def test_an_option_outside_the_run_is_an_error():
    with pytest.raises(ValueError):
        best_selection(2, [SpanOption(1, 2, 1)])


def test_the_planner_takes_the_best_spans_it_was_offered_on_a_real_chain(monkeypatch, tmp_path):
    """A conv chain too large for a small-LMEM chip: the planner's own offered spans, costed on the
    timing model, are chosen as brute force would, and the program verifies."""
    import tpuflow.lowering.residency as residency
    from tpuflow.options import CompileOptions
    from tpuflow.pipeline import compile_model, verify
    chip = small_lmem_chip(tmp_path)
    model = pointwise_chain()
    offered: list = []

    def recording(length, options):
        result = best_selection(length, options)
        offered.append((options, result))
        return result

    monkeypatch.setattr(residency, "best_selection", recording)
    fp16 = CompileOptions(dtype="fp16")
    _, program = compile_model(model, chip, fp16)
    assert offered and any(options for options, _ in offered)
    for options, (total, chosen) in offered:
        assert len(options) <= 12 and total == brute_force(options)
    chosen_runs = [(tuple(o.payload.members), o.payload.slices) for _, (_, ch) in offered for o in ch]
    planned = [r for lg in program.layer_groups for r in lg["sliced_runs"]]
    assert planned and len(planned) == len(chosen_runs)
    assert verify(model, chip, fp16, race_check=True)["ok"]

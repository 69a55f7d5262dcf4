"""Markdown tables of the studies (tabulate's pipe format), read back cell by cell against the results
they were made from: the collectives sweep's summary (plots.bench.markdown) and the model-parallel
study's grid table, on the committed reference results."""
import json
import os

import pytest

from plots.tables.study_tables import model_parallel_table as table
from plots.bench import markdown
from tests.mpirun import ROOT

REFERENCE = os.path.join(ROOT, "plots", "reference")


def _cells(text, first_header):
    """Return the header and the data rows of the pipe table whose first header cell is ``first_header``."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|") and ln.split("|")[1].strip() == first_header)
    rows = []
    for ln in lines[start:]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in ln.strip().strip("|").split("|")])
    assert set(rows[1][0]) <= set(":-"), rows[1]  # the alignment row
    return rows[0], rows[2:]


def _load(name):
    with open(os.path.join(REFERENCE, name), encoding="utf-8") as f:
        return json.load(f)


def test_model_parallel_table_holds_the_results():
    results = _load("model_parallel/p4.json")
    head, rows = _cells(table(results), "grid D x T x Q")
    assert len(head) == 7 and len(rows) == len(results["grids"])
    for row, g in zip(rows, results["grids"]):
        r, b = g["step_ratio_to_dp"], g["bytes_per_rank_per_step"]
        assert row[0] == f"{g['D']} x {g['T']} x {g['Q']}"
        assert row[1] == f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})"
        assert [float(v) for v in row[2:5]] == pytest.approx([b[k] / 1e6 for k in ("data", "tensor", "pipeline")],
                                                             abs=0.006)
        assert float(row[5]) == pytest.approx(g["max_state_bytes"] / 1e6, abs=0.06)
        assert float(row[6]) == pytest.approx(g["bubble"]["median"], abs=0.006)


@pytest.mark.parametrize("name", ["bench_p2.json", "bench_p4.json"])
def test_bench_summary_table_holds_the_stored_summary(name):
    results = _load(name)
    text = markdown(results)
    head, rows = _cells(text, "size")
    sizes = results["summary"]["sizes"]
    assert head[:3] == ["size", "best all-reduce", "its busbw / mpi"] and len(rows) == len(sizes)
    for row, e in zip(rows, sizes):
        assert row[1] == e.get("allreduce_best", "-")
        ratio = e.get("allreduce_best_vs_mpi")
        assert row[2] == ("-" if ratio is None else f"{ratio:.2f}")
        auto = e.get("auto_vs_mpi")
        assert row[head.index("auto / mpi")] == ("-" if auto is None else f"{auto:.2f}")
    if results.get("summary_repeats"):
        _, reps = _cells(text, "figure")
        assert reps
        for label, median, span in reps:
            lo, hi = (float(v) for v in span.rstrip("x").split("-"))
            assert lo <= float(median.rstrip("x")) <= hi, (label, median, span)
    assert "-x" not in text  # a figure not measured reads "-", not "-x"

"""Markdown tables of the studies (tabulate's pipe format), made from their result files: printed by
the studies themselves and published by :mod:`plots.publish`: the benchmarks' (the trainer against
PyTorch, the all-reduce's per-step breakdown) and the model-parallel study's.

Examples
--------
>>> from plots.tables.study_tables import spread
>>> spread({"median": 0.5, "min": 0.25, "max": 1.0}, "x")
'0.50x (0.25-1.00)'
"""
from tabulate import tabulate

__all__ = ["spread", "trainer_table", "model_parallel_table", "bubble_table", "breakdown_table"]


def spread(s, unit="", digits=2, scale=1.0):
    """Return ``median (min-max)`` of a summary dict with ``median``, ``min`` and ``max`` (times ``scale``)."""
    return (f"{scale * s['median']:.{digits}f}{unit} ({scale * s['min']:.{digits}f}-"
            f"{scale * s['max']:.{digits}f})")


def trainer_table(cells):
    """Return the trainer-against-PyTorch grid of ``experiments.bench.trainer_vs_torch`` as Markdown.

    One row per (batch, optimizer) cell: step times in ms and the ratios commlab / PyTorch of wall and
    CPU time, each as median (min-max) over the repeats; a wall ratio whose repeats spread by more than
    the benchmark's flag is marked with its spread.
    """
    head = ["batch", "optimizer", "commlab ms/step", "PyTorch ms/step", "commlab / PyTorch (wall)",
            "commlab / PyTorch (CPU)"]
    rows = []
    for c in cells:
        row = [c["batch"], c["optimizer"], spread(c["numpy_step_s"], scale=1e3)]
        if "ratio" in c:
            flag = " (spread {:.0%})".format(c["spread"]) if c["unstable"] else ""
            row += [spread(c["torch_step_s"], scale=1e3), spread(c["ratio"], "x", 3) + flag,
                    spread(c["cpu_ratio"], "x", 3)]
        else:
            row += ["-", "-", "-"]
        rows.append(row)
    return tabulate(rows, head, tablefmt="pipe", disable_numparse=True,
                    colalign=("right", "left", "right", "right", "right", "right"))


def model_parallel_table(results):
    """Return the grid part of an ``experiments.studies.model_parallel_study`` result as Markdown."""
    cells = []
    for g in results["grids"]:
        r, b = g["step_ratio_to_dp"], g["bytes_per_rank_per_step"]
        cells.append([f"{g['D']} x {g['T']} x {g['Q']}", f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})",
                      f"{b['data'] / 1e6:.2f}", f"{b['tensor'] / 1e6:.2f}", f"{b['pipeline'] / 1e6:.2f}",
                      f"{g['max_state_bytes'] / 1e6:.1f}", f"{g['bubble']['median']:.2f}"])
    head = ("grid D x T x Q", "step time / data-parallel (median, range)", "data MB", "tensor MB", "pipeline MB",
            "params + Adam MB per rank", "bubble")
    return tabulate(cells, headers=head, tablefmt="pipe", disable_numparse=True, colalign=["left"] + ["right"] * 6)


def bubble_table(results):
    """Return the pipeline part of an ``experiments.studies.model_parallel_study`` result as Markdown:
    per schedule and micro-batch count M, GPipe's bubble formula (Q-1)/(M+Q-1), the measured bubble and
    the step time, median (min-max) over the rounds."""
    cells = [[b["schedule"], b["micro_batches"], f"{b['formula']:.2f}", spread(b["bubble"]),
              spread(b["step_s"], digits=1, scale=1e3)] for b in results["bubble"]]
    head = ("schedule", "M", "formula (Q-1)/(M+Q-1)", "measured bubble", "step ms")
    return tabulate(cells, headers=head, tablefmt="pipe", disable_numparse=True,
                    colalign=("left", "right", "right", "right", "right"))


#: The rows of :func:`breakdown_table` per collective, in order: (row of the results file, label); rows
#: a file does not hold are left out.
_BREAKDOWN_ROWS = {
    "allreduce": (
        ("MPI_Allreduce", "`MPI_Allreduce`"), ("MPI_Iallreduce+Wait", "`MPI_Iallreduce` + `MPI_Wait`"),
        ("MPI_Allreduce_init", "`MPI_Allreduce_init`: `MPI_Start` + `MPI_Wait`"),
        ("persistent plan", "commlab persistent plan (`allreduce_init`)"),
        ("auto", "commlab `allreduce` (repeated)"), ("look-up", "step: signature look-up"),
        ("plan.run", "part: `plan.run(x, None)`, the call less entry and look-up"),
        ("copy in", "step: copy into the send buffer"), ("library call", "step: `MPI_Iallreduce` + `MPI_Wait`"),
        ("check", "step: check elements compared"), ("copy out", "step: copy out"),
        ("statistics", "step: sequence number and statistics"),
        ("public entry", "derived: `allreduce`'s frame and tests (call less look-up, `plan.run`)"),
        ("in the plan", "derived: `plan.run`'s frame, flags, `try` (less its steps)")),
    "reduce_scatter": (
        ("MPI_Reduce_scatter", "`MPI_Reduce_scatter`"),
        ("MPI_Ireduce_scatter_block+Wait", "`MPI_Ireduce_scatter_block` + `MPI_Wait`"),
        ("MPI_Iallreduce 16 B+Wait", "fingerprint alone: 16-byte `MPI_Iallreduce` + `MPI_Wait`"),
        ("both library calls", "both library calls posted together, `MPI_Waitall` (the floor)"),
        ("auto", "commlab `reduce_scatter(x, out=...)` (repeated)"), ("look-up", "step: signature look-up"),
        ("fast form", "part: the plan's one-frame form (`plan.fast`), the call less entry and look-up"),
        ("check", "step: fingerprint compared"), ("statistics", "step: sequence number, fingerprint, statistics"),
        ("public entry", "derived: `reduce_scatter`'s frame and tests (call less look-up, `plan.fast`)"),
        ("in the fast form", "derived: its frame, buffer tests, list, `try` (less its steps)"))}
#: Rows after the collective's own, for every collective.
_BREAKDOWN_TAIL = (("rest", "derived: the rest (the call less every timed step)"),
                   ("loop", "calibration: the timing loop's empty call"),
                   ("keyword-only call", "calibration: an empty function of the same signature"),
                   ("call and its tests", "calibration: the same with the call's first tests"))


def breakdown_table(record):
    """Return the per-step table and the ratios of ``experiments.bench.breakdown`` as Markdown.

    Microseconds per call, median (min-max) over the passes, one column per message size; a derived
    row (a part of the call no row times alone) leaves out the passes the record lists for it under
    ``dropped``, which a line under the table names, and shows ``-`` where none is left. The ratios are geometric means over the sizes,
    median (min-max) over the passes.
    """
    sizes, op = list(record["sizes"]), record.get("collective", "allreduce")
    held = record["sizes"][sizes[0]]
    rows = [(row, label) for row, label in _BREAKDOWN_ROWS[op] + _BREAKDOWN_TAIL if row in held]
    if "statistics" not in held:  # (a file without the statistics step: its rest holds them)
        rows = [(row, "the rest (Python frames, statistics)" if row == "rest" else label) for row, label in rows]
    cells = [[label] + [f"{record['sizes'][n][row][0]:.2f} ({record['sizes'][n][row][1]:.2f}-"
                        f"{record['sizes'][n][row][2]:.2f})" if row in record["sizes"][n] else "-" for n in sizes]
             for row, label in rows]
    table = tabulate(cells, headers=["us per call"] + [f"{n} B" for n in sizes], tablefmt="pipe",
                     disable_numparse=True, colalign=["left"] + ["right"] * len(sizes))
    dropped = [f"{row} at {n} B: {', '.join(str(i + 1) for i in d)}" for n, rows in record.get("dropped", {}).items()
               for row, d in rows.items()]
    if dropped:
        table += ("\n\nA derived row leaves out the passes in which its timed parts took longer than the whole "
                  f"(one of their loops was disturbed), numbered from 1: {'; '.join(dropped)}.")
    ratios = tabulate([[k, f"{m:.2f}x ({lo:.2f}-{hi:.2f})"] for k, (m, lo, hi) in record["ratios"].items()],
                      headers=["ratio, geometric mean over the sizes", "median (min-max)"], tablefmt="pipe",
                      disable_numparse=True, colalign=("left", "right"))
    return table + "\n\n" + ratios

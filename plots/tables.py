"""Markdown tables of the studies (tabulate's pipe format), made from their result files: printed by
the studies themselves and published by :mod:`plots.publish`.

Examples
--------
>>> from plots.tables import spread
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
    """Return the trainer-against-PyTorch grid of ``experiments.bench.trainer`` as Markdown.

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


#: The rows of :func:`breakdown_table`, in order: (row of the results file, label).
_BREAKDOWN_ROWS = (("MPI_Allreduce", "`MPI_Allreduce`"), ("MPI_Iallreduce+Wait", "`MPI_Iallreduce` + `MPI_Wait`"),
                   ("MPI_Allreduce_init", "`MPI_Allreduce_init`: `MPI_Start` + `MPI_Wait`"),
                   ("persistent plan", "commlab persistent plan (`allreduce_init`)"),
                   ("auto", "commlab `allreduce` (repeated)"), ("look-up", "step: signature look-up"),
                   ("copy in", "step: copy into the send buffer"), ("library call", "step: `MPI_Iallreduce` + `MPI_Wait`"),
                   ("check", "step: check elements compared"), ("copy out", "step: copy out"),
                   ("rest", "the rest (Python frames, statistics)"))


def breakdown_table(record):
    """Return the per-step table and the target ratios of ``experiments.bench.breakdown`` as Markdown.

    Microseconds per call, median (min-max) over the passes, one column per message size; the ratios
    are geometric means over the sizes, median (min-max) over the passes.
    """
    sizes = list(record["sizes"])
    cells = [[label] + [f"{record['sizes'][n][row][0]:.2f} ({record['sizes'][n][row][1]:.2f}-"
                        f"{record['sizes'][n][row][2]:.2f})" for n in sizes] for row, label in _BREAKDOWN_ROWS]
    table = tabulate(cells, headers=["us per call"] + [f"{n} B" for n in sizes], tablefmt="pipe",
                     disable_numparse=True, colalign=["left"] + ["right"] * len(sizes))
    ratios = tabulate([[k, f"{m:.2f}x ({lo:.2f}-{hi:.2f})"] for k, (m, lo, hi) in record["ratios"].items()],
                      headers=["ratio, geometric mean over the sizes", "median (min-max)"], tablefmt="pipe",
                      disable_numparse=True, colalign=("left", "right"))
    return table + "\n\n" + ratios

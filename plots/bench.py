"""Draw a collectives sweep and print its summary against MPI's own collectives.

    python -m plots.bench results/bench.json [results/bench_p2.json ...] [--out DIR] [--markdown]

For every op in a results file (``experiments.bench.collectives``), one PNG ``bench_OP_pP.png``
(:mod:`plots.bench_figure`): a row of three panels per family of algorithms -- latency against size,
busbw against size, and each algorithm's time divided by ``mpi``'s -- with the passes' spread as
bands. For all-reduce the alpha-beta-gamma model of :mod:`collectives.model.cost`, fitted to the file's
own rows from ``--model-min-bytes``, is drawn dashed over the sizes it was fitted to.
``--markdown`` prints each file's ratio summary as a Markdown table: the summary the sweep computed
and stored (:func:`experiments.bench.output.summarize`); this module draws and prints, it computes no
figure of its own.
"""
import json
import os

from tabulate import tabulate

from commlab.byte_sizes import format_bytes
from training.settings.options import INT32_MAX, Parser, infile, integer, outpath

__all__ = ["markdown", "draw", "main", "row_seconds", "check_stat"]

_KIB, _MIB = 1 << 10, 1 << 20
_COLORS = {"mpi": "black", "ring": "tab:blue", "tree": "tab:green", "recursive_doubling": "tab:orange",
           "rabenseifner": "tab:purple", "2d": "tab:brown", "auto": "tab:red", "ring-direct": "tab:cyan",
           "ring-execute": "tab:olive", "gloo": "tab:pink", "MPI_Allreduce": "0.55", "MPI_Reduce_scatter": "0.55",
           "MPI_Allgather": "0.55", "MPI_Bcast": "0.55", "MPI_Allreduce_init": "0.75", "persistent": "tab:gray",
           "auto-timeout": "salmon", "limit": "0.3"}


def row_seconds(row, stat):
    """Return the row's time in seconds: the slowest rank's mean (``stat="mean"``) or median."""
    return row["time_s"] if stat == "mean" else row["time_median_us"] * 1e-6


def check_stat(rows, stat):
    """Raise ``ValueError`` unless ``stat`` is "mean" or "median" and the rows hold that time."""
    if stat not in ("mean", "median"):
        raise ValueError(f"stat={stat!r} must be 'mean' or 'median'")
    if stat == "median" and any("time_median_us" not in r for r in rows):
        raise ValueError("these results have no median times (an older sweep): use the mean")


def _size(n):
    return format_bytes(n)


def _x(v, fmt="{:.2f}"):
    return fmt.format(v) if v is not None else "-"


def _r(v):
    """A ratio as ``1.23x``, or ``-`` when it was not measured."""
    return _x(v, "{:.2f}x")


def _span(sizes, key, lo, hi):
    """Return the measured sizes of ``key`` within [lo, hi] bytes as ``A-B``, or None when there is none."""
    got = [e["bytes"] for e in sizes if key in e and lo <= e["bytes"] <= hi]
    return f"{_size(min(got))}-{_size(max(got))}" if got else None


def _table(cells, headers, numbers_from):
    """Return a Markdown (pipe) table of text ``cells``: columns from ``numbers_from`` on right-aligned."""
    align = ["left"] * numbers_from + ["right"] * (len(headers) - numbers_from)
    return tabulate(cells, headers=headers, tablefmt="pipe", disable_numparse=True, colalign=align)


def markdown(results, stat="mean"):
    """Return the summary of one results file as Markdown: a headline paragraph and a table per size.

    Parameters
    ----------
    results : dict
        As written by ``experiments.bench.collectives`` (``P``, ``mpi_library``, ``config`` and the
        stored ``summary``, ``summary_median`` and ``summary_repeats``).
    stat : {"mean", "median"}
        Which stored summary: the one of the slowest rank's mean times, or of the medians.

    Raises
    ------
    ValueError
        When the file holds no summary of that kind (written before summaries were stored).
    """
    s = results.get("summary" if stat == "mean" else "summary_median")
    if s is None:
        raise ValueError(f"no stored {stat} summary (an older sweep): run experiments.bench.collectives again")
    a = s["aggregates"]
    big, small = (_span(s["sizes"], "allreduce_best_vs_mpi", 64 * _KIB, 64 * _MIB),
                  _span(s["sizes"], "auto_vs_mpi", 8, 4 * _KIB))
    head = (f"**P = {results['P']}**, {results['config']['dtype']}, {results['mpi_library']}, {stat} times. "
            + (f"Best hand-made all-reduce busbw / `mpi` busbw: geometric mean over {big} "
               f"**{_r(a['allreduce_best_vs_mpi_geomean_64K_64M'])}**, "
               f"lowest {_r(a['allreduce_best_vs_mpi_min_64K_64M'])}. " if big else
               "Best hand-made all-reduce busbw / `mpi` busbw: no size of 64 KiB-64 MiB measured. ")
            + f"Time / `mpi` (max, geometric mean over sizes): reduce-scatter {_r(a['reduce_scatter_vs_mpi_max'])}, "
            f"{_r(a['reduce_scatter_vs_mpi_geomean'])}; all-gather {_r(a['allgather_vs_mpi_max'])}, "
            f"{_r(a['allgather_vs_mpi_geomean'])}; `auto` at {small or '8 B-4 KiB (none measured)'} "
            f"{_r(a['auto_vs_mpi_max_8_4K'])}, "
            f"{_r(a['auto_vs_mpi_geomean_8_4K'])}. Against MPI's own call made directly (geometric means): "
            f"reduce-scatter {_r(a['reduce_scatter_vs_raw_geomean'])}, "
            f"all-gather {_r(a['allgather_vs_raw_geomean'])}, "
            f"commlab's `mpi` all-reduce {_r(a['mpi_vs_raw_geomean'])}. Executor: `ring` / `ring-direct` "
            f"{_r(a['ring_vs_direct_geomean'])}, `ring-execute` / `ring-direct` "
            f"{_r(a['execute_vs_direct_geomean'])}.")
    keys = ("reduce_scatter_vs_mpi", "reduce_scatter_vs_raw", "allgather_vs_mpi", "allgather_vs_raw", "auto_vs_mpi",
            "ring_vs_direct", "execute_vs_direct")
    cells = [[_size(e["bytes"]), e.get("allreduce_best", "-"), _x(e.get("allreduce_best_vs_mpi"))]
             + [_x(e.get(k)) for k in keys] for e in s["sizes"]]
    lines = [head, "", _table(cells, ("size", "best all-reduce", "its busbw / mpi", "reduce-scatter / mpi",
                                      "reduce-scatter / MPI_Reduce_scatter", "all-gather / mpi",
                                      "all-gather / MPI_Allgather", "auto / mpi", "ring / ring-direct",
                                      "ring-execute / ring-direct"), numbers_from=2)]
    reps = results.get("summary_repeats")
    if reps:
        spans = {"big": big or "64 KiB-64 MiB (none measured)", "small": small or "8 B-4 KiB (none measured)",
                 "all": _span(s["sizes"], "bytes", 0, float("inf")) or "no size"}
        cells, shown = [], set()
        for key, label in _TARGETS:  # a figure over all sizes that are the 8 B-4 KiB ones is shown once
            text = label.format(**spans)
            if key in reps and text not in shown:
                shown.add(text)
                cells.append([text, f"{reps[key]['median']:.2f}x", f"{reps[key]['min']:.2f}-{reps[key]['max']:.2f}x"])
        lines += ["", f"Median [min-max] over {max(v['passes'] for v in reps.values())} passes of the sweep:", "",
                  _table(cells, ("figure", "median", "range"), numbers_from=1)]
    return "\n".join(lines)


def small_calls_table(results):
    """Return the repeated small calls' ratios of a sweep of 8 B-4 KiB as Markdown: commlab's ``auto``
    reduce-scatter, all-gather and all-reduce and its persistent plan against MPI's calls made
    directly, median [min-max] over the passes (the rows a sweep with ``--max-bytes 4096`` holds)."""
    reps, s = results["summary_repeats"], results["summary_median"]
    small = _span(s["sizes"], "bytes", 8, 4 * _KIB) or "no size"
    keys = ("auto_vs_iraw_geomean_8_4K", "iraw_vs_raw_geomean_8_4K", "persistent_vs_raw_geomean_8_4K",
            "mpi_init_vs_raw_geomean_8_4K", "reduce_scatter_auto_vs_iraw_geomean_8_4K",
            "allgather_auto_vs_iraw_geomean_8_4K", "reduce_scatter_auto_vs_raw_geomean", "allgather_auto_vs_raw_geomean")
    labels = dict(_TARGETS)
    cells = [[labels[k].format(small=small, all=small, big=""), f"{reps[k]['median']:.2f}x",
              f"{reps[k]['min']:.2f}-{reps[k]['max']:.2f}x"] for k in keys if k in reps]
    n = max(v["passes"] for v in reps.values())
    return (f"**P = {results['P']}**, float32, median [min-max] over {n} passes of the sweep:\n\n"
            + _table(cells, ("figure", "median", "range"), numbers_from=1))


#: Summary figures printed with their range over passes: (aggregate key, label). ``{big}``, ``{small}``
#: and ``{all}`` become the sizes the sweep measured within 64 KiB-64 MiB, within 8 B-4 KiB, and at all.
_TARGETS = (
    ("allreduce_best_vs_mpi_geomean_64K_64M", "best hand-made all-reduce busbw / `mpi`, geomean {big}"),
    ("auto_vs_raw_geomean_8_4K", "`auto` / `MPI_Allreduce` direct, geomean {small}"),
    ("auto_vs_raw_max_8_4K", "`auto` / `MPI_Allreduce` direct, worst size {small}"),
    ("auto_vs_iraw_geomean_8_4K", "`auto` / `MPI_Iallreduce`+`Wait` direct, geomean {small}"),
    ("iraw_vs_raw_geomean_8_4K", "`MPI_Iallreduce`+`Wait` / `MPI_Allreduce`, geomean {small}"),
    ("reduce_scatter_auto_vs_iraw_geomean_8_4K", "reduce-scatter `auto` / `MPI_Ireduce_scatter_block`+`Wait`, geomean {small}"),
    ("allgather_auto_vs_iraw_geomean_8_4K", "all-gather `auto` / `MPI_Iallgather`+`Wait`, geomean {small}"),
    ("mpi_vs_raw_geomean_8_4K", "`mpi` / `MPI_Allreduce` direct, geomean {small}"),
    ("mpi_vs_raw_geomean", "`mpi` / `MPI_Allreduce` direct, geomean {all}"),
    ("persistent_vs_raw_geomean_8_4K", "persistent plan / `MPI_Allreduce` direct, geomean {small}"),
    ("mpi_init_vs_raw_geomean_8_4K", "`MPI_Allreduce_init` / `MPI_Allreduce`, geomean {small}"),
    ("timeout_vs_auto_8", "`auto` with timeout / without, 8 B"),
    ("timeout_vs_auto_4M", "`auto` with timeout / without, 4 MiB"),
    ("reduce_scatter_auto_vs_raw_geomean", "reduce-scatter `auto` / `MPI_Reduce_scatter`, geomean {all}"),
    ("reduce_scatter_auto_vs_raw_max_1M_up", "reduce-scatter `auto` / `MPI_Reduce_scatter`, worst from 1 MiB"),
    ("allgather_auto_vs_raw_geomean", "all-gather `auto` / `MPI_Allgather`, geomean {all}"),
    ("allgather_auto_vs_raw_max_1M_up", "all-gather `auto` / `MPI_Allgather`, worst from 1 MiB"),
    ("execute_vs_direct_geomean", "`ring-execute` / `ring-direct`, geomean {all}"),
    ("best_vs_limit_geomean_1M_up", "best hand-made all-reduce / memory limit, geomean from 1 MiB"),
    ("best_vs_limit_max_1M_up", "best hand-made all-reduce / memory limit, worst size from 1 MiB"),
)


def _model(rows, min_bytes):
    """Return (``predict(algorithm, P, nbytes) -> seconds`` fitted to ``rows`` of at least ``min_bytes``,
    or None; a note saying which)."""
    from collectives.model import cost  # here, not at the top: importing collectives starts MPI

    try:
        params = cost.fit([r for r in rows if not r.get("wrong")], min_bytes=min_bytes)
    except (ValueError, KeyError, TypeError) as exc:
        return None, f"model not drawn: collectives.model.cost.fit failed ({exc})"
    note = (f"dashed: alpha-beta-gamma model fitted to this sweep's all-reduce rows from {_size(min_bytes)} "
            f"(alpha {params['alpha'] * 1e6:.3g} us, "
            f"beta {params['beta'] * 1e9:.3g} ns/B, gamma {params['gamma'] * 1e9:.3g} ns/B)")
    return (lambda alg, P, n: cost.predict(alg, P, n, params)), note


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw(results, out_dir, model=True, stat="mean", model_min_bytes=64 * _KIB):
    """Draw one PNG per op of ``results`` into ``out_dir`` (:func:`plots.bench_figure.draw_op`); return the paths.

    Parameters
    ----------
    results : dict
        As written by ``experiments.bench.collectives``.
    out_dir : str
        Directory for ``bench_OP_pP.png`` files (created if missing).
    model : bool
        Draw the fitted model as dashed lines (all-reduce) when :mod:`collectives.model.cost` is available.
    stat : {"mean", "median"}
        Time per call drawn: the slowest rank's mean (nccl-tests' time) or median; busbw follows it.
    model_min_bytes : int
        Smallest message (bytes) of the rows the model is fitted to.

    Raises
    ------
    ValueError
        If ``results`` has no rows, or no median times for ``stat="median"``.
    """
    rows = results.get("rows") or []
    if not rows:
        raise ValueError("results: no rows (was the sweep run?)")
    check_stat(rows, stat)
    plt = _pyplot()
    from plots.bench_figure import draw_op  # here, not at the top: it imports matplotlib

    predict, note = _model(rows, model_min_bytes) if model else (None, "model not drawn (--no-model)")
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for op in dict.fromkeys(r["collective"] for r in rows):
        fig = draw_op(plt, results, op, [r for r in rows if r["collective"] == op], lambda r: row_seconds(r, stat), stat,
                      predict, note, model_min_bytes)
        path = os.path.join(out_dir, f"bench_{op}_p{results['P']}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv=None):
    """Read results files, draw their figures, optionally print their Markdown summaries."""
    p = Parser(description=__doc__.split("\n\n")[0], prog="python -m plots.bench")
    p.add_argument("results", type=infile(), nargs="+", help="JSON files written by experiments.bench.collectives")
    p.add_argument("--out", type=outpath(folder=True, empty=True), help="directory for the PNG files (default: beside each results file)")
    p.add_argument("--markdown", action="store_true", help="print each file's ratio summary as Markdown")
    p.add_argument("--stat", choices=["mean", "median"], default="mean",
                   help="time drawn and compared: the slowest rank's mean (default) or median")
    p.add_argument("--model-min-bytes", type=integer(1, INT32_MAX), default=64 * _KIB,
                   help="fit the model to all-reduce rows of at least this many bytes (default 65536)")
    p.add_argument("--no-model", action="store_true", help="do not fit and draw the cost model")
    a = p.parse_args(argv)
    for path in a.results:
        try:
            with open(path, encoding="utf-8") as f:
                results = json.load(f)
            if not isinstance(results, dict) or not isinstance(results.get("rows"), list):
                raise ValueError("not an experiments.bench.collectives results file (no list of rows)")
            written = draw(results, a.out or os.path.dirname(os.path.abspath(path)), not a.no_model, a.stat,
                           a.model_min_bytes)
            text = markdown(results, a.stat) if a.markdown else None
        except OSError as exc:
            p.error(f"{path}: {exc.strerror or exc}")
        except (ValueError, KeyError, TypeError) as exc:  # KeyError, TypeError: a malformed row
            p.error(f"{path}: not an experiments.bench.collectives results file ({exc!r})"
                    if isinstance(exc, KeyError) else f"{path}: {exc}")
        print("\n".join(f"wrote {w}" for w in written))
        if text is not None:
            print("\n" + text + "\n")


if __name__ == "__main__":
    main()

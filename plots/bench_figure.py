"""The figure of one op of a collectives sweep: families of lines in rows, three panels each.

Drawn by :func:`plots.bench.draw`. Each row holds one family, so no panel carries more than eight
lines: all-reduce's hand-made algorithms (with ``auto``), then MPI's own calls and the reference
loops (``MPI_Allreduce``, its persistent form, commlab's persistent plan, ``auto`` with a timeout,
the hand-written ring loops, the memory-bandwidth ``limit``); the other ops have one row. In every
panel ``mpi`` (commlab's call of the MPI library's collective) is the thick black anchor line. The
panels: time per call (log-log), busbw (log-log) and time / ``mpi``'s time (log2, ``1x`` marked);
shaded bands span the fastest to the slowest pass of the sweep (``time_repeats_us``). The all-reduce
model (:mod:`collectives.model.cost`) is dashed, and only over the sizes it was fitted to. The x-axis ends at
the measured sizes, and the title says when the ranks outnumber the cores.
"""
import humanfriendly
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

__all__ = ["FAMILIES", "draw_op"]

#: (row title, algorithms) of the all-reduce figure; other ops draw every algorithm in one row.
FAMILIES = (("hand-made algorithms", ("ring", "tree", "recursive_doubling", "rabenseifner", "2d", "auto", "gloo")),
            ("MPI's own calls and reference loops", ("MPI_Allreduce", "MPI_Allreduce_init", "persistent",
                                                     "auto-timeout", "ring-direct", "ring-execute", "limit")))
_COLORS = {"ring": "tab:blue", "tree": "tab:green", "recursive_doubling": "tab:orange", "rabenseifner": "tab:purple",
           "2d": "tab:brown", "auto": "tab:red", "gloo": "tab:pink", "MPI_Allreduce": "tab:blue",
           "MPI_Allreduce_init": "tab:cyan", "persistent": "tab:green", "auto-timeout": "tab:red",
           "ring-direct": "tab:orange", "ring-execute": "tab:olive", "limit": "tab:gray",
           "MPI_Reduce_scatter": "tab:purple", "MPI_Allgather": "tab:purple", "MPI_Bcast": "tab:purple"}


def _size(n):
    return humanfriendly.format_size(n, binary=True)


def _series(rows, alg, seconds):
    """Return sizes, times (s), busbw (GB/s) and the fastest/slowest pass times of ``alg``'s rows."""
    pts = sorted((r["bytes"], seconds(r), r["busbw_GBps"] * r["time_s"], r.get("time_repeats_us") or [], r["wrong"])
                 for r in rows if r["algorithm"] == alg)
    x = [p[0] for p in pts]
    t = [p[1] for p in pts]
    bw = [p[2] / max(p[1], 1e-12) for p in pts]  # busbw scales inversely with the time drawn
    lo = [min(p[3]) * 1e-6 if p[3] else p[1] for p in pts]
    hi = [max(p[3]) * 1e-6 if p[3] else p[1] for p in pts]
    return x, t, bw, lo, hi, any(p[4] for p in pts)


def _line(axes, rows, alg, seconds, mpi, anchor=False):
    """Draw ``alg`` in the three panels of one row (time, busbw, ratio to ``mpi``), with its pass band."""
    x, t, bw, lo, hi, wrong = _series(rows, alg, seconds)
    if not x:
        return
    color = "black" if anchor else _COLORS.get(alg)
    style = dict(color=color, marker="o", markersize=3, linewidth=2.4 if anchor else 1.3, zorder=3 if anchor else 2,
                 label=("mpi (MPI library through commlab)" if anchor else alg) + (" (wrong results!)" if wrong else ""))
    axes[0].plot(x, [s * 1e6 for s in t], **style)
    axes[0].fill_between(x, [s * 1e6 for s in lo], [s * 1e6 for s in hi], color=color, alpha=0.15, linewidth=0)
    axes[1].plot(x, bw, **style)
    axes[1].fill_between(x, [b * s / h for b, s, h in zip(bw, t, hi)], [b * s / q for b, s, q in zip(bw, t, lo)],
                         color=color, alpha=0.15, linewidth=0)
    ratio = [(n, s / mpi[n], a / mpi[n], b / mpi[n]) for n, s, a, b in zip(x, t, lo, hi) if mpi.get(n)]
    if ratio and not anchor:
        axes[2].plot([q[0] for q in ratio], [q[1] for q in ratio], **style)
        axes[2].fill_between([q[0] for q in ratio], [q[2] for q in ratio], [q[3] for q in ratio], color=color,
                             alpha=0.15, linewidth=0)


def _decorate(axes, family, stat, sizes):
    lo, hi = min(sizes), max(sizes)
    ticks = [n for n in sizes if n & (n - 1) == 0 and (n.bit_length() - 1) % 3 == 0] or sizes
    for ax, ylabel, title in ((axes[0], f"time per call (us), slowest rank's {stat}", "latency"),
                              (axes[1], "busbw (GB/s, log scale)", "bus bandwidth"),
                              (axes[2], "time / mpi's time (below 1x: faster than mpi)", "relative to mpi")):
        ax.set_xscale("log", base=2)
        ax.set_xlim(lo / 1.4, hi * 1.4)
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _size(int(v))))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("message size (whole vector)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}: {family}", fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.tick_params(axis="x", labelrotation=45)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    axes[2].set_yscale("log", base=2)
    axes[2].yaxis.set_major_locator(LogLocator(base=2))
    axes[2].yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x" if v >= 1 else f"1/{1 / v:g}x"))
    axes[2].yaxis.set_minor_formatter(NullFormatter())
    axes[2].axhline(1.0, color="black", linewidth=1)


def _model_lines(ax, rows, algs, predict, P, min_bytes):
    """Dashed model times of ``algs`` over the sizes the model was fitted to (from ``min_bytes``)."""
    sizes = sorted({r["bytes"] for r in rows if r["bytes"] >= min_bytes})
    drawn = False
    for alg in algs:
        try:
            pred = [predict(alg, P, n) * 1e6 for n in sizes]
        except (KeyError, ValueError, NotImplementedError):
            continue
        ax.plot(sizes, pred, color=_COLORS.get(alg), linestyle="--", linewidth=1)
        drawn = True
    if drawn:
        ax.plot([], [], color="0.3", linestyle="--", linewidth=1, label=f"model (fitted from {_size(min_bytes)})")


def draw_op(plt, results, op, rows, seconds, stat, predict, note, min_bytes):
    """Return the figure of ``op``'s ``rows`` (one row of three panels per family)."""
    present = list(dict.fromkeys(r["algorithm"] for r in rows))
    families = [(name, [a for a in algs if a in present]) for name, algs in FAMILIES] if op == "allreduce" else \
        [("all algorithms", [a for a in present if a != "mpi"])]
    families = [(name, algs) for name, algs in families if algs]
    fig, grid = plt.subplots(len(families), 3, figsize=(19, 5.2 * len(families)), squeeze=False)
    mpi = {r["bytes"]: seconds(r) for r in rows if r["algorithm"] == "mpi"}
    sizes = sorted({r["bytes"] for r in rows})
    for axes, (name, algs) in zip(grid, families):
        _line(axes, rows, "mpi", seconds, mpi, anchor=True)
        for alg in algs:
            _line(axes, rows, alg, seconds, mpi)
        if predict is not None and op == "allreduce" and name == FAMILIES[0][0]:
            _model_lines(axes[0], rows, algs, predict, results["P"], min_bytes)
        _decorate(axes, name, stat, sizes)
        axes[0].legend(fontsize=8, loc="upper left")
    P, cpus = results["P"], results.get("cpus")
    shared = (f"; {P} ranks share {cpus} cores, so times include waiting for a core" if cpus and P > cpus else "")
    title = (f"{op} on P = {P} ranks, {results['config']['dtype']}, {results['mpi_library']}, "
             f"host {results.get('host', '?')}, {results.get('date', '')[:10]}{shared}\n"
             f"bands: fastest to slowest of the sweep's passes" + (f"; {note}" if op == "allreduce" else ""))
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig

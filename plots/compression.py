"""Draw the compression study: final test accuracy against the wire bytes per rank per step (what the
collectives sent, log scale), and the training loss per epoch.

    python -m plots.compression results/compression/compression_sweep.json [--out FILE.png]

Each compressor gets a short label (``qsgd-8bit``, ``topk-1%``, ``dgc-1%``, ``powersgd-r4``), one
colour and one marker, the same in both panels; the legend maps the labels back to the specs of the
table. Points with (almost) the same byte count are drawn side by side, and the labels are placed
where they cover no other label, marker or error bar.
"""
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the Agg backend)
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter  # noqa: E402
from matplotlib.transforms import Bbox, offset_copy  # noqa: E402

from plots.inputs import read_results  # noqa: E402
from training.settings.options import Parser, infile, outpath

__all__ = ["short_label", "figure", "draw", "main"]

_MARKERS = {"none": "*", "fp16": "o", "int8": "h", "qsgd": "p", "terngrad": "D", "signsgd": "^",
            "efsignsgd": "v", "onebit": "<", "topk": "s", "randomk": "d", "threshold": "H",
            "dgc": "P", "powersgd": "X"}
_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
           "tab:gray", "tab:olive", "tab:cyan", "navy", "teal", "goldenrod")  # none is black
_DODGE = 10.0   # points between the markers of a group drawn side by side
_NEAR = 0.03    # decades of bytes within which markers form such a group
_SIZE = 7.0     # marker size, points


def short_label(spec):
    """Return the short plot label of a compressor spec ``NAME[:KEY=VALUE,...]``.

    ``ratio`` becomes a percentage (``topk-1%``), QSGD's ``levels`` s the bits of a signed level,
    ceil(log2(2s + 1)) (``qsgd-8bit``), ``rank`` an ``r`` (``powersgd-r4``), ``threshold`` its value;
    other arguments (warm-up, seeds, error feedback) are left out.

    Parameters
    ----------
    spec : str
        Compressor spec as in the sweep's table.

    Returns
    -------
    str
    """
    name, _, args = spec.partition(":")
    kw = dict(a.split("=", 1) for a in args.split(",") if "=" in a)
    try:
        if "ratio" in kw:
            return f"{name}-{100 * float(kw['ratio']):g}%"
        if "levels" in kw:
            return f"{name}-{math.ceil(math.log2(2 * int(kw['levels']) + 1))}bit"
        if "matrix_rank" in kw or "rank" in kw:  # rank: PowerSGD's former name of matrix_rank
            return f"{name}-r{int(kw.get('matrix_rank', kw.get('rank')))}"
        if "threshold" in kw:
            return f"{name}-{float(kw['threshold']):g}"
    except ValueError:  # an argument that is not a number: keep the whole spec
        return spec
    return name


def _labels(rows):
    """Short labels of the rows; the full spec wherever two rows would share one."""
    short = [short_label(r["spec"]) for r in rows]
    return [s if short.count(s) == 1 else r["spec"] for s, r in zip(short, rows)]


def _dodges(xs):
    """Horizontal offsets (points) that put markers of (almost) equal ``xs`` side by side."""
    order, offsets, group = sorted(range(len(xs)), key=lambda i: xs[i]), [0.0] * len(xs), []
    for i in order + [None]:
        if group and (i is None or math.log10(xs[i] / xs[group[0]]) > _NEAR):
            for k, j in enumerate(group):
                offsets[j] = (k - (len(group) - 1) / 2) * _DODGE
            group = []
        if i is not None:
            group.append(i)
    return offsets


def _box(cx, cy, half_w, half_h):
    return Bbox.from_extents(cx - half_w, cy - half_h, cx + half_w, cy + half_h)


def _candidates():
    """Label spots in order of preference: (kind, ux, uy, distance in points).

    ``side``: beside the marker; ``cap``: beyond the end of the error bar; ``lead``: in one of
    eight directions, with a leader line back to the marker.
    """
    spots = [("side", 1, 0, 8), ("side", -1, 0, 8), ("cap", 0, 1, 4), ("cap", 0, -1, 4)]
    for radius in (16, 26, 38, 52, 68, 86):
        spots += [("lead", ux, uy, radius) for ux, uy in
                  ((1, 1), (-1, 1), (1, -1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1))]
    return spots


def _place_labels(ax, points, extra):
    """Annotate ``points`` (x, y, dodge, text, bar low, bar high) so that no label covers another
    label, a marker, an error bar or a box of ``extra`` (display units), and no leader line crosses
    a marker, a bar or a label. Crowded points are placed first; return the labels' boxes."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    frame, pt = ax.get_window_extent(renderer), fig.dpi / 72
    to_display = [offset_copy(ax.transData, fig=fig, x=p[2], units="points").transform for p in points]
    centres = [f(p[:2]) for f, p in zip(to_display, points)]
    markers = [_box(cx, cy, _SIZE * 0.8 * pt, _SIZE * 0.8 * pt) for cx, cy in centres]  # none's star too
    bars = [Bbox.from_extents(c[0] - 4 * pt, f((p[0], p[4]))[1] - pt, c[0] + 4 * pt, f((p[0], p[5]))[1] + pt)
            for f, p, c in zip(to_display, points, centres)]  # with the caps, 3 points either side
    labels = []
    crowd = [sum(math.dist(c, d) < 80 * pt for d in centres) for c in centres]
    for i in sorted(range(len(points)), key=lambda i: -crowd[i]):
        x, y, dodge, text, low, high = points[i]
        trans = offset_copy(ax.transData, fig=fig, x=dodge, units="points")
        others = markers[:i] + markers[i + 1:] + bars[:i] + bars[i + 1:] + labels + extra
        for kind, ux, uy, dist in _candidates():
            anchor = (x, y) if kind != "cap" else (x, high if uy > 0 else low)
            dx, dy = (ux * dist, uy * dist) if kind != "lead" else (ux * dist, uy * dist * 0.7)
            ann = ax.annotate(text, anchor, xycoords=trans, textcoords="offset points", xytext=(dx, dy),
                              fontsize=8, color="0.1", zorder=5,
                              ha={1: "left", -1: "right", 0: "center"}[ux],
                              va={1: "bottom", -1: "top", 0: "center"}[uy],
                              arrowprops={"arrowstyle": "-", "color": "0.55", "lw": 0.6, "shrinkA": 1,
                                          "shrinkB": _SIZE * 0.7} if kind == "lead" else None)
            ann.update_positions(renderer)
            box = Text.get_window_extent(ann, renderer).padded(2 * pt)  # the text, not the leader
            steps = int(math.hypot(dx, dy) / 2) if kind == "lead" else 0
            leader = [(centres[i][0] + dx * pt * t / steps, centres[i][1] + dy * pt * t / steps)
                      for t in range(1, steps)]
            mine = [markers[i]] + ([bars[i]] if ux else [])  # a vertical leader may run along its bar
            free = (frame.contains(box.x0, box.y0) and frame.contains(box.x1, box.y1)
                    and not any(box.overlaps(b) for b in others + [markers[i], bars[i]])
                    and not any(b.contains(*e) for b in others + mine[1:] for e in leader
                                if not markers[i].contains(*e)))
            if free:
                break
            ann.remove()
        else:  # nowhere free: beside the marker, over whatever is there
            ann = ax.annotate(text, (x, y), xycoords=trans, textcoords="offset points", xytext=(7, 0),
                              ha="left", va="center", fontsize=8, zorder=5)
            ann.update_positions(renderer)
            box = Text.get_window_extent(ann, renderer)
        labels.append(box)
    return labels


def figure(results):
    """Return the figure of ``results`` (the sweep's JSON, as a dict): accuracy and loss panels.

    Parameters
    ----------
    results : dict
        As written by ``experiments.studies.compression_sweep`` (``table``, ``run``, ``train_config``).

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If ``results`` has no table rows.
    """
    rows = results.get("table") or []
    if not rows:
        raise ValueError("results: the table is empty (was the sweep run?)")
    P = results.get("run", {}).get("P")
    fig = plt.figure(figsize=(13, 11.5), dpi=120)
    grid = fig.add_gridspec(2, 2, height_ratios=[1.25, 1], width_ratios=[1.7, 1])
    ax_acc, ax_loss, ax_key = fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
    names, xs, measured = _labels(rows), [], []
    for r in rows:  # wire bytes; a row without them (threshold: data-dependent) at its payload bytes
        wire = r.get("wire_bytes_per_step")
        measured.append(bool(wire))
        xs.append(wire if wire else r["bytes_per_step"])
    none = next((r for r in rows if r["spec"] == "none"), None)
    ax_acc.set_xscale("log")
    ax_acc.set_xlim(min(xs) / 1.6, max(xs) * 1.6)
    ax_acc.set_ylim(min(100 * r["test_acc_min"] for r in rows) - 0.8, max(100 * r["test_acc_max"] for r in rows) + 0.8)
    dodges, points, spans, handles, k = _dodges(xs), [], [], [], 0
    for i, r in enumerate(rows):
        reference = r["spec"] == "none"
        color = "black" if reference else _COLORS[k % len(_COLORS)]
        k += not reference
        marker, size = _MARKERS.get(r["compressor"], "o"), _SIZE * (1.6 if reference else 1)
        trans = offset_copy(ax_acc.transData, fig=fig, x=dodges[i], units="points")
        y, text = _accuracy_point(ax_acc, trans, xs[i], r, names[i], color, marker, size, measured[i])
        points.append((xs[i], y, dodges[i], text))
        spans.append((100 * r["test_acc_min"], 100 * r["test_acc_max"]))
        epochs = range(1, len(r["loss_curve"]) + 1)
        # equal curves (none and fp16 train alike) stay visible: the reference is drawn wide and
        # underneath, and each curve's markers sit on its own epochs
        ax_loss.plot(epochs, r["loss_curve"], color=color, marker=marker, markersize=4,
                     markevery=(k % 4, 4) if not reference else None,
                     linewidth=4.0 if reference else 1.2, alpha=0.45 if reference else 1.0,
                     zorder=1 if reference else 2)
        key = names[i] if names[i] == r["spec"] else f"{names[i]}  ({r['spec']})"
        handles.append(Line2D([], [], color=(0, 0, 0, 0.45) if reference else color, marker=marker,
                              markerfacecolor=color, markeredgecolor=color, markersize=size * 0.9,
                              linewidth=4.0 if reference else 1.2, label=key))  # as drawn in both panels
    if none is not None:
        _reference_band(ax_acc, 100 * none["test_acc_mean"])
    _decorate(fig, ax_acc, ax_loss, ax_key, handles, results, P, all(measured))
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.canvas.draw()  # settle the layout: the labels are placed on the drawn canvas
    caption = [t.get_window_extent(fig.canvas.get_renderer()).padded(2) for t in ax_acc.texts]
    _place_labels(ax_acc, [p + s for p, s in zip(points, spans)], caption)
    return fig


def _accuracy_point(ax, trans, x, r, name, color, marker, size, measured=True):
    """Draw one row's mean accuracy with its min-max bar; return ``(y drawn, label text)``.

    A row without measured wire bytes is drawn hollow at its payload bytes, and its label says so.
    """
    y = 100 * r["test_acc_mean"]
    err = [[y - 100 * r["test_acc_min"]], [100 * r["test_acc_max"] - y]]
    ax.errorbar(x, y, yerr=err, fmt=marker, color=color, markersize=size, capsize=3, elinewidth=1.1,
                markerfacecolor=color if measured else "white", transform=trans, zorder=4)
    return y, name if measured else f"{name} (payload; wire not measured)"


def _reference_band(ax, ref):
    """Mark the uncompressed accuracy ``ref`` (%) and the band 1.5 points below it."""
    ax.axhline(ref, color="0.5", linestyle="--", linewidth=1, zorder=1)
    ax.axhspan(ref - 1.5, ref, color="0.93", zorder=0)
    ax.text(0.005, ref - 1.45, "within 1.5 points of none", fontsize=7.5, color="0.4",
            va="bottom", transform=ax.get_yaxis_transform())


def _decorate(fig, ax_acc, ax_loss, ax_key, handles, results, P=None, all_measured=True):
    """Axis labels, scales, titles, the key panel and the figure title."""
    rows, run, cfg = results["table"], results.get("run", {}), results.get("train_config", {})
    ax_acc.set_xlabel("wire bytes per rank per step, as the collectives sent them (log scale; points with "
                      "equal bytes drawn side by side" + ("" if all_measured else "; hollow: payload bytes") + ")")
    ax_acc.set_ylabel(f"final test accuracy (%)\nmean of {rows[0].get('seeds', 1)} seed(s), bars: min-max")
    gathered = f"all-gathered payloads cost (P-1) = {P - 1}x their size" if P else "all-gathered payloads cost (P-1)x"
    ax_acc.set_title(f"final test accuracy against wire bytes per rank per step ({gathered}; all-reduced "
                     "ones what the algorithm sends)", fontsize=10)
    ax_acc.grid(True, which="both", alpha=0.3)
    ax_loss.set_yscale("log")
    ax_loss.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax_loss.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax_loss.yaxis.set_minor_formatter(NullFormatter())
    ax_loss.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("training loss (mean over ranks and seeds, log scale)")
    ax_loss.set_title("training loss per epoch")
    ax_loss.grid(True, which="both", alpha=0.3)
    ax_key.axis("off")
    ax_key.legend(handles=handles, loc="center left", fontsize=8.5, frameon=False,
                  title="compressor  (spec in the table)", title_fontsize=9)
    fig.suptitle(f"gradient compression on {cfg.get('data', '?')}: {results.get('parameters', '?')} "
                 f"parameters, P={run.get('P', '?')}, {cfg.get('optimizer', '?')} lr {cfg.get('lr', '?')}, "
                 f"batch {cfg.get('batch_size', '?')}, {cfg.get('epochs', '?')} epochs "
                 f"({_library(run)}, {cfg.get('dtype', 'float32')}, all-reduce {cfg.get('algorithm', 'auto')}, "
                 f"host {run.get('host', '?')})", fontsize=10)


def _library(run):
    """The run's MPI library as the results file holds it (formatted by ``commlab.provenance.mpi_library``
    when the sweep wrote it; plotting does not import ``collectives``, which would start MPI)."""
    return run.get("mpi_library") or "MPI library ?"


def draw(results, path):
    """Draw the figure of ``results`` (the sweep's JSON, as a dict) into the PNG ``path``.

    Parameters
    ----------
    results : dict
        As written by ``experiments.studies.compression_sweep``.
    path : str
        Output PNG file.

    Raises
    ------
    ValueError
        If ``results`` has no table rows.
    """
    fig = figure(results)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    """Command-line entry point; returns the exit status."""
    p = Parser(prog="python -m plots.compression",
                                description="Draw the compression study from its results JSON.")
    p.add_argument("results", type=infile(), help="compression_sweep.json written by experiments.studies.compression_sweep")
    p.add_argument("--out", type=outpath(empty=True), help="output PNG (default: compression.png beside RESULTS)")
    args = p.parse_args(argv)
    results = read_results(p, args.results)
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.results)), "compression.png")
    try:
        draw(results, out)
    except OSError as e:
        p.error(f"--out {out}: cannot write it ({e.strerror or e})")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        p.error(f"{args.results}: not a compression_sweep results file ({e!r})" if not isinstance(e, ValueError)
                else f"{args.results}: {e}")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

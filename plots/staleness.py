"""Draw the staleness study: test accuracy against wall time per protocol, and the staleness
histogram of every protocol.

    python -m plots.staleness results/ps_study/ps_study.json [--out FILE.png]
    python -m plots.staleness results/staleness/staleness_sweep.json [--out FILE.png]

Also accepts the ``summary.json`` of single ``--mode ps`` runs (one curve and histogram each). From
a ``ps_study.json`` (:mod:`experiments.studies.ps_study`) the curves and histograms are those of its
transient-delay part, and a second figure, ``*_throughput.png`` beside the first, draws the
study's ratio tables: time to 95 % against BSP under transient delays, throughput under a
persistent straggler against none, and throughput with 1, 2 and 4 servers.
"""
import json
import math
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the Agg backend)
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter  # noqa: E402
from training.settings.options import Parser, infile, outpath

__all__ = ["load_runs", "draw", "draw_ratios", "main"]


def load_runs(paths):
    """Return ``(runs, meta)`` from sweep results files and/or run summaries.

    Parameters
    ----------
    paths : list of str
        ``ps_study.json`` files (the runs of their transient-delay part), ``staleness_sweep.json``
        files (all their runs) or ``summary.json`` files of PS runs.

    Returns
    -------
    runs : list of dict
        Each with ``label``, ``curve`` (``wall_s``, ``test_acc``), ``staleness_histogram``,
        ``updates_per_s``, ``final_test_acc`` and ``repeat``.
    meta : dict
        ``run`` information (MPI library, P, host), the straggler, (sweep and study results) the
        ``finished`` time of the first file, and (study results) ``delay`` as (probability,
        seconds) and the study's ratio ``tables``.

    Raises
    ------
    ValueError
        When a file is neither a study or sweep result nor a parameter-server summary, or no
        file holds a run (or a study's tables).
    """
    runs, meta = [], {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if data.get("experiment") == "ps_study":
            meta.setdefault("run", data.get("run", {}))
            meta.setdefault("straggler", "")
            meta.setdefault("finished", data.get("finished", ""))
            study = data.get("study", {})
            meta.setdefault("delay", (study.get("delay_prob"), study.get("delay_s")))
            meta.setdefault("tables", data.get("tables", {}))
            for r in data["runs"]:
                if r["part"] == "transient":
                    runs.append(dict(r, label=_label(r["consistency"], r["staleness_bound"])))
        elif "runs" in data:
            meta.setdefault("run", data.get("run", {}))
            meta.setdefault("straggler", data.get("train_config", {}).get("straggler", ""))
            meta.setdefault("finished", data.get("finished", ""))
            for r in data["runs"]:
                runs.append(dict(r, label=_label(r["consistency"], r["staleness_bound"])))
        elif data.get("mode") == "ps":
            meta.setdefault("run", data.get("run", {}))
            meta.setdefault("straggler", data.get("straggler", ""))
            runs.append(dict(data, repeat=0, label=_label(data["consistency"], data["staleness_bound"])))
        else:
            raise ValueError(f"{path}: not a staleness sweep result nor a --mode ps summary.json")
    if not runs and not meta.get("tables"):
        raise ValueError("no runs in the given files")
    return runs, meta


def _label(consistency, s):
    return f"SSP s={s}" if consistency == "ssp" else consistency.upper()


def draw(runs, meta, path):
    """Draw accuracy-versus-time curves and staleness histograms of ``runs`` into the PNG ``path``.

    Top left: test accuracy against wall time of every run (bold: the run with the median updates
    per second of its protocol; thin: the other repeats); the legend gives each protocol's median
    updates per second and mean final test accuracy. Top right: the end of the same curves,
    zoomed to the top accuracies on a linear scale with the end of each run marked, so that final
    accuracies close to each other can be told apart. Bottom: staleness histogram per protocol on
    one shared y-scale, binned where a protocol (ASP) has many staleness values. Colours: BSP
    black, ASP red, every SSP bound its own qualitative colour.
    """
    labels = list(dict.fromkeys(r["label"] for r in runs))
    colors = _colors(labels)
    n = len(labels)
    fig = plt.figure(figsize=(14, 5.5 + 1.6 * ((n + 2) // 3)))
    grid = fig.add_gridspec(2, 3, height_ratios=[3, 1.4 * ((n + 2) // 3)], hspace=0.35)
    top = grid[0, :].subgridspec(1, 2, width_ratios=[2.1, 1], wspace=0.16)
    ax, zoom = fig.add_subplot(top[0, 0]), fig.add_subplot(top[0, 1])
    repeats = max(sum(r["label"] == lab for r in runs) for lab in labels)
    for lab in labels:
        _protocol_curves(ax, zoom, [r for r in runs if r["label"] == lab], lab, colors[lab])
    _accuracy_axes(ax, zoom, runs, meta, repeats)
    _histograms(fig, grid, labels, runs, colors)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


#: SSP bounds in qualitative colours (BSP black, ASP red), told apart at a glance and in print.
_SSP_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
               "tab:cyan", "tab:gray")


def _colors(labels):
    """Return label -> colour: BSP black, ASP red, each SSP bound its own qualitative colour."""
    colors, ssp = {}, iter(_SSP_COLORS * (1 + len(labels) // len(_SSP_COLORS)))
    for lab in labels:
        colors[lab] = {"BSP": "black", "ASP": "tab:red"}.get(lab) or next(ssp)
    return colors


def _protocol_curves(ax, zoom, group, lab, color):
    """Draw one protocol's repeats: bold the run with the median updates per second, thin the others."""
    median = statistics.median(r["updates_per_s"] for r in group)
    typical = min(group, key=lambda r: abs(r["updates_per_s"] - median))  # drawn bold
    final = statistics.fmean(r["final_test_acc"] for r in group)
    for r in group:
        bold = r is typical
        t, acc = [p["wall_s"] for p in r["curve"]], [100 * p["test_acc"] for p in r["curve"]]
        style = dict(color=color, linewidth=1.8 if bold else 0.7, alpha=1.0 if bold else 0.35,
                     zorder=3 if bold else 2)
        ax.plot(t, acc, **style,
                label=f"{lab}: {median:.0f} updates/s, final {100 * final:.2f} %" if bold else None)
        zoom.plot(t, acc, **style)
        if t:
            zoom.plot(t[-1], acc[-1], "o", color=color, markersize=6 if bold else 3.5,
                      markeredgecolor="white" if bold else "none", alpha=1.0 if bold else 0.5,
                      zorder=4 if bold else 2)


def _accuracy_axes(ax, zoom, runs, meta, repeats):
    """Scales, 95 % line, labels, titles and legend of the accuracy panel and its zoom."""
    points = [p for r in runs for p in r["curve"]]
    if repeats > 1:  # what the thin lines are
        ax.plot([], [], color="0.3", linewidth=0.7, alpha=0.5, label="thin: individual repeats (same colours)")
    for a in (ax, zoom):
        a.axhline(95, color="0.5", linestyle="--", linewidth=1)
        a.set_xscale("log")
        a.set_xlabel("wall time since start (s, log scale)")
    ax.grid(alpha=0.3)
    for a in (ax, zoom):  # plain-number ticks at 1, 2, 5 x 10^k on both time axes
        a.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        a.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        a.xaxis.set_minor_formatter(NullFormatter())
    zoom.grid(alpha=0.3)
    if points:
        ax.text(min(p["wall_s"] for p in points), 95.2, "95 %", color="0.4", va="bottom")
    ax.set_ylim(max(0, min(100 * r["curve"][0]["test_acc"] for r in runs if r["curve"]) - 5)
                if points else 0, 100)
    ax.set_ylabel("test accuracy (%)")
    run = meta.get("run", {})
    mpi = run.get("mpi_library") or "MPI library ?"  # formatted when the results were written
    prob, secs = meta.get("delay") or (None, None)
    what = (f"transient delays ({secs * 1e3:g} ms with probability {prob:g} per worker and clock)" if prob
            else f"straggler {meta.get('straggler') or 'none'} (RANK:FACTOR)")
    ax.set_title(f"Parameter server, {what}: test accuracy vs wall time\n"
                 f"P={run.get('P', '?')}, {mpi}, host {run.get('host', '?')}", fontsize=10)
    title = (f"bold: median-updates/s run of {repeats}; final: mean of {repeats}" if repeats > 1
             else None)
    ax.legend(loc="lower right", fontsize=8, title=title, title_fontsize=8)
    _zoom_limits(zoom, runs)
    zoom.set_ylabel("test accuracy (%, linear)")
    zoom.set_title("end of training, zoomed (dots: last evaluation)", fontsize=10)


def _zoom_limits(zoom, runs):
    """Zoom to accuracies from (at most) 94 % up, and to the times where any curve is there."""
    ends = [100 * r["curve"][-1]["test_acc"] for r in runs if r["curve"]]
    if not ends:
        return
    lo = max(0.0, min(94.0, math.floor(min(ends)) - 2.0))
    hi = min(100.0, max(100 * p["test_acc"] for r in runs for p in r["curve"]) + 0.5)
    starts = [next((p["wall_s"] for p in r["curve"] if 100 * p["test_acc"] >= lo), None) for r in runs]
    starts = [t for t in starts if t is not None and t > 0]
    last = max(r["curve"][-1]["wall_s"] for r in runs if r["curve"])
    if starts and last > 0:
        zoom.set_xlim(min(starts) / 1.1, last * 1.15)
    zoom.set_ylim(lo, max(hi, lo + 1))


#: Histograms with more staleness values than this are drawn in bins of several clocks.
MAX_BARS = 30


def _binned(hist):
    """Return ``(lefts, percents, width)``: ``hist`` (staleness -> count) in bins of ``width``
    clocks (1 up to :data:`MAX_BARS` values, else the smallest width giving at most that many bars)."""
    total = sum(hist.values()) or 1
    kmax = max(hist, default=0)
    width = max(1, math.ceil((kmax + 1) / MAX_BARS))
    bins = {}
    for k, v in hist.items():
        bins[k // width * width] = bins.get(k // width * width, 0) + v
    lefts = sorted(bins)
    return lefts, [100 * bins[k] / total for k in lefts], width


def _histograms(fig, grid, labels, runs, colors):
    """Draw one staleness histogram per protocol (all repeats summed) in the bottom row.

    Every panel shares one y-scale (% of served pulls, 0 to the largest bar of any protocol); a
    protocol with more than :data:`MAX_BARS` staleness values (ASP) is binned, the bin width in its
    x label.
    """
    n = len(labels)
    sub = grid[1, :].subgridspec((n + 2) // 3, 3, hspace=0.9, wspace=0.25)
    hists = {}
    for lab in labels:
        hist = {}
        for r in runs:
            if r["label"] == lab:
                for k, v in r["staleness_histogram"].items():
                    hist[int(k)] = hist.get(int(k), 0) + v
        hists[lab] = hist
    binned = {lab: _binned(h) for lab, h in hists.items()}
    top = max((max(pct, default=0) for _, pct, _ in binned.values()), default=100)
    first = None
    for i, lab in enumerate(labels):
        h = fig.add_subplot(sub[i // 3, i % 3], sharey=first)
        first = first or h
        lefts, pct, width = binned[lab]
        kmax = max(hists[lab], default=0)
        if width == 1:
            h.bar(lefts, pct, width=0.9, color=colors[lab])
            h.set_xlabel("staleness (clocks)", fontsize=8)
            h.xaxis.set_major_locator(MaxNLocator(integer=True))
            h.set_xlim(-0.6 - 0.02 * max(2, kmax), max(2, kmax) + 0.6)
        else:
            h.bar(lefts, pct, width=0.9 * width, align="edge", color=colors[lab])
            h.set_xlabel(f"staleness (clocks, bins of {width})", fontsize=8)
            h.set_xlim(-0.5 * width, (kmax // width + 1) * width + 0.5 * width)
        h.set_title(f"{lab}: staleness of served pulls (max {kmax})", fontsize=9)
        h.set_ylabel("% of pulls", fontsize=8)
        h.set_ylim(0, min(100, top * 1.08) or 1)
        h.tick_params(labelsize=7)
        h.grid(axis="y", alpha=0.3)


#: Panels of :func:`draw_ratios`: (part, title, bars as (table key, legend label), y label).
_RATIO_PANELS = (
    ("transient", "transient delays: time to 95 % vs BSP",
     (("time_to_target_vs_baseline", "BSP's time to 95 % / this protocol's"),
      ("updates_vs_baseline", "updates/s vs BSP")), "ratio (> 1: better than BSP)"),
    ("straggler", "persistent straggler: throughput vs no straggler",
     (("samples_vs_baseline", "samples/s vs even"), ("updates_vs_baseline", "updates/s vs even")),
     "ratio to the run without a straggler"),
    ("servers", "BSP with 1, 2, 4 servers (P fixed: W = P - S)",
     (("samples_vs_baseline", "samples/s vs 1 server"), ("updates_vs_baseline", "updates/s vs 1 server")),
     "ratio to one server"),
)


def draw_ratios(tables, meta, path):
    """Draw the study's ratio tables (``ps_study.json``'s ``tables``) into the PNG ``path``.

    One panel per part present: grouped bars of the median ratio per variant, a black line from
    the smallest to the largest repeat's ratio, the value written above each bar, and a dashed line
    at 1 (the baseline). A variant without a ratio (never reached 95 %) gets no bar and ``n/a``.

    Parameters
    ----------
    tables : dict
        ``{part: rows}`` as :func:`plots.tables.ps_tables.ratio_table` computed them.
    meta : dict
        From :func:`load_runs` (``run``: MPI library, P, host).
    path : str
        PNG file to write.
    """
    panels = [p for p in _RATIO_PANELS if tables.get(p[0])]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.6), squeeze=False)
    for ax, (part, title, bars, ylabel) in zip(axes[0], panels):
        rows = tables[part]
        width = 0.8 / len(bars)
        for j, ((key, label), color) in enumerate(zip(bars, ("tab:blue", "tab:orange"))):
            for i, row in enumerate(rows):
                s = row[key]
                x = i + (j - (len(bars) - 1) / 2) * width
                if s["median"] is None:
                    ax.text(x, 0.05, "n/a", ha="center", fontsize=7, rotation=90)
                    continue
                ax.bar(x, s["median"], width * 0.92, color=color, label=label if i == 0 else None)
                ax.plot([x, x], [s["min"], s["max"]], color="black", linewidth=1.2)
                ax.text(x, s["max"] * 1.02 + 0.02, f"{s['median']:.2f}", ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="0.4", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([_variant_label(part, r["variant"]) for r in rows], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.set_ylim(0, max([r[k]["max"] for r in rows for k, _ in bars if r[k]["max"] is not None] + [1.0]) * 1.2)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    run = meta.get("run", {})
    n = max((r["runs"] for rows in tables.values() for r in rows), default=0)
    fig.suptitle(f"Parameter-server study: bars are medians over {n} repeats, black lines the range -- "
                 f"P={run.get('P', '?')}, {run.get('mpi_library') or 'MPI library ?'}, host {run.get('host', '?')}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _variant_label(part, name):
    """Axis label of a variant: protocols as in the other figure, server counts as 'S = k'."""
    if part == "servers":
        return f"S = {name[1:]}"
    if name.startswith("ssp"):
        return f"SSP s={name[3:]}"
    return {"bsp": "BSP", "asp": "ASP", "bsp-balance": "BSP\n--balance", "even": "BSP\nno straggler"}.get(name, name)


def main(argv=None):
    """Command-line entry point: read the results, draw the PNG(s), print their paths."""
    parser = Parser(prog="python -m plots.staleness", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=infile(), nargs="+",
                        help="ps_study.json, staleness_sweep.json or --mode ps summary.json files")
    parser.add_argument("--out", type=outpath(empty=True), help="PNG file (default: staleness.png beside the first results file)")
    args = parser.parse_args(argv)
    try:
        runs, meta = load_runs(args.results)
    except (OSError, ValueError, KeyError) as e:
        parser.error(str(e))
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.results[0])), "staleness.png")
    if runs:
        draw(runs, meta, out)
        when = f", sweep finished {meta['finished']}" if meta.get("finished") else ""
        print(f"{out} ({len(runs)} runs: {', '.join(dict.fromkeys(r['label'] for r in runs))}{when})")
    if meta.get("tables"):
        second = os.path.splitext(out)[0] + "_throughput.png"
        draw_ratios(meta["tables"], meta, second)
        print(f"{second} (ratio tables: {', '.join(meta['tables'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

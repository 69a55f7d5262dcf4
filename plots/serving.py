"""Draw the serving study: p50/p99 latency against offered load per balancing policy (the "hockey
stick"), replicated against tensor-parallel replicas, all-reduce time per algorithm and size, and a
tensor-parallel replica's latency per all-reduce algorithm; and, in a second figure (``*_load.png``),
one replica's throughput, batch size, latency and goodput against offered load with and without a
latency objective.

    python -m plots.serving results/serving/serving_study.json [--out FILE.png]

Drawing only: every number comes from the study's results file (medians over its repeats, bars
from the smallest to the largest repeat).
"""
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the Agg backend)
from tabulate import tabulate  # noqa: E402

from plots.inputs import read_results  # noqa: E402
from training.settings.options import Parser, infile, outpath

__all__ = ["draw", "draw_load", "load_table", "main"]

_COLORS = {"round-robin": "tab:red", "least-outstanding": "tab:blue", "power-of-two": "tab:green"}


def _policy_panel(ax, doc):
    pts = [p for p in doc["points"] if p["part"] == "policies"]
    if not pts:  # part A not run
        ax.set_axis_off()
        return
    for pol in dict.fromkeys(p["policy"] for p in pts):
        fr = sorted({p["fraction"] for p in pts if p["policy"] == pol})
        for key, style in (("latency_p99_ms", "-o"), ("latency_p50_ms", "--.")):
            vals = [[p[key] for p in pts if p["policy"] == pol and p["fraction"] == f] for f in fr]
            med = [statistics.median(v) for v in vals]
            err = [[m - min(v) for m, v in zip(med, vals)], [max(v) - m for m, v in zip(med, vals)]]
            ax.errorbar(fr, med, yerr=err, fmt=style, color=_COLORS.get(pol), capsize=3, markersize=5,
                        label=f"{pol} {'p99' if '99' in key else 'p50'}", alpha=1.0 if "99" in key else 0.6)
    ax.set_yscale("log")
    ax.set_xlabel("offered load (fraction of capacity)")
    ax.set_ylabel("latency (ms, log scale)")
    caps = doc.get("capacities_rps") or [0]
    st = doc.get("study", {})
    ax.set_title(f"3 replicas, replica 2 {st.get('slow', '?')}x slow, {st.get('service_ms', '?')} ms/batch; "
                 f"capacity {statistics.median(caps):.0f} req/s", fontsize=10)
    ratios = doc.get("ratios_at_80") or {}
    text = "\n".join(f"p99 round-robin / {k} at 0.8: {v['median']:.1f}x ({v['min']:.1f}-{v['max']:.1f})"
                     for k, v in ratios.items() if v)
    if text:
        ax.text(0.02, 0.98, text, transform=ax.transAxes, va="top", fontsize=8,
                bbox=dict(facecolor="white", alpha=0.8, edgecolor="0.8"))
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.16))  # below the panel, off the data


def _tp_panel(ax, doc):
    pts = doc["points"]
    labels, caps, p50, p99 = [], [], [], []
    for R, T in ((2, 1), (1, 2)):
        c = [p["throughput_rps"] for p in pts if p["part"] == "tp-capacity" and p["replicas"] == R]
        light = [p for p in pts if p["part"] == "tp-light" and p["replicas"] == R]
        if not c or not light:
            continue
        labels.append(f"{R} x T={T}")
        caps.append(statistics.median(c))
        p50.append(statistics.median(p["latency_p50_ms"] for p in light))
        p99.append(statistics.median(p["latency_p99_ms"] for p in light))
    if not labels:  # part B not run
        ax.set_axis_off()
        return
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], p50, 0.4, label="p50 at light load", color="tab:blue")
    ax.bar([i + 0.2 for i in x], p99, 0.4, label="p99 at light load", color="tab:orange")
    ax.set_xticks(list(x), [f"{lab}\ncapacity {c:.0f} req/s" for lab, c in zip(labels, caps)])
    ax.set_ylabel("latency (ms)")
    ax.set_title("3 ranks: replicated vs tensor-parallel (medians)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")


def _allreduce_panel(ax, doc):
    rows = doc.get("allreduce") or []
    if not rows:
        ax.set_axis_off()
        return
    colors = {}
    for P, style in ((2, "-o"), (3, "-.^"), (4, ":s")):
        sub = [r for r in rows if r.get("P", 2) == P]
        if not sub:
            continue
        sizes = [r["bytes"] for r in sub]
        for a in sub[0]["us"]:
            line, = ax.plot(sizes, [r["us"][a] for r in sub], "--" if a == "auto" else style, markersize=4,
                            color="k" if a == "auto" else colors.get(a), label=f"{a} P={P}", alpha=1.0 if P < 4 else 0.7)
            colors[a] = line.get_color()
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("message (bytes, float64)")
    ax.set_ylabel("time per all-reduce (us)")
    ax.set_title("all-reduce at the tensor-parallel forward's sizes", fontsize=10)
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.16))  # below the panel, off the data
    ax.grid(alpha=0.3, which="both")


def _tp_algorithm_panel(ax, doc):
    pts = [p for p in doc["points"] if p["part"] == "tp-algorithm"]
    if not pts:
        ax.set_axis_off()
        return
    labels, med, lo, hi = [], {"latency_p50_ms": [], "latency_p99_ms": []}, {}, {}
    for T in sorted({p["tensor_parallel"] for p in pts}):
        for a in dict.fromkeys(p["algorithm"] for p in pts):
            g = [p for p in pts if p["tensor_parallel"] == T and p["algorithm"] == a]
            if not g:
                continue
            labels.append(f"T={T}\n{a.replace('recursive_doubling', 'rec. doubling')}")
            for key in med:
                v = [p[key] for p in g]
                med[key].append(statistics.median(v))
                lo.setdefault(key, []).append(med[key][-1] - min(v))
                hi.setdefault(key, []).append(max(v) - med[key][-1])
    x = range(len(labels))
    for key, dx, color in (("latency_p50_ms", -0.2, "tab:blue"), ("latency_p99_ms", 0.2, "tab:orange")):
        ax.bar([i + dx for i in x], med[key], 0.4, yerr=[lo[key], hi[key]], capsize=2, color=color,
               label=key.split("_")[1])
    ax.set_xticks(list(x), labels, fontsize=7, rotation=30)
    ax.set_ylabel("latency (ms)")
    ax.set_title("one tensor-parallel replica (closed loop), per all-reduce algorithm", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")


def draw(doc, path):
    """Draw the four panels of the study ``doc`` (the parsed results file) into the PNG ``path``."""
    fig, axes = plt.subplots(1, 4, figsize=(22, 6.4), gridspec_kw={"width_ratios": [1.6, 1, 1, 1.2]})
    _policy_panel(axes[0], doc)
    _tp_panel(axes[1], doc)
    _allreduce_panel(axes[2], doc)
    _tp_algorithm_panel(axes[3], doc)
    run = doc.get("run", {})
    fig.suptitle(f"Serving study -- P={run.get('P', '?')}, {' '.join(run.get('mpi_library', '').split())[:40]}, "
                 f"host {run.get('host', '?')}, {doc.get('study', {}).get('repeats', '?')} repeats", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _med(vals, fmt=".0f"):
    vals = [v for v in vals if v is not None]
    return f"{statistics.median(vals):{fmt}}" if vals else ""


def load_table(points):
    """Return part E's markdown table (medians over repeats), or "" when it was not run."""
    pts = [p for p in points if p["part"] == "load"]
    if not pts:
        return ""
    slo = max(p["slo_ms"] for p in pts)
    cells = []
    for f in sorted({p["fraction"] for p in pts}):
        row = [f"{f:.1f}", _med([p["offered_rps"] for p in pts if p["fraction"] == f])]
        for s in (0.0, slo):
            g = [p for p in pts if p["fraction"] == f and p["slo_ms"] == s]
            row += [_med([p["throughput_rps"] for p in g]), _med([p["mean_batch_size"] for p in g], ".2f"),
                    f"{_med([p['latency_p50_ms'] for p in g], '.1f')} / {_med([p['latency_p99_ms'] for p in g], '.1f')}",
                    _med([p["goodput_rps"] for p in g]), _med([p["refused"] for p in g])]
        cells.append(row)
    head = ["load (x capacity)", "offered req/s"]
    for name in ("", f" (slo {slo:g} ms)"):
        head += [f"req/s{name}", f"batch{name}", f"p50 / p99 ms{name}", f"goodput{name}", f"refused{name}"]
    return tabulate(cells, head, tablefmt="pipe", disable_numparse=True, colalign=("left",) + ("right",) * (len(head) - 1))


def _series(pts, key):
    fr = sorted({p["fraction"] for p in pts})
    vals = [[p[key] for p in pts if p["fraction"] == f and p[key] is not None] for f in fr]
    keep = [(f, v) for f, v in zip(fr, vals) if v]
    med = [statistics.median(v) for _, v in keep]
    return ([f for f, _ in keep], med, [[m - min(v) for m, (_, v) in zip(med, keep)],
                                        [max(v) - m for m, (_, v) in zip(med, keep)]])


def draw_load(doc, path):
    """Draw part E of the study ``doc``: throughput, mean batch, p50/p99 and goodput against offered load."""
    pts = [p for p in doc["points"] if p["part"] == "load"]
    cap = doc.get("load_capacity_rps") or pts[0]["capacity_rps"]
    slo = max(p["slo_ms"] for p in pts)
    fig, axes = plt.subplots(1, 4, figsize=(20, 5))
    for s, color in ((0.0, "tab:red"), (slo, "tab:blue")):
        g = [p for p in pts if p["slo_ms"] == s]
        name = f"slo {slo:g} ms" if s else "no objective"
        for ax, key in zip(axes[[0, 1, 3]], ("throughput_rps", "mean_batch_size", "goodput_rps")):
            x, y, err = _series(g, key)
            ax.errorbar(x, y, yerr=err, fmt="-o", color=color, capsize=3, markersize=4, label=name)
        for key, style in (("latency_p99_ms", "-o"), ("latency_p50_ms", "--.")):
            x, y, err = _series(g, key)
            axes[2].errorbar(x, y, yerr=err, fmt=style, color=color, capsize=3, markersize=4,
                             label=f"{name} {'p99' if '99' in key else 'p50'}")
    fr = sorted({p["fraction"] for p in pts})
    axes[0].plot(fr, [min(f, 1.0) * cap for f in fr], ":", color="0.4", label="min(offered, capacity)")
    axes[3].plot(fr, [min(f, 1.0) * cap for f in fr], ":", color="0.4", label="min(offered, capacity)")
    axes[1].axhline(doc.get("study", {}).get("load_max_batch", 8), color="0.4", ls=":", label="largest batch")
    axes[2].axhline(slo, color="0.4", ls=":", label="objective")
    axes[2].set_yscale("log")
    titles = ("throughput (req/s)", "mean batch size (requests)", "latency (ms, log scale)",
              f"goodput: answers within {slo:g} ms per s")
    for ax, title in zip(axes, titles):
        ax.set_xlabel("offered load (x capacity)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    st, run = doc.get("study", {}), doc.get("run", {})
    fig.suptitle(f"One replica, {st.get('load_service_ms', '?')} ms per batch of up to {st.get('load_max_batch', '?')}: "
                 f"capacity {cap:.0f} req/s -- host {run.get('host', '?')}, {st.get('repeats', '?')} repeats "
                 f"(medians, bars: range)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    """Command-line entry point; returns the exit status."""
    p = Parser(prog="python -m plots.serving", description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=infile(), help="serving_study.json written by experiments.studies.serving_study")
    p.add_argument("--out", type=outpath(empty=True), default="", help="PNG to write (default: serving.png beside the results)")
    args = p.parse_args(argv)
    doc = read_results(p, args.results)
    if not isinstance(doc.get("points"), list):
        p.error(f"{args.results}: not a serving study result (no list of points)")
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.results)), "serving.png")
    try:
        draw(doc, out)
        print(f"wrote {out}")
        if any(p["part"] == "load" for p in doc["points"]):
            load = out[:-4] + "_load.png" if out.endswith(".png") else out + "_load.png"
            draw_load(doc, load)
            print(f"wrote {load}")
    except OSError as e:
        p.error(f"--out {out}: cannot write it ({e.strerror or e})")
    except (KeyError, TypeError, ValueError) as e:
        p.error(f"{args.results}: not a serving study result ({e!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

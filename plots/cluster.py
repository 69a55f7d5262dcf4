"""Draw the emulated-cluster studies.

    python -m plots.cluster results/cluster/collectives_study.json [--out FILE.png]
    python -m plots.cluster results/cluster/compression_study.json
    python -m plots.cluster results/cluster/model.json
    python -m plots.cluster results/cluster/ps_study.json

The file's ``study`` key picks the figure. Collectives (``experiments.cluster.node_collectives``): one row
of panels per link rate: all-reduce time per call against size (log-log), each algorithm's speedup
over ``ring`` (median of the passes, bars: their range; above 1 is faster than the flat ring), and the
inter-node busbw as a fraction of the configured link rate. Compression
(``experiments.cluster.compression``): each compressor's step-time speedup over ``none`` and its
time to the target accuracy, per network. Model (``experiments.cluster.model``): predicted against
measured all-reduce time, per algorithm, with the tolerance band. Parameter server
(``experiments.cluster.ps``): samples/s and bytes per link per step of each configuration, one row per
model. Their tables are :mod:`plots.tables.cluster_tables`. Drawing only: every number comes
from the study's file.
"""
import os
import sys

import humanfriendly
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the Agg backend)

from plots.inputs import read_results  # noqa: E402
from matplotlib.ticker import ScalarFormatter  # noqa: E402
from training.settings.options import Parser, infile, outpath

__all__ = ["draw", "draw_compression", "draw_model", "draw_ps", "main"]

_STYLE = {"ring": ("tab:blue", "o"), "rabenseifner": ("tab:orange", "s"), "2d": ("tab:green", "^"),
          "tree": ("tab:red", "v"), "mpi": ("black", "x")}


def draw(study, out):
    """Draw ``study`` (the JSON of ``experiments.cluster.node_collectives``) to the PNG ``out``."""
    rows = study["rows"]
    links = list(dict.fromkeys(r["link"] for r in rows))
    fig, axes = plt.subplots(len(links), 3, figsize=(15, 4.2 * len(links)), squeeze=False)
    for ax_row, link in zip(axes, links):
        s = study["summary"][link]
        mine = [r for r in rows if r["link"] == link]
        algs = [a for a in _STYLE if any(r["algorithm"] == a for r in mine)]
        sizes = sorted({r["bytes"] for r in mine})
        for a in algs:
            rs = sorted((r for r in mine if r["algorithm"] == a), key=lambda r: r["bytes"])
            color, marker = _STYLE[a]
            x = [r["bytes"] for r in rs]
            ax_row[0].plot(x, [r["time_s"] * 1e3 for r in rs], marker=marker, color=color, label=a)
            sp = [r for r in rs if r["speedup_vs_ring"] is not None]
            if a != "ring" and sp:
                y = [r["speedup_vs_ring"] for r in sp]
                err = [[r["speedup_vs_ring"] - r["speedup_min"] for r in sp],
                       [r["speedup_max"] - r["speedup_vs_ring"] for r in sp]]
                ax_row[1].errorbar([r["bytes"] for r in sp], y, yerr=err, marker=marker, color=color, label=a,
                                   capsize=3)
            ut = [r for r in rs if r["utilization"] is not None]
            if ut:
                ax_row[2].plot([r["bytes"] for r in ut], [r["utilization"] for r in ut], marker=marker, color=color,
                               label=a)
        title = f"{link} links, P = {s['P']} ({s['P'] // s['ranks_per_node']} nodes x {s['ranks_per_node']})"
        ax_row[0].set(xscale="log", yscale="log", ylabel="time per all-reduce (ms)", title=title)
        ax_row[1].axhline(1.0, color="tab:blue", lw=1, ls="--")
        ax_row[1].set(xscale="log", ylabel="speedup over ring (x)", title=f"{link}: time(ring) / time(alg)")
        ax_row[2].axhline(1.0, color="grey", lw=1, ls=":")
        ax_row[2].set(xscale="log", ylim=(0, 1.1), ylabel="inter-node busbw / link rate",
                      title=f"{link}: bytes leaving the busiest node / time")
        for ax in ax_row:
            ax.set_xticks(sizes[::2])
            ax.set_xticklabels([humanfriendly.format_size(b, binary=True) for b in sizes[::2]], rotation=30)
            ax.set_xlabel("all-reduce size")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle("All-reduce across emulated nodes (training.emulator.emulate): flat ring vs hierarchical 2d")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def draw_compression(study, out):
    """Draw ``study`` (the JSON of ``experiments.cluster.compression``) to the PNG ``out``."""
    rows, nets = study["rows"], study["networks"]
    specs = list(dict.fromkeys(r["spec"] for r in rows))
    fig, axes = plt.subplots(2, 1, figsize=(14, 8.5), sharex=True)
    reached = any(r["time_to_target_s"] is not None for r in rows)  # else: the accuracy each run ended at
    width = 0.8 / len(nets)
    colors = plt.get_cmap("viridis")([i / max(len(nets) - 1, 1) for i in range(len(nets))])
    for i, (net, color) in enumerate(zip(nets, colors)):
        x = [k + (i - (len(nets) - 1) / 2) * width for k in range(len(specs))]
        rs = [next((r for r in rows if r["network"] == net and r["spec"] == s), None) for s in specs]
        sp = [r["speedup"] if r and r["speedup"] else 0 for r in rs]
        err = [[max(v - (r["speedup_min"] or v), 0) if r else 0 for v, r in zip(sp, rs)],
               [max((r["speedup_max"] or v) - v, 0) if r else 0 for v, r in zip(sp, rs)]]
        axes[0].bar(x, sp, width, yerr=err, color=color, label=net, capsize=2)
        if not reached:
            axes[1].bar(x, [100 * r["final_test_acc"] if r else 0 for r in rs], width, color=color, label=net)
            continue
        tt = [r["time_to_target_s"] if r and r["time_to_target_s"] is not None else 0 for r in rs]
        axes[1].bar(x, tt, width, color=color, label=net)
        for xi, r in zip(x, rs):
            if r and r["time_to_target_s"] is None:
                axes[1].text(xi, 0.02, "x", ha="center", va="bottom", color=color, fontsize=11, fontweight="bold",
                             transform=axes[1].get_xaxis_transform())
    axes[0].axhline(1.0, color="grey", ls="--", lw=1)
    axes[0].set(ylabel="step-time speedup over none (x)", yscale="log",
                title="step time: per-epoch ratios, median and range (4 nodes x 1 rank)")
    if reached:
        axes[1].set(ylabel=f"wall s to {study['target']:.0%} test accuracy", yscale="log",
                    title="time to accuracy (x: not reached in the run)")
    else:
        accs = [100 * r["final_test_acc"] for r in rows if r.get("final_test_acc") is not None]
        axes[1].set(ylabel="test accuracy at the end (%)", ylim=(min(accs) - 2, max(accs) + 1),
                    title=f"test accuracy at the end of the run (no run reached the {study['target']:.0%} target)")
    axes[1].set_xticks(range(len(specs)))
    axes[1].set_xticklabels(specs, rotation=35, ha="right")
    for ax in axes if reached else axes[:1]:
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
    for ax in axes:
        ax.grid(True, axis="y", which="both", alpha=0.3)
    axes[0].legend(fontsize=9)  # the same colours below
    fig.suptitle("Gradient compression on emulated links against shared memory (training.emulator.emulate)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def draw_model(study, out):
    """Draw ``study`` (the JSON of ``experiments.cluster.model``) to the PNG ``out``."""
    models = list(study["models"])
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 5.5), squeeze=False)
    tol = study["tolerance"]
    for ax, name in zip(axes[0], models):
        m = study["models"][name]
        rs = [r for r in study["rows"] if r["model"] == name]
        for alg in dict.fromkeys(r["algorithm"] for r in rs):
            color, marker = _STYLE.get(alg, ("tab:purple", "D"))
            mine = [r for r in rs if r["algorithm"] == alg]
            ax.scatter([r["measured_s"] * 1e3 for r in mine], [r["predicted_s"] * 1e3 for r in mine],
                       color=color, marker=marker, label=alg)
        lo = min(min(r["measured_s"], r["predicted_s"]) for r in rs) * 1e3 * 0.8
        hi = max(max(r["measured_s"], r["predicted_s"]) for r in rs) * 1e3 * 1.25
        ax.plot([lo, hi], [lo, hi], color="grey", lw=1)
        ax.fill_between([lo, hi], [lo * (1 - tol), hi * (1 - tol)], [lo * (1 + tol), hi * (1 + tol)],
                        color="grey", alpha=0.15, label=f"within {tol:.0%}")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured ms",
               ylabel="predicted ms",
               title=f"{name} links: {m['hits']} of {m['points']} within {tol:.0%} "
                     f"(alpha {m['alpha_inter'] * 1e6:.0f} us, {1 / m['beta_inter'] / 1e6:.0f} MB/s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Two-level simulator fitted on 2x2 and 4x1, predicting 4x2 all-reduce (emulated 1 Gbit/s)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def draw_ps(study, out):
    """Draw ``study`` (the JSON of ``experiments.cluster.ps``) to the PNG ``out``: one row of panels per model."""
    models = study.get("models") or {"": {}}
    link = study.get("link", "1gbit")
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 4.5 * len(models)), squeeze=False)
    for ax_row, name in zip(axes, models):
        rows = [r for r in study["rows"] if r.get("model", "") == name]
        names = [r["config"] for r in rows]
        label = f"{name}, " if name else ""
        y = [r["samples_per_s"] for r in rows]
        err = [[v - r["samples_min"] for v, r in zip(y, rows)], [r["samples_max"] - v for v, r in zip(y, rows)]]
        colors = ["tab:blue" if n == "dp-ring" else "tab:orange" for n in names]
        ax_row[0].bar(names, y, yerr=err, color=colors, capsize=4)
        ax_row[0].set(ylabel="samples / s (median, range of repeats)", title=f"{label}throughput at {link}, 4 workers")
        x = range(len(rows))
        ax_row[1].bar([i - 0.2 for i in x], [r["busiest_link_bytes"] / 1e3 for r in rows], 0.4, label="busiest link")
        ax_row[1].bar([i + 0.2 for i in x], [r["worker_link_bytes"] / 1e3 for r in rows], 0.4,
                      label="a worker's link")
        ax_row[1].set_xticks(list(x))
        ax_row[1].set_xticklabels(names)
        ax_row[1].set(ylabel="KB per step, each direction", title=f"{label}bytes per link per step (protocol)")
        ax_row[1].legend()
        for ax in ax_row:
            ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("BSP parameter server (S servers on their own nodes) against ring all-reduce (training.emulator.emulate)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None):
    """Read the study's JSON and write the PNG; return the exit status."""
    p = Parser(prog="python -m plots.cluster", description=__doc__.split("\n")[0])
    p.add_argument("study", type=infile(), help="a results JSON of experiments.cluster.node_collectives, .compression, .model "
                   "or .ps")
    p.add_argument("--out", type=outpath(empty=True), default="", help="PNG path (default: beside the JSON, .png)")
    a = p.parse_args(argv)
    study = read_results(p, a.study)
    out = a.out or os.path.splitext(a.study)[0] + ".png"
    kind = study.get("study", "")
    try:
        {"experiments.cluster.compression": draw_compression, "experiments.cluster.model": draw_model,
         "experiments.cluster.ps": draw_ps}.get(kind, draw)(study, out)
    except (KeyError, TypeError, IndexError) as exc:
        p.error(f"{a.study}: not a results file of the cluster studies (missing {exc!r})")
    except OSError as exc:
        p.error(f"--out {out}: {exc.strerror or exc}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Draw the staleness study: test accuracy against wall time per protocol, and the staleness
histogram of every protocol.

    python -m plots.staleness results/staleness/staleness_sweep.json [--out FILE.png]

Also accepts the ``summary.json`` of single ``--mode ps`` runs (one curve and histogram each).
"""
import argparse
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the Agg backend)
from matplotlib.ticker import MaxNLocator  # noqa: E402

__all__ = ["load_runs", "draw", "main"]


def load_runs(paths):
    """Return ``(runs, meta)`` from sweep results files and/or run summaries.

    Parameters
    ----------
    paths : list of str
        ``staleness_sweep.json`` files (all their runs) or ``summary.json`` files of PS runs.

    Returns
    -------
    runs : list of dict
        Each with ``label``, ``curve`` (``wall_s``, ``test_acc``), ``staleness_histogram``,
        ``updates_per_s``, ``final_test_acc`` and ``repeat``.
    meta : dict
        ``run`` information (MPI library, P, host) and the straggler of the first file.

    Raises
    ------
    ValueError
        When a file is neither a sweep result nor a parameter-server summary.
    """
    runs, meta = [], {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if "runs" in data:
            meta.setdefault("run", data.get("run", {}))
            meta.setdefault("straggler", data.get("train_config", {}).get("straggler", ""))
            for r in data["runs"]:
                runs.append(dict(r, label=_label(r["consistency"], r["staleness_bound"])))
        elif data.get("mode") == "ps":
            meta.setdefault("run", data.get("run", {}))
            meta.setdefault("straggler", data.get("straggler", ""))
            runs.append(dict(data, repeat=0, label=_label(data["consistency"], data["staleness_bound"])))
        else:
            raise ValueError(f"{path}: not a staleness sweep result nor a --mode ps summary.json")
    if not runs:
        raise ValueError("no runs in the given files")
    return runs, meta


def _label(consistency, s):
    return f"SSP s={s}" if consistency == "ssp" else consistency.upper()


def draw(runs, meta, path):
    """Draw accuracy-versus-time curves and staleness histograms of ``runs`` into the PNG ``path``."""
    labels = list(dict.fromkeys(r["label"] for r in runs))
    colors = {lab: plt.get_cmap("viridis")(i / max(1, len(labels) - 1)) for i, lab in enumerate(labels)}
    colors.update({lab: c for lab, c in (("BSP", "black"), ("ASP", "tab:red")) if lab in colors})
    n = len(labels)
    fig = plt.figure(figsize=(14, 5.5 + 1.6 * ((n + 2) // 3)))
    grid = fig.add_gridspec(2, 3, height_ratios=[3, 1.4 * ((n + 2) // 3)], hspace=0.35)
    ax = fig.add_subplot(grid[0, :])
    for lab in labels:
        group = [r for r in runs if r["label"] == lab]
        rates = sorted(r["updates_per_s"] for r in group)
        median = statistics.median(rates)
        typical = min(group, key=lambda r: abs(r["updates_per_s"] - median))  # drawn bold
        for r in group:
            bold = r is typical
            ax.plot([p["wall_s"] for p in r["curve"]], [100 * p["test_acc"] for p in r["curve"]],
                    color=colors[lab], linewidth=1.8 if bold else 0.7, alpha=1.0 if bold else 0.35,
                    zorder=3 if bold else 2,
                    label=(f"{lab}: {median:.0f} updates/s" + (f" (median of {len(group)})" if len(group) > 1
                                                               else "")) if bold else None)
    ax.axhline(95, color="0.5", linestyle="--", linewidth=1)
    ax.text(min(p["wall_s"] for r in runs for p in r["curve"]), 95.2, "95 %", color="0.4", va="bottom")
    ax.set_ylim(max(0, min(100 * p["test_acc"] for r in runs for p in r["curve"][:1] or [{"test_acc": 0}]) - 5),
                100)
    ax.set_xscale("log")
    ax.set_xlabel("wall time since start (s, log scale)")
    ax.set_ylabel("test accuracy (%)")
    run = meta.get("run", {})
    mpi = " ".join(run.get("mpi_library", "").split())[:40]
    ax.set_title(f"Parameter server, straggler {meta.get('straggler') or 'none'} (RANK:FACTOR): test accuracy "
                 f"vs wall time -- P={run.get('P', '?')}, {mpi}, host {run.get('host', '?')}", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    sub = grid[1, :].subgridspec((n + 2) // 3, 3, hspace=0.9, wspace=0.25)
    for i, lab in enumerate(labels):
        h = fig.add_subplot(sub[i // 3, i % 3])
        hist = {}
        for r in runs:
            if r["label"] == lab:
                for k, v in r["staleness_histogram"].items():
                    hist[int(k)] = hist.get(int(k), 0) + v
        total = sum(hist.values()) or 1
        keys = sorted(hist)
        h.bar(keys, [100 * hist[k] / total for k in keys], width=0.9 if len(keys) < 30 else 1.0,
              color=colors[lab])
        h.set_title(f"{lab}: staleness of served pulls (max {max(keys, default=0)})", fontsize=9)
        h.set_xlabel("staleness (clocks)", fontsize=8)
        h.set_ylabel("% of pulls", fontsize=8)
        h.tick_params(labelsize=7)
        h.xaxis.set_major_locator(MaxNLocator(integer=True))
        kmax = max(2, max(keys, default=0))
        h.set_xlim(-0.6 - 0.02 * kmax, kmax + 0.6)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    """Command-line entry point: read the results, draw the PNG, print its path."""
    parser = argparse.ArgumentParser(prog="python -m plots.staleness", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="staleness_sweep.json or --mode ps summary.json files")
    parser.add_argument("--out", help="PNG file (default: staleness.png beside the first results file)")
    args = parser.parse_args(argv)
    try:
        runs, meta = load_runs(args.results)
    except (OSError, ValueError, KeyError) as e:
        parser.error(str(e))
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.results[0])), "staleness.png")
    draw(runs, meta, out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Draw the three-level study (``experiments.cluster.levels``): measured and predicted all-reduce time.

    python -m plots.levels results/cluster3/levels.json [--out FILE.png]

:func:`markdown` renders the study's tables. One row of panels per link rate: each algorithm's measured time per call against size (markers: the
median of the passes, bars: their range) with the fitted model's prediction (dashed line), and the
prediction over the measured time per point with the tolerance band. Drawing only: every number comes
from the study's file.
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the Agg backend)

from plots.inputs import read_results  # noqa: E402
from training.settings.options import Parser, infile, outpath

__all__ = ["draw", "markdown", "main"]

_STYLE = {"ring": ("tab:blue", "o"), "rabenseifner": ("tab:orange", "s"), "2d": ("tab:green", "^"),
          "torus": ("tab:purple", "D"), "mpi": ("black", "x"), "tree": ("tab:red", "v")}


def draw(study, out):
    """Draw ``study`` (the JSON of ``experiments.cluster.levels``) to the PNG ``out``; return ``out``."""
    rates = list(study["rates"])
    tol = study["tolerance"]
    fig, axes = plt.subplots(len(rates), 2, figsize=(13, 4.4 * len(rates)), squeeze=False)
    for (ax_t, ax_e), rate in zip(axes, rates):
        mine = [r for r in study["rows"] if r["rate"] == rate]
        layout = study["rates"][rate]["layout"]
        for alg in [a for a in _STYLE if any(r["algorithm"] == a for r in mine)]:
            rs = sorted((r for r in mine if r["algorithm"] == alg), key=lambda r: r["bytes"])
            color, marker = _STYLE[alg]
            x = [r["bytes"] for r in rs]
            y = [r["measured_s"] * 1e3 for r in rs]
            err = [[(r["measured_s"] - r["measured_min_s"]) * 1e3 for r in rs],
                   [(r["measured_max_s"] - r["measured_s"]) * 1e3 for r in rs]]
            ax_t.errorbar(x, y, yerr=err, color=color, marker=marker, ls="none", capsize=2,
                          label=f"{alg} measured")
            ax_t.plot(x, [r["predicted_s"] * 1e3 for r in rs], color=color, ls="--", lw=1, label=f"{alg} model")
            ax_e.plot(x, [r["predicted_s"] / r["measured_s"] for r in rs], color=color, marker=marker, lw=1,
                      label=alg)
        mpi = study["rates"][rate].get("mpi_measured_s", {})
        if mpi:
            x = sorted(int(n) for n in mpi)
            ax_t.plot(x, [mpi[str(n)] * 1e3 for n in x], color="black", marker="x", ls="none", label="mpi measured")
        for ax in (ax_t, ax_e):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("all-reduce size (bytes)")
            ax.grid(alpha=0.3, which="both")
        ax_t.set_yscale("log")
        ax_t.set_ylabel("time per call (ms)")
        ax_t.set_title(f"{layout} (racks x nodes x ranks), {rate} links and uplinks")
        ax_t.legend(fontsize=7, ncol=2)
        ax_e.axhspan(1 - tol, 1 + tol, color="0.9", label=f"within {tol:.0%}")
        ax_e.axvline(study["score_bytes"], color="0.5", ls=":", lw=1)
        ax_e.set_ylabel("predicted / measured")
        ax_e.set_title(f"model error ({study['rates'][rate]['fitted']['hits']} of "
                       f"{study['rates'][rate]['fitted']['points']} scored points within {tol:.0%})")
        ax_e.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def markdown(result):
    """Return the study's tables (fit, scores, torus speedup, per-point predictions) as Markdown."""
    from tabulate import tabulate

    i = result["intra"]
    lines = [f"Intra-node (shared memory, fitted): alpha {i['alpha_intra'] * 1e6:.1f} us, "
             f"{1 / i['beta_intra'] / 1e9:.2f} GB/s, reduction {1 / i['gamma'] / 1e9:.2f} GB/s per core "
             f"(rms log error {i['rms_log_error']:.2f}); {result['cores']} cores.", ""]
    cells = []
    for rate, s in result["rates"].items():
        f, c = s["fit"], s["calibration"]
        sc, co = s["fitted"], s["calibration_only"]
        cells.append([rate, f"{c['alpha_node'] * 1e6:.0f} / {f['alpha_node'] * 1e6:.0f}",
                      f"{8 / c['beta_node'] / 1e6:.0f} / {8 / f['beta_node'] / 1e6:.0f}",
                      f"{8 / c['beta_rack'] / 1e6:.0f} / {8 / f['beta_rack'] / 1e6:.0f}",
                      f"{sc['hits']} / {sc['points']} ({sc['fraction']:.0%})",
                      f"{co['hits']} / {co['points']} ({co['fraction']:.0%})"])
    lines.append(tabulate(cells, headers=("links", "node latency us (calibrated / fitted)",
                                          "node link Mbit/s (cal. / fit)", "uplink Mbit/s (cal. / fit)",
                                          "within tolerance, fitted", "within tolerance, calibration only"),
                          tablefmt="pipe", disable_numparse=True))
    lines.append("")
    sizes = sorted({r["bytes"] for r in result["rows"]})
    algs = list(dict.fromkeys(r["algorithm"] for r in result["rows"]))
    for rate in result["rates"]:
        mine = {(r["algorithm"], r["bytes"]): r for r in result["rows"] if r["rate"] == rate}
        sp = result["rates"][rate]["torus_speedup"]
        mpi = result["rates"][rate].get("mpi_measured_s", {})
        cells = []
        for n in sizes:
            if not any(k[1] == n for k in mine):
                continue
            row = [f"{n >> 10} KiB" if n < 1 << 20 else f"{n >> 20} MiB"]
            for alg in algs:
                r = mine.get((alg, n))
                row.append("" if r is None else f"{r['measured_s'] * 1e3:.1f} / {r['predicted_s'] * 1e3:.1f} "
                                                f"({r['rel_error']:+.0%})")
            s = sp.get(str(n))
            row.append("" if s is None else f"{s[0]:.2f}x ({s[1]:.2f}-{s[2]:.2f})")
            row.append("" if str(n) not in mpi else f"{mpi[str(n)] * 1e3:.1f}")
            cells.append(row)
        lines.append(f"{rate}, layout {result['rates'][rate]['layout']}: measured / predicted ms (error)")
        lines.append("")
        lines.append(tabulate(cells, headers=("size", *algs, "torus over ring", "mpi (measured)"), tablefmt="pipe",
                              disable_numparse=True))
        lines.append("")
    return "\n".join(lines).rstrip()


def main(argv=None):
    """Draw the figure of a study file; return the exit status."""
    p = Parser(prog="python -m plots.levels", description=__doc__.split("\n\n")[0])
    p.add_argument("study", type=infile(), help="results JSON of experiments.cluster.levels")
    p.add_argument("--out", type=outpath(empty=True), default="", help="PNG to write (default: beside the study, .png)")
    a = p.parse_args(argv)
    study = read_results(p, a.study)
    out = a.out or a.study.rsplit(".", 1)[0] + ".png"
    print(f"wrote {draw(study, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Draw and tabulate the predictor's results: the at-scale answer of ``training.predict.scale`` (best
and second-best step time against P) and the validation of ``training.predict.validate`` (predicted
against measured step time).

Run: ``python -m plots.predict results/predict/scale.json [--out results/predict/scale.png]`` (a validation
file draws the validation figure).
"""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from plots.inputs import read_results
from training.settings.options import Parser, infile, outpath
from training.predict.scale import scale_table

__all__ = ["draw", "scale_markdown", "draw_validation", "validation_table", "main"]


def draw(result, out):
    """Write one panel per cluster to ``out``: the best and second-best predicted step time (ms, log
    scale) against P (log2 axis), each point labelled with its configuration."""
    best = result["best"]
    clusters = list(dict.fromkeys(b["cluster"] for b in best))
    fig, axes = plt.subplots(1, len(clusters), figsize=(5.6 * len(clusters), 4.6), squeeze=False,
                             constrained_layout=True)
    for ax, name in zip(axes[0], clusters):
        pts = sorted((b for b in best if b["cluster"] == name), key=lambda b: b["P"])
        ps = [b["P"] for b in pts]
        ax.plot(ps, [b["best_s"] * 1e3 for b in pts], "o-", label="best")
        ax.plot(ps, [b["second_s"] * 1e3 for b in pts], "s--", label="second best")
        for b in pts:
            ax.annotate(b["best"], (b["P"], b["best_s"] * 1e3), textcoords="offset points", xytext=(0, -12),
                        ha="center", fontsize=6)
            ax.annotate(b["second"], (b["P"], b["second_s"] * 1e3), textcoords="offset points", xytext=(0, 6),
                        ha="center", fontsize=6, color="C1")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.margins(x=0.18, y=0.12)  # room for the labels of the first and last points
        ax.set_xticks(ps, [str(p) for p in ps])
        ax.set_xlabel("ranks P")
        ax.set_ylabel("predicted step time (ms)")
        ax.set_title(name)
        ax.legend(fontsize=8)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def scale_markdown(record):
    """Return the at-scale answer as markdown: :func:`training.predict.scale.scale_table` of ``record["best"]`` and how many
    configurations each point compared."""
    n = sorted({b["configs"] for b in record["best"]})
    return (f"Configurations compared per cluster and P: {n[0]}-{n[-1]} (those that fit the P). Predicted, not "
            "measured.\n\n" + scale_table(record["best"]).rstrip("\n"))


def validation_table(record):
    """Return the validation's markdown: every configuration (measured median and range over its runs,
    predicted, error, predicted communication share) and the three figures against their targets."""
    lines = ["| configuration | measured ms | run-to-run range ms | predicted ms | error | communication |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in record["rows"]:
        rng = "-" if r["range_s"] is None else f"{r['range_s'] * 1e3:.1f}"  # one run: no range
        lines.append(f"| {r['name']} | {r['measured_s'] * 1e3:.1f} | {rng} | "
                     f"{r['predicted_s'] * 1e3:.1f} | {r['error']:+.0%} | {r['comm_s'] / r['predicted_s']:.0%} |")
    f, t = record["figures"], record["targets"]
    heavy = "none" if f["within15_comm_heavy"] is None else f"{f['within15_comm_heavy']:.0%}"
    tau = "no pair" if f["kendall_tau"] is None else f"{f['kendall_tau']:.2f} over {f['pairs']} pairs"
    head = (f"Within 15 % among the {f['comm_heavy']} configurations whose predicted communication is at least "
            f"half the step: **{heavy}** (target {t['within15_comm_heavy']:.0%}); within 25 % over all "
            f"{len(record['rows'])}: **{f['within25_all']:.0%}** (target {t['within25_all']:.0%}); Kendall's tau: "
            f"**{tau}** (target {t['kendall_tau']:g}). Beyond 25 %: {', '.join(f['misses']) or 'none'}.")
    if f.get("failed"):
        head += f" Failed to run: {', '.join(f['failed'])}."
    runs, cals = record.get("provenance_of_reused_runs"), f.get("calibrations") or {}
    if runs:  # predicted again from kept runs: say when those were measured, and the calibrations
        load = runs.get("load") or {}
        dates = sorted({(c.get("date") or "?")[:10] for c in cals.values()})
        lines += ["", f"The runs were measured by `{runs['command']}` on {runs['date'][:10]} (load average "
                      f"{load.get('before', float('nan')):.2f} before and {load.get('during_max', float('nan')):.2f} "
                      f"at most during: the runs' own 8 ranks)"
                      + (f"; the four layouts' calibrations on {', '.join(dates)}." if dates else ".")]
    return head + "\n\n" + "\n".join(lines)


def draw_validation(record, out):
    """Write predicted against measured step time (ms, log-log; run-to-run range as error bars) with the
    15 % and 25 % bands to ``out``, one colour per layout and link."""
    fig, ax = plt.subplots(figsize=(6.4, 5.6), constrained_layout=True)
    layouts = list(dict.fromkeys("-".join(r["name"].split("-")[:2]) for r in record["rows"]))  # "2x2x2-1gbit"
    for i, lay in enumerate(layouts):
        rows = [r for r in record["rows"] if r["name"].startswith(lay + "-")]
        x = [r["measured_s"] * 1e3 for r in rows]
        lo = [(r["measured_s"] - min(r["measured"])) * 1e3 for r in rows]
        hi = [(max(r["measured"]) - r["measured_s"]) * 1e3 for r in rows]
        ax.errorbar(x, [r["predicted_s"] * 1e3 for r in rows], xerr=[lo, hi], fmt="o", color=f"C{i}",
                    capsize=2, label=lay)
    every = [r["measured_s"] * 1e3 for r in record["rows"]] + [r["predicted_s"] * 1e3 for r in record["rows"]]
    line = [min(every) * 0.8, max(every) * 1.25]
    ax.plot(line, line, "k-", lw=0.8, label="predicted = measured")
    for k, style in ((0.15, "--"), (0.25, ":")):
        ax.plot(line, [v * (1 + k) for v in line], "k" + style, lw=0.6, label=f"+/- {k:.0%}")
        ax.plot(line, [v * (1 - k) for v in line], "k" + style, lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (ms, median over runs; bars: run-to-run range)")
    ax.set_ylabel("predicted step time (ms)")
    ax.set_title("predictor against the emulated cluster")
    ax.legend(fontsize=7)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = Parser(prog="python -m plots.predict", description=__doc__.split("\n")[0])
    p.add_argument("result", type=infile(), help="OUT.json of training.predict.scale or training.predict.validate")
    p.add_argument("--out", type=outpath(empty=True), default="", help="PNG path (default: the result's path with .png)")
    a = p.parse_args(argv)
    result = read_results(p, a.result)
    out = a.out or a.result.rsplit(".", 1)[0] + ".png"
    try:
        (draw_validation if "figures" in result else draw)(result, out)
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as exc:
        p.error(f"{a.result}: not a results file of training.predict.scale or .validate "
                f"({type(exc).__name__}: {exc})")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

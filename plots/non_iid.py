"""Draw the non-IID study: test accuracy against label skew, one line per method (median, range over
seeds), one panel per worker count; and its table (accuracy, time to target, bytes per sample).

    python -m plots.non_iid results/non_iid/non_iid_w4_dp.json results/non_iid/non_iid_w4_ps.json [--out FILE.png]

Several results files (data-parallel and parameter-server launches, several worker counts) are drawn
together; the partitions keep the order the studies ran them in (which is not an order of skew:
``classes:k=5`` comes after ``dirichlet:alpha=0.1``).
"""
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the Agg backend)
from tabulate import tabulate  # noqa: E402

from plots.inputs import read_results  # noqa: E402
from training.settings.options import Parser, infile, outpath

__all__ = ["rows_by_workers", "draw", "markdown", "main"]

#: Line style and marker per remedy (the colour is the base method's).
_LINES = {"": "-", "resample": "--", "shared": ":"}
_MARKS = {"": "o", "resample": "s", "shared": "^"}


def rows_by_workers(results):
    """Return {W: (skews in order, {method: {skew: row}})} from one or several results files.

    Examples
    --------
    >>> row = {"method": "bsp", "skew": "iid", "accuracy": 0.9, "accuracy_min": 0.89, "accuracy_max": 0.92,
    ...        "time_to_target_s": None, "bytes_per_sample": 1205.0}
    >>> rows_by_workers({"workers": 4, "skews": ["iid"], "table": [row]})[4][0]
    ['iid']
    >>> print(markdown({"workers": 4, "skews": ["iid"], "table": [row]}).splitlines()[4])
    | bsp      | 90.0 (89.0-92.0), never |             1205 |
    """
    out = {}
    for res in ([results] if isinstance(results, dict) else results):
        skews, methods = out.setdefault(res["workers"], ([], {}))
        for s in res["skews"]:
            if s not in skews:
                skews.append(s)
        for row in res["table"]:
            methods.setdefault(row["method"], {})[row["skew"]] = row
    return dict(sorted(out.items()))


def draw(results, out):
    """Draw accuracy against skew (one panel per worker count) into ``out`` (PNG); return ``out``.

    Parameters
    ----------
    results : dict or list of dict
        Results files of :mod:`experiments.studies.non_iid_study`.
    out : str
        The PNG to write.
    """
    groups = rows_by_workers(results)
    fig, axs = plt.subplots(1, len(groups), figsize=(7.5 * len(groups), 5.5), squeeze=False)
    for ax, (W, (skews, methods)) in zip(axs[0], groups.items()):
        xs = range(len(skews))
        bases = list(dict.fromkeys(name.split("+")[0] for name in methods))
        for k, (name, by_skew) in enumerate(methods.items()):
            pts = [(x, by_skew[s]) for x, s in zip(xs, skews) if s in by_skew]
            x = [p[0] + (k - len(methods) / 2) * 0.015 for p in pts]  # a small offset: the ranges stay apart
            med = [100 * p[1]["accuracy"] for p in pts]
            err = [[m - 100 * p[1]["accuracy_min"] for m, p in zip(med, pts)],
                   [100 * p[1]["accuracy_max"] - m for m, p in zip(med, pts)]]
            base, _, remedy = name.partition("+")
            ax.errorbar(x, med, yerr=err, marker=_MARKS.get(remedy, "o"), ms=4, capsize=3,
                        ls=_LINES.get(remedy, "-."), color=plt.get_cmap("tab10")(bases.index(base) % 10), label=name)
        ax.set(xticks=list(xs), xticklabels=[s.replace(":", "\n") for s in skews], xlabel="partition",
               ylabel="test accuracy after a fixed number of samples (%)", title=f"W = {W} workers")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, ncol=2)
    fig.suptitle("digits, median and range over seeds; colour: method, dashed: +resample, dotted: +shared")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def markdown(results):
    """Return the study's tables as Markdown, one per worker count: a row per method, a column per
    partition holding the test accuracy % (median, min-max over seeds) and the time to the target
    accuracy (s, median; "never" when a seed did not reach it) with the epochs trained by then (median;
    files that record them), and the bytes each rank sent per sample. The heading names the target of
    the files that record it (``--target``)."""
    parts = []
    files = [results] if isinstance(results, dict) else results
    targets = sorted({res["study"]["target"] for res in files if "target" in res.get("study", {})})
    target = " / ".join(f"{100 * t:g} %" for t in targets) or "target"
    for W, (skews, methods) in rows_by_workers(results).items():
        cells = []
        for name, by_skew in methods.items():
            row = [name]
            for s in skews:
                r = by_skew.get(s)
                if r is None:
                    row.append("")
                    continue
                ttt = "never" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.2f} s"
                if r.get("epochs_to_target") is not None:
                    ttt += f" (epoch {r['epochs_to_target']:g})"
                row.append(f"{100 * r['accuracy']:.1f} ({100 * r['accuracy_min']:.1f}-{100 * r['accuracy_max']:.1f}), "
                           f"{ttt}")
            sent = [r["bytes_per_sample"] for r in by_skew.values() if r.get("bytes_per_sample") is not None]
            row.append(f"{max(sent):.0f}" if sent else "")
            cells.append(row)
        parts.append(f"W = {W} workers: test accuracy % (range over seeds), time to {target}\n\n"
                     + tabulate(cells, ["method", *skews, "bytes / sample"], tablefmt="pipe", disable_numparse=True,
                                colalign=("left", *["right"] * (len(skews) + 1))))
    return "\n\n".join(parts)


def main(argv=None):
    p = Parser(prog="python -m plots.non_iid", description="Draw the non-IID study (results -> PNG).")
    p.add_argument("results", type=infile(), nargs="+", help="results files of experiments.studies.non_iid_study")
    p.add_argument("--out", type=outpath(empty=True), help="PNG to write (default: non_iid.png beside the first results file)")
    args = p.parse_args(argv)
    results = [read_results(p, path) for path in args.results]
    out = args.out or os.path.join(os.path.dirname(args.results[0]), "non_iid.png")
    try:
        print(markdown(results))
        print(draw(results, out))
    except (KeyError, TypeError, IndexError, AttributeError) as exc:
        p.error(f"not a results file of experiments.studies.non_iid_study (missing {exc!r})")
    except OSError as exc:
        p.error(f"--out {out}: {exc.strerror or exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

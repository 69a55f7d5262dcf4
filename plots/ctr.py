"""Draw the ctr study: bytes per worker link per step and samples/s of dp, ps and hybrid against the table's rows.

    python -m plots.ctr results/cluster/ctr_study.json [--out FILE.png]

Reads the file :mod:`experiments.cluster.ctr` writes (``report``). Left: measured bytes per worker link and step
(markers) and the bytes the protocols predict (lines); right: samples per second, median of the runs with
their range as error bars, one line per mode and link, and the predicted ratio of dp's to hybrid's bytes on
the busiest link (dotted, right axis).
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the Agg backend)
from plots.inputs import read_results
from training.settings.options import Parser, infile, outpath

__all__ = ["draw", "markdown", "main"]


def draw(record, out):
    """Draw ``record`` (the study's JSON) into the PNG file ``out``; return ``out``."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    links = sorted({p["link"] for p in record["points"]})
    for m, mode in enumerate(("dp", "ps", "hybrid")):
        for link in links:
            pts = sorted((p for p in record["points"] if p["mode"] == mode and p["link"] == link),
                         key=lambda p: p["rows"])
            if not pts:
                continue
            x = [p["rows"] for p in pts]
            if link == links[0]:  # bytes do not depend on the link: one series per mode
                a.plot(x, [p["bytes_per_step"] for p in pts], "o", color=f"C{m}", label=f"{mode} measured")
                a.plot(x, [p["predicted_bytes"] for p in pts], "-", color=f"C{m}", alpha=0.5,
                       label=f"{mode} predicted")
            med = [p["samples_per_s"][0] for p in pts]
            err = [[m - p["samples_per_s"][1] for m, p in zip(med, pts)], [p["samples_per_s"][2] - m for m, p in zip(med, pts)]]
            b.errorbar(x, med, yerr=err, marker="os^"[m], capsize=3, color=f"C{m}", ls="-" if link == links[0] else "--",
                       label=f"{mode}, {link}")
    if record.get("busiest_ratio_dp_over_hybrid"):  # the busiest link's bytes, from the counted distinct rows
        ratio = sorted((int(n), r) for n, r in record["busiest_ratio_dp_over_hybrid"].items())
        c = b.twinx()
        c.plot([n for n, _ in ratio], [r for _, r in ratio], "k:", lw=1, label="predicted busiest-link bytes, dp / hybrid")
        c.set_yscale("log")
        c.set_ylabel("dp / hybrid bytes on the busiest link (dotted)")
    if record.get("predicted_crossing_rows"):
        a.axvline(record["predicted_crossing_rows"], color="grey", ls=":", label="predicted crossing")
    for ax, title in ((a, "bytes per worker link per step"), (b, "samples/s (median, range)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("embedding rows (all tables)")
        ax.set_title(title)
    a.legend(fontsize=7)
    handles, labels = b.get_legend_handles_labels()
    if record.get("busiest_ratio_dp_over_hybrid"):
        more = c.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    b.legend(handles, labels, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    fig.tight_layout()
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out


def _crossing(points, link, key):
    """The smallest row count at which hybrid beats dp on ``key`` (fewer bytes, more samples/s), or None."""
    by = {(p["mode"], p["rows"]): p for p in points if p["link"] == link}
    for n in sorted({p["rows"] for p in points}):
        dp, hy = by.get(("dp", n)), by.get(("hybrid", n))
        if dp and hy and (hy["bytes_per_step"] < dp["bytes_per_step"] if key == "bytes"
                          else hy["samples_per_s"][0] > dp["samples_per_s"][0]):
            return n
    return None


def markdown(record):
    """Return the study's markdown: per link, rows and mode, samples/s (median, range), measured and
    predicted megabytes per worker link per step, and test AUC; then the predicted and measured crossings."""
    from tabulate import tabulate

    cells = []
    for p in sorted(record["points"], key=lambda p: (p["link"], p["rows"], ("dp", "ps", "hybrid").index(p["mode"]))):
        med, lo, hi = p["samples_per_s"]
        cells.append([p["link"], f"{p['rows']:,}", p["mode"], f"{med:,.0f} ({lo:,.0f}-{hi:,.0f})",
                      f"{p['bytes_per_step'] / 1e6:.3f}", f"{p['predicted_bytes'] / 1e6:.3f}", f"{p['test_auc']:.4f}", f"{p['best_auc']:.4f}"])
    table = tabulate(cells, headers=("link", "rows", "mode", "samples/s", "MB/step measured", "MB/step predicted",
                                     "test AUC", "planted AUC"), tablefmt="pipe", disable_numparse=True,
                     colalign=("left", "right", "left", "right", "right", "right", "right", "right"))
    links = sorted({p["link"] for p in record["points"]})
    said = []
    for link in links:
        b, r = _crossing(record["points"], link, "bytes"), _crossing(record["points"], link, "rate")
        said.append(f"{link}: hybrid moves fewer bytes than dp from {f'{b:,}' if b else 'none of the'} rows "
                    f"measured and is faster from {f'{r:,}' if r else 'none of the'} rows")
    pred = record.get("predicted_crossing_rows")
    ratio = sorted((int(n), r) for n, r in record.get("busiest_ratio_dp_over_hybrid", {}).items())
    if pred:
        bytes_said = f"Predicted crossing by the busiest link's bytes: {pred:,.0f} rows."
    else:
        lo, hi = ratio[0], ratio[-1]
        bytes_said = (f"By bytes hybrid's busiest link never carries more than dp's: dp / hybrid from {lo[1]:.2f}x at "
                      f"{lo[0]:,} rows to {hi[1]:,.0f}x at {hi[0]:,} rows (distinct rows per worker batch counted "
                      f"from the data).")
    runs = sorted({p["runs"] for p in record["points"]})
    head = (bytes_said + " Measured: " + "; ".join(said) + f". Runs per point: {'-'.join(map(str, runs[::len(runs) - 1 or 1]))}; "
            "the planted "
            "truth's AUC is the best any model reaches on each table size's data.")
    return head + "\n\n" + table


def main(argv=None):
    p = Parser(prog="python -m plots.ctr", description=__doc__.splitlines()[0])
    p.add_argument("results", type=infile())
    p.add_argument("--out", type=outpath(empty=True), default="")
    args = p.parse_args(argv)
    record = read_results(p, args.results)
    try:
        text = draw(record, args.out or args.results.rsplit(".", 1)[0] + ".png")
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as exc:
        p.error(f"{args.results}: not a results file of experiments.cluster.ctr ({type(exc).__name__}: {exc})")
    print(text)
    return 0


def hotkeys_markdown(record):
    """Return the hot-key study's markdown: per sharding, max / mean rows served without and with the split
    (the servers' own counts; median and range over the seeds), the rows split, and the test AUC both ways."""
    from tabulate import tabulate

    def spread(s, fmt):
        return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}-{fmt.format(s['max'])})"

    cells = []
    for kind in ("range", "hash"):
        s = record["summary"][kind]
        split = s["max_over_mean_split"] is not None  # else balanced without a split: one run per seed
        cells.append([kind, spread(s["max_over_mean"], "{:.3f}"), spread(s["hot"], "{:,.0f}") if split else "none needed",
                      spread(s["max_over_mean_split"], "{:.3f}") if split else "-", spread(s["test_auc"], "{:.4f}"),
                      spread(s["test_auc_split"], "{:.4f}") if split else "-",
                      spread(s["auc_difference"], "{:g}") if split else "-"])
    table = tabulate(cells, headers=("sharding", "max / mean rows served", "hot rows split",
                                     "max / mean, split", "test AUC", "test AUC, split", "AUC difference"),
                     tablefmt="pipe", disable_numparse=True,
                     colalign=("left", "right", "right", "right", "right", "right", "right"))
    return (f"--mode hybrid, {record['servers']} servers, {record['workers']} workers, 10^5 rows in 8 tables, "
            f"65,536 training samples; median (min-max) over seeds 0-{record['seeds'] - 1}; the split is the "
            f"smallest that brings the counted max / mean to {record['target']:g} or below.\n\n" + table)


if __name__ == "__main__":
    sys.exit(main())


"""The compression study's report: one table row per compressor, the target checks, Markdown.

Rows aggregate the seeds of each compressor (accuracy mean and range, payload and wire bytes per step,
bits per element, ratio to ``none``, codec time); :func:`check_lines` prints the targets as a neutral
check list with enough digits that a value never looks as if it met a bound it misses.
"""
import numpy as np
from tabulate import tabulate

__all__ = ["TARGETS", "table", "targets", "check_lines", "markdown_table"]

#: (spec, what, bound): accuracy within ``bound`` points of none, or payload ratio >= bound.
TARGETS = (("qsgd:levels=127", "accuracy", 0.5), ("topk:ratio=0.01", "accuracy", 1.5),
           ("efsignsgd", "accuracy", 1.5), ("powersgd:rank=4", "accuracy", 1.5),
           ("fp16", "ratio", 2.0), ("int8", "ratio", 4.0),
           ("signsgd", "ratio", 16.0),  # sign(0) = 0 makes three values: 2-bit codes, 32 / 2 = 16x at most
           ("efsignsgd", "ratio", 25.0), ("onebit", "ratio", 25.0), ("topk:ratio=0.01", "ratio", 40.0))


def table(runs, wire):
    """Aggregate the runs of each spec into one table row (rank 0)."""
    rows, base = [], None
    for spec in dict.fromkeys(r["spec"] for r in runs):
        mine = [r for r in runs if r["spec"] == spec]
        acc = np.array([r["final_test_acc"] for r in mine])
        n = mine[0]["parameters"]
        nbytes = float(np.mean([r["bytes_per_step"] for r in mine]))
        curves = np.array([[e["loss"] for e in r["epochs"]] for r in mine])
        tests = np.array([[e["test_acc"] for e in r["epochs"]] for r in mine])
        row = {"spec": spec, "compressor": mine[0]["compressor"], "bits_per_element": 8 * nbytes / n,
               "bytes_per_step": nbytes, "wire_bytes_per_step": wire.get(spec),
               "test_acc_mean": float(acc.mean()), "test_acc_min": float(acc.min()),
               "test_acc_max": float(acc.max()), "seeds": len(mine),
               "codec_ms": float(np.mean([r["codec_ms"] for r in mine])),
               "loss_curve": curves.mean(axis=0).tolist(), "test_acc_curve": tests.mean(axis=0).tolist()}
        rows.append(row)
        if spec == "none":
            base = row
    for row in rows:
        if base is not None:
            row["ratio_to_none"] = base["bytes_per_step"] / row["bytes_per_step"]
            row["delta_points"] = 100 * (row["test_acc_mean"] - base["test_acc_mean"])
            w, bw = row["wire_bytes_per_step"], base["wire_bytes_per_step"]
            row["wire_ratio_to_none"] = bw / w if w and bw else None
    return rows


def targets(rows):
    """Check the study's targets against the table."""
    by_spec, out = {r["spec"]: r for r in rows}, []
    for spec, what, bound in TARGETS:
        row = by_spec.get(spec)
        if row is None or "ratio_to_none" not in row:
            continue
        value = -row["delta_points"] if what == "accuracy" else row["ratio_to_none"]
        met = value <= bound if what == "accuracy" else value >= bound
        out.append({"spec": spec, "what": what, "bound": bound, "value": value, "met": bool(met)})
    return out


def _digits(value, bound, met, at_least):
    """Format ``value`` with the fewest decimals (from ``at_least``) that do not show an unmet
    ``bound`` as reached: 3.99958 against 4.0 prints 3.9996, never 4.0000."""
    for d in range(at_least, 13):
        text = f"{value:.{d}f}"
        if met or float(text) != bound:
            return text
    return repr(value)


def _why(check, n):
    """Return the reason a check sits where it does when the compressor's format decides it."""
    if check["what"] == "ratio" and check["spec"] == "int8" and n:
        ceiling = 4 * n / (n + 4)
        return (f"a float32 scale per tensor caps it at 4n/(n+4) = {_digits(ceiling, 4.0, False, 4)} "
                f"for the n = {n:,} gradient elements")
    if check["what"] == "ratio" and check["spec"] == "signsgd" and n:
        ceiling = 4 * n / (-(-n // 4) + 4)
        return (f"2-bit sign codes and a float32 scale cap it at 4n/(ceil(n/4)+4) = "
                f"{_digits(ceiling, 16.0, False, 4)} for the n = {n:,} gradient elements")
    return None


def check_lines(results):
    """Return one line per check of the study's ``targets`` against the table, as printed.

    A ratio check reads ``check int8 payload ratio: 3.9996x fewer bytes than none (>= 4.0 asked;
    not reached because ...)``; an accuracy check gives the points below (or above) ``none`` and the points
    allowed. Values carry enough decimals to agree with the verdict (at least 4 for ratios, 2 for
    points).

    Parameters
    ----------
    results : dict
        As written by :func:`run_study` (``targets`` and ``parameters``).

    Returns
    -------
    list of str
    """
    lines, n = [], results.get("parameters")
    for t in results.get("targets", []):
        if t["what"] == "ratio":
            shown = _digits(t["value"], t["bound"], t["met"], 4)
            text = f"check {t['spec']} payload ratio: {shown}x fewer bytes than none (>= {t['bound']} asked"
        else:  # points below none; negative when above
            below = t["value"]
            shown = _digits(abs(below), t["bound"], t["met"] or below < 0, 2)
            side = "above" if below < 0 else "below"
            text = f"check {t['spec']} accuracy: {shown} points {side} none (<= {t['bound']} asked"
        why = _why(t, n)
        text += "; met" if t["met"] else "; not reached"
        lines.append(text + (f" because {why})" if why else ")"))
    return lines


_TABLE_HEAD = ("compressor", "bits/element", "bytes/step", "ratio to none", "wire bytes/step (ratio)",
               "test accuracy (min-max)", "vs none (points)", "compress+decompress ms")


def markdown_table(rows):
    """Return the study table as Markdown (``tabulate``'s pipe format: first column left, numbers right)."""
    cells = []
    for r in rows:
        wire = r.get("wire_bytes_per_step")
        wire_txt = "n/a" if wire is None else f"{wire:,.0f} ({r.get('wire_ratio_to_none') or 0:.1f}x)"
        cells.append((r["spec"], f"{r['bits_per_element']:.2f}", f"{r['bytes_per_step']:,.0f}",
                      f"{r.get('ratio_to_none', float('nan')):.1f}x", wire_txt,
                      f"{100 * r['test_acc_mean']:.2f}% ({100 * r['test_acc_min']:.2f}-{100 * r['test_acc_max']:.2f})",
                      f"{r.get('delta_points', float('nan')):+.2f}", f"{r['codec_ms']:.3f}"))
    return tabulate(cells, _TABLE_HEAD, tablefmt="pipe", disable_numparse=True,
                    colalign=("left",) + ("right",) * (len(_TABLE_HEAD) - 1))

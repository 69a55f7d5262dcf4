"""The parameter-server study's tables (:mod:`experiments.studies.ps_study`; published by :mod:`plots.publish`):
ratios within a repeat, then their median and range over the repeats, and their Markdown form."""
import statistics

from tabulate import tabulate

__all__ = ["ratio_table", "conflict_table", "markdown"]


def _spread(values):
    """Return ``{"median", "min", "max", "n"}`` of ``values`` (None entries make the median None)."""
    if not values or any(v is None for v in values):
        return {"median": None, "min": None, "max": None, "n": len(values)}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def ratio_table(runs, part, names_baselines):
    """Return one row per variant of ``part``: medians and ranges of its figures and its ratios.

    Ratios are taken within a repeat: ``updates_per_s`` and ``samples_per_s`` of the variant over
    its baseline's, and the baseline's ``time_to_target_s`` over the variant's (``> 1``: the
    variant reaches the target sooner). A repeat where either run never reached the target gives
    no time ratio (None).

    Parameters
    ----------
    runs : list of dict
        Records from :func:`run_study`.
    part : str
        The part whose records to tabulate.
    names_baselines : list of (str, str)
        Each variant's name and its baseline's, in table order.

    Returns
    -------
    list of dict
        Per variant: ``{"median", "min", "max", "n"}`` of updates/s, samples/s (both per second),
        time to target (seconds), final test accuracy (fraction) and the three ratios (unitless),
        plus the largest staleness seen (clocks).
    """
    by = {(r["variant"], r["repeat"]): r for r in runs if r["part"] == part}
    repeats = sorted({rep for _, rep in by})
    rows = []
    for name, baseline in names_baselines:
        mine = [by[(name, k)] for k in repeats if (name, k) in by]
        pairs = [(by[(name, k)], by[(baseline, k)]) for k in repeats if (name, k) in by and (baseline, k) in by]
        ttt = [a["time_to_target_s"] for a in mine]
        time_ratio = [b["time_to_target_s"] / a["time_to_target_s"]
                      if a["time_to_target_s"] and b["time_to_target_s"] else None for a, b in pairs]
        rows.append({
            "variant": name, "baseline": baseline, "runs": len(mine),
            "updates_per_s": _spread([a["updates_per_s"] for a in mine]),
            "samples_per_s": _spread([a["samples_per_s"] for a in mine]),
            "time_to_target_s": _spread(ttt),
            "final_test_acc": _spread([a["final_test_acc"] for a in mine]),
            "staleness_max": max((a["staleness_max"] for a in mine), default=0),
            "updates_vs_baseline": _spread([a["updates_per_s"] / b["updates_per_s"] for a, b in pairs]),
            "samples_vs_baseline": _spread([a["samples_per_s"] / b["samples_per_s"] for a, b in pairs]),
            "time_to_target_vs_baseline": _spread(time_ratio)})
    return rows


def _acc_at(curve, wall_s):
    """Test accuracy of the last curve point reached within ``wall_s`` seconds (None before the first)."""
    seen = [p["test_acc"] for p in curve if p["wall_s"] <= wall_s]
    return seen[-1] if seen else None


def conflict_table(runs, names_baselines):
    """Return one row per variant of the ``conflict`` or ``retries`` part.

    Per variant: ``refused_per_push`` (refusals per applied push), ``wasted_compute_s`` (seconds of
    gradients computed and then refused, summed over workers), ``resends``, updates per second and
    its ratio to the baseline's within a repeat, and the test accuracy at equal wall time: at the
    shortest wall time of the variants of the same condition (the name's part before ``-``) in that
    repeat. Each as ``{"median", "min", "max", "n"}`` over the repeats; ``bitwise`` says whether every
    repeat's final parameters equal its baseline's bit for bit.
    """
    by = {(r["variant"], r["repeat"]): r for r in runs if r["part"] in ("conflict", "retries")}
    repeats = sorted({rep for _, rep in by})
    rows = []
    for name, baseline in names_baselines:
        cond = name.split("-")[0]
        mine = [(k, by[(name, k)]) for k in repeats if (name, k) in by]
        equal = {k: min(r["wall_s"] for (v, rep), r in by.items() if rep == k and v.split("-")[0] == cond)
                 for k, _ in mine}
        pairs = [(a, by[(baseline, k)]) for k, a in mine if (baseline, k) in by]
        rows.append({
            "variant": name, "baseline": baseline, "runs": len(mine), "equal_wall_s": _spread(list(equal.values())),
            "refused_per_push": _spread([a.get("refused_per_push", 0.0) for _, a in mine]),
            "wasted_compute_s": _spread([a.get("wasted_compute_s", 0.0) for _, a in mine]),
            "resends": _spread([float(a.get("resends", 0)) for _, a in mine]),
            "updates_per_s": _spread([a["updates_per_s"] for _, a in mine]),
            "updates_vs_baseline": _spread([a["updates_per_s"] / b["updates_per_s"] for a, b in pairs]),
            "acc_at_equal_wall": _spread([_acc_at(a["curve"], equal[k]) for k, a in mine]),
            "final_test_acc": _spread([a["final_test_acc"] for _, a in mine]),
            "bitwise": bool(pairs) and all(a.get("params_sha") == b.get("params_sha") for a, b in pairs)})
    return rows


def _fmt(s, unit="", digits=2):
    """``median (min-max)`` of a spread, or ``never``/``-`` when absent."""
    if s["median"] is None:
        return "n/a"
    return f"{s['median']:.{digits}f}{unit} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


_HEAD = {"transient": ("protocol", "to 95 % (s)", "BSP's time / this", "updates/s", "vs BSP", "final test acc",
                       "staleness max"),
         "straggler": ("variant", "samples/s", "vs even", "updates/s", "vs even", "to 95 % (s)", "final test acc"),
         "servers": ("servers", "samples/s", "vs 1 server", "updates/s", "vs 1 server", "to 95 % (s)",
                     "final test acc"),
         "conflict": ("condition-policy", "refused / push", "wasted compute (s)", "updates/s", "vs accept",
                      "test acc at equal wall time"),
         "retries": ("variant", "resends", "updates/s", "vs clean", "final test acc", "bitwise = clean")}


def markdown(part, rows):
    """Return ``part``'s table (rows of :func:`ratio_table`) as Markdown: medians, the range over the
    repeats in brackets (str)."""
    cells = []
    for r in rows:
        if part in ("conflict", "retries"):
            pct = {k: (v * 100 if isinstance(v, float) else v) for k, v in r["final_test_acc"].items()}
            if part == "conflict":
                at = {k: (v * 100 if isinstance(v, float) else v) for k, v in r["acc_at_equal_wall"].items()}
                cells.append((r["variant"], _fmt(r["refused_per_push"]), _fmt(r["wasted_compute_s"]),
                              _fmt(r["updates_per_s"], "", 0), _fmt(r["updates_vs_baseline"], "x"), _fmt(at, " %")))
            else:
                cells.append((r["variant"], _fmt(r["resends"], "", 0), _fmt(r["updates_per_s"], "", 0),
                              _fmt(r["updates_vs_baseline"], "x"), _fmt(pct, " %"), "yes" if r["bitwise"] else "NO"))
            continue
        acc = _fmt({k: (v * 100 if isinstance(v, float) else v) for k, v in r["final_test_acc"].items()}, " %")
        if part == "transient":
            cells.append((r["variant"].upper().replace("SSP", "SSP s="), _fmt(r["time_to_target_s"]),
                          _fmt(r["time_to_target_vs_baseline"], "x"), _fmt(r["updates_per_s"], "", 0),
                          _fmt(r["updates_vs_baseline"], "x"), acc, str(r["staleness_max"])))
        else:
            cells.append((r["variant"], _fmt(r["samples_per_s"], "", 0), _fmt(r["samples_vs_baseline"], "x"),
                          _fmt(r["updates_per_s"], "", 0), _fmt(r["updates_vs_baseline"], "x"),
                          _fmt(r["time_to_target_s"]), acc))
    return tabulate(cells, _HEAD[part], tablefmt="pipe", disable_numparse=True,
                    colalign=("left",) + ("right",) * (len(_HEAD[part]) - 1))

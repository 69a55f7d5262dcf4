"""Markdown tables of the emulated-cluster studies (tabulate's pipe format), made from their results files:
printed by the studies themselves (:mod:`experiments.cluster.compression`, :mod:`experiments.cluster.ps`,
:mod:`experiments.cluster.node_collectives`) and published by :mod:`plots.publish`. Each table is followed by
sentences that state, from the file alone, what the study's paragraph in the guide claims.

Examples
--------
>>> from plots.tables.cluster_tables import ps_markdown
>>> row = {"config": "dp-ring", "model": "small", "nodes": 4, "samples_per_s": 900.0, "samples_min": 880.0,
...        "samples_max": 910.0, "vs_allreduce": 1.0, "busiest_link_bytes": 230460.0,
...        "worker_link_bytes": 230460.0, "wire_ms": 1.84, "final_test_acc": 0.97}
>>> print(ps_markdown({"link": "1gbit", "models": {"small": {"hidden": "512", "parameters": 38410}},
...                    "rows": [row]}).splitlines()[0])
Model small (hidden 512, 38,410 parameters, 153.6 KB of float32 gradient), links 1gbit:
"""
from tabulate import tabulate

__all__ = ["compression_markdown", "compression_findings", "ps_markdown", "collectives_markdown"]


def _find(rows, **keys):
    return next((r for r in rows if all(r.get(k) == v for k, v in keys.items())), None)


def compression_markdown(study):
    """Return the compression study (``experiments.cluster.compression``) as Markdown.

    One row per compressor: bytes per step, then per network the step time in ms, the speedup over
    ``none`` (median [range] of the per-epoch ratios) and the wall seconds to the target accuracy, and
    the accuracy cost in points against that network's ``none``; then :func:`compression_findings`.
    """
    rows, nets, target = study["rows"], study["networks"], study["target"]
    specs = list(dict.fromkeys(r["spec"] for r in rows))
    head = ["compressor", "bytes/step"] + [f"{n}: step ms (speedup) / to {target:.0%} s" for n in nets] + \
           [f"acc cost, {n}" for n in nets]
    table = []
    for spec in specs:
        cells = [spec, ""]
        for n in nets:
            r = _find(rows, network=n, spec=spec)
            if r is None:
                cells.append("-")
                continue
            cells[1] = cells[1] or ("-" if r["bytes_per_step"] is None else f"{r['bytes_per_step']:,.0f}")
            sp = "" if r["speedup"] is None else f" ({r['speedup']:.2f}x [{r['speedup_min']:.2f}-{r['speedup_max']:.2f}])"
            tt = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.2f}"
            cells.append(f"{r['step_ms']:.1f}{sp} / {tt}")
        for n in nets:
            r = _find(rows, network=n, spec=spec)
            cells.append("-" if r is None or r["acc_cost_points"] is None else f"{r['acc_cost_points']:+.2f}")
        table.append(cells)
    text = tabulate(table, head, tablefmt="pipe", disable_numparse=True)
    settings = study.get("settings")
    if settings:
        text = (f"{settings['nodes']} nodes x {settings['ranks_per_node']} rank on the emulated links, "
                f"{settings['ranks_per_node'] * settings['nodes']} ranks in shared memory; {settings['epochs']} "
                f"epoch{'s' if settings['epochs'] != 1 else ''}, seed {settings['seeds']}.\n\n" + text)
    return text + "\n\n" + compression_findings(study)


def compression_findings(study):
    """Return one sentence per network: the compressors whose step is shorter than ``none``'s (median
    speedup above 1, and above 1 in every epoch) and the largest median speedup.

    Examples
    --------
    >>> rows = [{"network": "100mbit", "spec": "none", "speedup": 1.0, "speedup_min": 1.0},
    ...         {"network": "100mbit", "spec": "topk", "speedup": 2.5, "speedup_min": 2.1}]
    >>> compression_findings({"networks": ["100mbit"], "rows": rows})
    '100mbit: shorter steps than `none` in every epoch with topk; the largest median speedup is 2.50x (topk).'
    """
    lines = []
    for n in study["networks"]:
        mine = [r for r in study["rows"] if r["network"] == n and r["spec"] != "none" and r["speedup"] is not None]
        if not mine:
            continue
        always = [r["spec"] for r in mine if r["speedup_min"] > 1]
        best = max(mine, key=lambda r: r["speedup"])
        lines.append(f"{n}: shorter steps than `none` in every epoch with {', '.join(always) or 'no compressor'}; "
                     f"the largest median speedup is {best['speedup']:.2f}x ({best['spec']}).")
    return "\n".join(lines)


def ps_markdown(study):
    """Return the parameter-server study (``experiments.cluster.ps``) as Markdown: per model, one row per
    configuration with samples/s (median and range of the repeats), the ratio to the ring all-reduce, the
    bytes per step each direction on the busiest link and on a worker's (from the protocols), the
    busiest link's time on the wire at the link rate and the test accuracy; then which configuration
    is fastest, the bytes the ring all-reduce counted against the protocol's, and a step's computation
    against its gradient's time on the wire."""
    parts = []
    for name, model in study["models"].items():
        rows = [r for r in study["rows"] if r.get("model", name) == name]
        if not rows:
            continue
        cells = [(r["config"], r["nodes"], f"{r['samples_per_s']:,.0f} ({r['samples_min']:,.0f}-{r['samples_max']:,.0f})",
                  "-" if r.get("vs_allreduce") is None else f"{r['vs_allreduce']:.2f}x",
                  f"{r['busiest_link_bytes'] / 1e3:,.0f}", f"{r['worker_link_bytes'] / 1e3:,.0f}",
                  "-" if r.get("wire_ms") is None else f"{r['wire_ms']:.1f}", f"{r['final_test_acc']:.2%}")
                 for r in rows]
        head = ("configuration", "nodes", "samples/s (range)", "vs all-reduce", "busiest link KB/step",
                "worker link KB/step", "busiest link wire ms/step", "test acc")
        best = max(rows, key=lambda r: r["samples_per_s"])
        n = model["parameters"]
        ring = _find(rows, config="dp-ring")
        counted = ("" if not ring or not ring.get("measured_sent_per_rank_step") else
                   f" The ring all-reduce's own counter: {ring['measured_sent_per_rank_step'] / 1e3:,.1f} KB sent per "
                   f"rank per step (protocol {ring['busiest_link_bytes'] / 1e3:,.1f} KB).")
        if ring and ring.get("compute_ms") is not None:
            counted += (f" A step computes in {ring['compute_ms']:.1f} ms (the ring runs' own timer); its gradient "
                        f"takes {ring['wire_ms']:.1f} ms on a ring link, "
                        f"{'longer' if ring['wire_ms'] > ring['compute_ms'] else 'less'}.")
        parts.append(f"Model {name} (hidden {model['hidden']}, {n:,} parameters, {4 * n / 1e3:,.1f} KB of float32 "
                     f"gradient), links {study['link']}:\n\n"
                     + tabulate(cells, head, tablefmt="pipe", disable_numparse=True, colalign=("left",) + ("right",) * 7)
                     + f"\n\nFastest: {best['config']} ({best['samples_per_s']:,.0f} samples/s).{counted}")
    return "\n\n".join(parts)


def collectives_markdown(study):
    """Return the collectives study (``experiments.cluster.node_collectives``) as Markdown: per link rate, the time
    per all-reduce in ms per size and algorithm, with the speedup over the flat ring (median [range] of the
    passes) and the inter-node busbw in GB/s; then the sizes at which ``2d`` beats ``ring``."""
    rows = study["rows"]
    order = ("ring", "rabenseifner", "2d", "tree", "mpi")
    algs = sorted({r["algorithm"] for r in rows}, key=lambda a: order.index(a) if a in order else len(order))
    parts = []
    for link in dict.fromkeys(r["link"] for r in rows):
        table = []
        for size in sorted({r["bytes"] for r in rows if r["link"] == link}):
            cells = []
            for a in algs:
                r = _find(rows, link=link, bytes=size, algorithm=a)
                if r is None:
                    cells.append("-")
                    continue
                c = f"{r['time_s'] * 1e3:.1f}"
                if a != "ring" and r["speedup_vs_ring"]:
                    c += f" ({r['speedup_vs_ring']:.2f}x [{r['speedup_min']:.2f}-{r['speedup_max']:.2f}])"
                if r["inter_busbw_GBps"]:
                    c += f"; {r['inter_busbw_GBps']:.3f}"
                cells.append(c)
            table.append([f"{size >> 10} KiB"] + cells)
        s = study["summary"][link]
        wins = ", ".join(f"{b >> 10} KiB" for b in s["2d_faster_than_ring_at"]) or "no size"
        stays = ("at no size" if s["2d_faster_from_bytes"] is None
                 else f"from {s['2d_faster_from_bytes'] >> 10} KiB up")
        parts.append(f"{link}, {s['P'] // s['ranks_per_node']} nodes x {s['ranks_per_node']} ranks, {s['passes']} "
                     f"passes: time ms (speedup over ring, median [range] of passes; inter-node busbw GB/s)\n\n"
                     + tabulate(table, ["size"] + algs, tablefmt="pipe", disable_numparse=True)
                     + f"\n\n{link}: `2d` is faster than `ring` at {wins}; it stays faster {stays}.")
    return "\n\n".join(parts)

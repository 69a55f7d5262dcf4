"""The at-scale answer: the fastest configuration of one job for P = 64 to 4,096 on example clusters.

    python -m training.predict.scale [--profile FILE | --trace FILE] [--ps 64,256,1024,4096] \\
        [--out results/predict/scale]

predicts every configuration of :func:`candidates` (all-reduce algorithms with and without buckets
and overlap, three compressors, parameter servers, tensor and pipeline grids) on each cluster of
:data:`CLUSTERS` at each P, and writes ``OUT.json`` (every prediction), ``OUT.md`` (per cluster and
P: the best configuration, its step time, the second best and the ratio) and, with
``python -m plots.predict OUT.json``, the figure. Without ``--profile`` / ``--trace`` the job is
:data:`EXAMPLE_MODEL`, profiled from FLOP counts (:func:`training.predict.profile.synthetic`) with
codec times from byte and FLOP counts (:func:`synthetic_codecs`).

The clusters (eight accelerators per node, 16 nodes per rack, uplinks 2:1 oversubscribed):

- ``10GbE``: 10 Gbit/s node links (IEEE 802.3ae), kernel TCP (20 us one way), intra-node PCIe 4.0
  x16 (about 25 GB/s per direction of its 31.5 GB/s; PCI-SIG PCIe 4.0 specification);
- ``25GbE``: 25 Gbit/s (IEEE 802.3by), RoCE (5 us), intra-node NVLink 3 (300 GB/s per direction
  per GPU; NVIDIA A100 datasheet);
- ``100GbE``: 100 Gbit/s (IEEE 802.3cd), RoCE (3 us), NVLink 3.

Each rack uplink carries half the rack's node bandwidth (2:1) and adds 1 us (one more switch hop);
reductions run at 1.5 TB/s (A100 HBM2e bandwidth). P = 4,096 is fast because ring, ``2d`` and
``torus`` are replayed by :mod:`collectives.model.lockstep` (vectorized over ranks, equal to the event
replay) and every replay is cached by (algorithm, bytes, network); the others go through the event
replay.
"""
import json
import os
import sys
import time

from commlab import provenance
from training.settings.options import Parser, outpath, text
from training.predict import job_config as cfgmod
from training.predict import profile as profmod
from training.predict import topology as topomod
from training.predict.step import predict

__all__ = ["CLUSTERS", "EXAMPLE_MODEL", "cluster_topology", "candidates", "synthetic_codecs", "run", "scale_table", "main"]

#: name -> (node link bit/s, one-way latency us, intra-node bit/s, intra-node latency us)
CLUSTERS = {"10GbE": (10e9, 20.0, 200e9, 3.0), "25GbE": (25e9, 5.0, 2.4e12, 2.0), "100GbE": (100e9, 3.0, 2.4e12, 2.0)}
#: The example job: an MLP of 12 layers of width 2048 (50 M parameters), 4,096 rows per rank, on a
#: device sustaining 50 TFLOP/s (about a third of an A100's dense bf16 peak).
EXAMPLE_MODEL = {"sizes": [2048] * 13, "rows": 4096, "flops_per_s": 50e12}
RANKS_PER_NODE, NODES_PER_RACK, OVERSUBSCRIPTION = 8, 16, 2.0


def cluster_topology(name, P):
    """Return the :class:`~training.predict.topology.Topology` of cluster ``name`` with P ranks."""
    link, lat, intra, intra_lat = CLUSTERS[name]
    nodes = max(1, P // RANKS_PER_NODE)
    npr = min(NODES_PER_RACK, nodes)
    return topomod.parse({
        "name": f"{name} P={P}", "racks": nodes // npr, "nodes_per_rack": npr, "ranks_per_node": RANKS_PER_NODE,
        "levels": {"intra-node": {"latency_us": intra_lat, "bandwidth_bps": intra},
                   "inter-node": {"latency_us": lat, "bandwidth_bps": link},
                   "inter-rack": {"latency_us": lat + 1.0, "bandwidth_bps": link * npr / OVERSUBSCRIPTION}},
        "reduce_bps": 8 * 1.5e12})


def synthetic_codecs(profile, flops_per_s, mem_bps=8 * 1.5e12):
    """Add fp16, top-k (1 %) and PowerSGD (rank 4) codecs priced from bytes and FLOPs to ``profile``.

    fp16: one pass reading the gradient and writing half (and back); top-k: a selection reading the
    gradient four times (a radix select), 8 bytes per kept element (index and value); PowerSGD:
    ``4 r n_in n_out`` FLOPs per matrix to compress and ``2 r n_in n_out`` to rebuild, its P and Q
    payloads (Vogels et al., NeurIPS 2019, Algorithm 1).
    """
    n, item = profile.elements, profile.itemsize
    gbytes = n * item * 8  # bits
    k = max(1, n // 100)
    mats = [(layer["n_in"], layer["n_out"]) for layer in profile.layers if layer.get("n_in")]
    r = 4
    p_elems = sum(a * r for a, b in mats) + sum(b for _, b in mats)
    q_elems = sum(b * r for a, b in mats)
    fl = sum(a * b for a, b in mats)
    profile.codecs = {
        "fp16": {"args": {}, "transport": "allreduce", "payload_bytes": [n * 2],
                 "compress_s": 1.5 * gbytes / mem_bps, "decompress_s": 1.5 * gbytes / mem_bps},
        "topk": {"args": {"ratio": 0.01}, "transport": "allgather", "payload_bytes": [k * 8],
                 "compress_s": 4 * gbytes / mem_bps, "decompress_s": k * 8 * 8 * 2 / mem_bps},
        "powersgd": {"args": {"matrix_rank": r}, "transport": "own", "payload_bytes": [p_elems * item, q_elems * item],
                     "compress_s": 4 * r * fl / flops_per_s + 2 * gbytes / mem_bps,
                     "decompress_s": 2 * r * fl / flops_per_s + gbytes / mem_bps}}
    return profile


def candidates(P, n_linear):
    """Return the configurations compared at P ranks (dicts for :func:`training.predict.job_config.parse`)."""
    out = []
    for alg in ("ring", "rabenseifner", "2d", "torus"):
        grid = "topology" if alg == "torus" else None
        for bucket in (0, 25 << 20):
            for overlap in (False, True):
                out.append({"algorithm": alg, "grid": grid, "bucket_bytes": bucket, "overlap": overlap,
                            "progress": "continuous"})
    for comp in ("fp16", "powersgd"):
        out.append({"algorithm": "torus", "grid": "topology", "compression": comp})
    out.append({"algorithm": "ring", "compression": "topk"})
    for S in (8, 64):
        if S <= P // 4:
            out.append({"mode": "ps", "servers": S})
    for T, Q, m in ((8, 1, 1), (1, 4, 8), (8, 4, 8)):
        if T * Q < P and Q <= n_linear:
            out.append({"algorithm": "ring", "tensor_parallel": T, "pipeline_parallel": Q, "micro_batches": m,
                        "bucket_bytes": 25 << 20})
    return out


def run(prof, ps, clusters=tuple(CLUSTERS), flops_per_s=EXAMPLE_MODEL["flops_per_s"], say=print):
    """Predict every candidate on every cluster and P; return ``(rows, best)`` lists of dicts."""
    rows, best = [], []
    n_linear = sum(1 for layer in prof.layers if layer.get("n_in"))
    for name in clusters:
        for P in ps:
            topo = cluster_topology(name, P)
            t0 = time.perf_counter()
            got = []
            for doc in candidates(P, n_linear):
                cfg = cfgmod.parse(doc)
                if cfg.compression != "none" and cfg.compression not in prof.codecs:
                    continue
                r = predict(prof, topo, cfg)
                row = {"cluster": name, "P": P, "config": r["config"], "step_s": r["step_s"], **r["breakdown"]}
                got.append(row)
                rows.append(row)
            got.sort(key=lambda x: x["step_s"])
            first, second = got[0], got[1]
            best.append({"cluster": name, "P": P, "best": first["config"], "best_s": first["step_s"],
                         "second": second["config"], "second_s": second["step_s"],
                         "ratio": second["step_s"] / first["step_s"], "configs": len(got)})
            say(f"{name:>7} P={P:<5} best {first['config']:<32} {first['step_s'] * 1e3:9.2f} ms; second "
                f"{second['config']:<32} {second['step_s'] * 1e3:9.2f} ms ({time.perf_counter() - t0:.1f} s)")
    return rows, best


def scale_table(best):
    """Return the markdown table of the best and second-best configuration per cluster and P."""
    lines = ["| cluster | P | best configuration | step ms | second best | step ms | second / best |",
             "|---|---:|---|---:|---|---:|---:|"]
    for b in best:
        lines.append(f"| {b['cluster']} | {b['P']} | {b['best']} | {b['best_s'] * 1e3:.2f} | {b['second']} | "
                     f"{b['second_s'] * 1e3:.2f} | {b['ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = Parser(prog="python -m training.predict.scale", description=__doc__.split("\n")[0])
    p.add_argument("--profile", type=text(), help="job profile JSON (default: the example model)")
    p.add_argument("--trace", type=text(), help="Chrome trace of training.train to profile instead")
    p.add_argument("--ps", type=text(), default="64,256,1024,4096", help="rank counts, comma-separated")
    p.add_argument("--clusters", type=text(), default=",".join(CLUSTERS), help=f"among {', '.join(CLUSTERS)}")
    p.add_argument("--out", type=outpath(), default="results/predict/scale", help="prefix of OUT.json and OUT.md")
    a = p.parse_args(argv)
    try:
        ps = [int(x) for x in a.ps.split(",")]
        clusters = a.clusters.split(",")
        for c in clusters:
            if c not in CLUSTERS:
                raise ValueError(f"--clusters: unknown cluster {c!r}; accepted: {', '.join(CLUSTERS)}")
        for P in ps:
            if P < 8 or P % RANKS_PER_NODE or (P // RANKS_PER_NODE > NODES_PER_RACK and P % (RANKS_PER_NODE * NODES_PER_RACK)):
                raise ValueError(f"--ps: P={P} must fill whole nodes of 8 and whole racks of 16 nodes")
        if a.profile or a.trace:
            prof = profmod.load(a.profile) if a.profile else profmod.from_trace(a.trace)
            profmod.measure_codecs(prof, [("fp16", {}), ("topk", {"ratio": 0.01}), ("powersgd", {"matrix_rank": 4})])
        else:
            m = EXAMPLE_MODEL
            prof = synthetic_codecs(profmod.synthetic(m["sizes"], m["rows"], m["flops_per_s"]), m["flops_per_s"])
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows, best = run(prof, ps, clusters)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out + ".json", "w", encoding="utf-8") as f:
        command = "python -m training.predict.scale " + " ".join(argv or sys.argv[1:])
        json.dump({"command": command, "provenance": {**provenance.provenance(None, command.strip()), "noisy": False},
                   "profile": prof.source, "clusters": {c: cluster_topology(c, max(ps)).doc for c in clusters},
                   "rows": rows, "best": best, "seconds": time.perf_counter() - t0}, f, indent=1)
    with open(a.out + ".md", "w", encoding="utf-8") as f:
        f.write(scale_table(best))
    print(scale_table(best))
    print(f"wrote {a.out}.json and {a.out}.md in {time.perf_counter() - t0:.0f} s; figure: "
          f"python -m plots.predict {a.out}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())

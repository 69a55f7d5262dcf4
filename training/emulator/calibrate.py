"""Measure the emulated cluster's links: latency, one-way and both-ways bandwidth, and a fan-out from node 0.

    python -m training.emulator.emulate --nodes N --ranks-per-node K --link RATE --calibrate [--out FILE]

runs this module on every rank (``mpiexec -n N*K python -m training.emulator.calibrate --link RATE``).
The nodes are found with ``Split_type(COMM_TYPE_SHARED)``; node i's first rank is its leader. For
each pair of nodes in turn (the other ranks wait at a barrier that sleeps, not spins), the two leaders play ping-pong on
``MPI.COMM_WORLD`` with blocking ``Send``/``Recv`` (OSU Micro-Benchmarks' ``osu_latency`` and
``osu_bw`` method, Panda et al.):

- latency: ``--lat-iters`` round trips of 8 bytes after 10 uncounted ones; latency = median RTT / 2;
- bandwidth: ``--reps`` round trips of S bytes each way after one uncounted one, S = a quarter
  second of traffic at the configured rate (64 KiB to 64 MiB; 64 MiB unshaped); bandwidth =
  2 S / RTT per repetition, reported as median and range, in bits per second to compare with ``tc``;
- bidirectional bandwidth (after ``osu_bibw``, with one message each way): ``--reps`` exchanges in
  which both leaders send S bytes to each other at once (``Isend``/``Irecv``, ``Waitall``) after one
  uncounted one; one direction's rate = S / time. Its ratio to the ping-pong bandwidth is the link's
  ``duplex``, which the cost model (:class:`collectives.model.network.Network`) applies to a link
  busy both ways.
- fan-out: node 0's first rank sends one message to every rank on the other nodes at once (``Isend``
  each; it and the receivers poll with ``Test`` and short sleeps, as a waiting rank does),
  after one uncounted one, at two sizes: S / n bytes each (a quarter second in all, n the receivers;
  2 ``--reps`` + 1 times; left out when n is 1) and S each (``--reps`` times). Each receiver's end is timed from a common
  ``Barrier``; per size, the sorted ends as fractions of the last, median over the repetitions, are
  ``summary.fanout``: how the node's link divides among messages sent at once
  (:mod:`training.predict.ps_step` replays a parameter server's replies with it).

Within a node (K >= 2) the same is measured between node 0's first two ranks (shared memory). With
racks (``COMMLAB_RACKS=R``, set by the emulator's ``--racks``; nodes ``i * N // R`` onward form rack i) a
pair of nodes in different racks is an ``inter-rack`` row (node link, uplink, node link), one in the same
rack an ``inter-node`` row, and the summary gives each level's median latency and bandwidth, and
``duplex``, the median over the pairs of nodes (the shared-memory pair left out).
Rank 0 prints one row per pair against the configured rate and, with ``--out``, writes the rows, the
configuration, the MPI library, P, the host and the ``provenance`` (:mod:`commlab.provenance`) to a
JSON file. On a busy machine the calibration refuses to start unless ``--allow-noisy`` (which
:mod:`training.emulator.emulate` passes on) marks its results noisy.
"""
import json
import os
import platform
import sys
import time

import numpy as np
from mpi4py import MPI

from commlab import provenance as prov
from commlab.provenance import command_line, mpi_library
from training.emulator.net import parse_rate
from training.settings.options import INT32_MAX, Parser, integer, link_rate, outpath, real

__all__ = ["find_nodes", "pingpong", "exchange", "fanout", "link_size", "main"]

#: Tolerance of the calibration target: measured bandwidth within 20 % of the configured rate.
TOLERANCE = 0.20


def find_nodes(comm):
    """Return the node index of every rank of ``comm``, found with ``Split_type(COMM_TYPE_SHARED)``.

    Returns
    -------
    ndarray, shape (P,), int64
        ``nodes[r]`` is rank r's node; nodes are numbered by their lowest rank.
    """
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    first = np.array([comm.rank], np.int64)
    local.Bcast(first, root=0)  # the node's lowest world rank names it
    local.Free()
    firsts = np.empty(comm.size, np.int64)
    comm.Allgather(first, firsts)
    _, nodes = np.unique(firsts, return_inverse=True)
    return nodes.astype(np.int64)


def link_size(bits_per_s):
    """Return the ping-pong message size in bytes: 0.25 s of traffic at the rate, 64 KiB to 64 MiB."""
    if not bits_per_s:
        return 64 << 20
    return int(min(max(bits_per_s / 8 * 0.25, 64 << 10), 64 << 20))


def pingpong(comm, a, b, nbytes, iters, warmup):
    """Time ``iters`` round trips of ``nbytes`` between ranks ``a`` and ``b`` of ``comm``.

    Returns
    -------
    ndarray, shape (iters,), float64
        Round-trip times in seconds on rank ``a``; empty on every other rank.
    """
    buf = np.zeros(max(nbytes, 1), np.uint8)[:nbytes]
    times = []
    for i in range(warmup + iters):
        if comm.rank == a:
            t = time.perf_counter()
            comm.Send(buf, dest=b, tag=7)
            comm.Recv(buf, source=b, tag=7)
            if i >= warmup:
                times.append(time.perf_counter() - t)
        elif comm.rank == b:
            comm.Recv(buf, source=a, tag=7)
            comm.Send(buf, dest=a, tag=7)
    return np.array(times)


def exchange(comm, a, b, nbytes, iters, warmup):
    """Time ``iters`` exchanges in which ranks ``a`` and ``b`` of ``comm`` send each other ``nbytes`` at once.

    Returns
    -------
    ndarray, shape (iters,), float64
        Seconds per exchange on rank ``a``; empty on every other rank.
    """
    out, into = np.zeros(max(nbytes, 1), np.uint8)[:nbytes], np.zeros(max(nbytes, 1), np.uint8)[:nbytes]
    token, back = np.zeros(1, np.uint8), np.zeros(1, np.uint8)
    times = []
    if comm.rank not in (a, b):
        return np.array(times)
    peer = b if comm.rank == a else a
    for i in range(warmup + iters):
        comm.Sendrecv(token, dest=peer, sendtag=9, recvbuf=back, source=peer, recvtag=9)  # start together
        t = time.perf_counter()
        MPI.Request.Waitall([comm.Irecv(into, source=peer, tag=7), comm.Isend(out, dest=peer, tag=7)])
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return np.array(times) if comm.rank == a else np.array([])


def fanout(comm, root, targets, nbytes, iters, warmup):
    """Time ``iters`` fan-outs in which rank ``root`` sends ``nbytes`` to every rank of ``targets`` at once.

    Every rank of ``comm`` takes part (the others in the barriers and the final gather). Each fan-out
    starts at a barrier; every rank waits by polling with short sleeps, so no waiting rank takes a
    core from the transfers; the ends are gathered once, after the last fan-out.

    Returns
    -------
    ndarray, shape (iters, len(targets)), float64
        On ``root``: per fan-out, the receivers' ends (seconds from the barrier) sorted, as fractions of
        the last one's; empty on every other rank.

    Raises
    ------
    ValueError
        On every rank, before any message, when ``targets`` holds ``root``, a rank twice or one
        outside ``comm``.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> fanout(MPI.COMM_SELF, 0, [], 8, 1, 0).shape  # one rank: nobody to send to
    (1, 0)
    """
    targets = [int(t) for t in targets]
    if root in targets or len(set(targets)) != len(targets) or not all(0 <= t < comm.size for t in targets):
        raise ValueError(f"fanout targets must be distinct ranks of the communicator other than the root "
                         f"{root}, got {targets}")
    buf = np.zeros(max(nbytes, 1), np.uint8)[:nbytes]
    ends = np.zeros(warmup + iters)
    for i in range(warmup + iters):
        _poll([comm.Ibarrier()], 1e-4)
        t = time.perf_counter()
        if comm.rank == root:
            _poll([comm.Isend(buf, dest=d, tag=11) for d in targets], 1e-4)
        elif comm.rank in targets:
            _poll([comm.Irecv(buf, source=root, tag=11)], 1e-4)
        ends[i] = time.perf_counter() - t
    every = np.zeros((comm.size, warmup + iters)) if comm.rank == root else None
    comm.Gather(ends, every, root=root)
    if comm.rank != root:
        return np.array([])
    got = np.sort(every[targets, warmup:].T, axis=1)  # (iters, receivers)
    return got / got[:, -1:] if len(targets) else got


def _poll(requests, pause):
    """Complete ``requests``, testing them with ``pause`` seconds of sleep in between (no spinning)."""
    while not MPI.Request.Testall(requests):
        time.sleep(pause)


def _quiet_barrier(comm):
    """Barrier that sleeps instead of spinning, so idle ranks leave the cores to the measured pair."""
    _poll([comm.Ibarrier()], 0.002)


def _measure(comm, a, b, size, args):
    """Latency and bandwidth between ranks a and b; the row on rank 0, None elsewhere."""
    _quiet_barrier(comm)
    lat = pingpong(comm, a, b, 8, args.lat_iters, 10)
    bw = 2 * size * 8 / pingpong(comm, a, b, size, args.reps, 1)  # bits/s per repetition
    bi = size * 8 / exchange(comm, a, b, size, args.reps, 1)  # one direction's bits/s, both ways busy
    stats = np.zeros(5)  # latency s, median, min, max bandwidth bits/s, median bidirectional bits/s
    if comm.rank == a:
        stats[:] = np.median(lat) / 2, np.median(bw), bw.min(), bw.max(), np.median(bi)
        if a != 0:
            comm.Send(stats, dest=0, tag=8)
    elif comm.rank == 0:
        comm.Recv(stats, source=a, tag=8)
    _quiet_barrier(comm)
    row = {"latency_us": float(stats[0] * 1e6), "bytes": size, "bandwidth_bps": float(stats[1]),
           "bandwidth_min_bps": float(stats[2]), "bandwidth_max_bps": float(stats[3]),
           "bidirectional_bps": float(stats[4]), "duplex": float(stats[4] / stats[1]) if stats[1] else 0.0}
    return row if comm.rank == 0 else None


def main(argv=None):
    """Measure every link; rank 0 prints the table (and writes ``--out``). Returns the exit status.

    0; 2 after one error line (rank 0) on a bad argument or a busy machine
    (:func:`commlab.provenance.guard`), before any measurement.
    """
    p = Parser(prog="python -m training.emulator.calibrate", description=__doc__.split("\n")[0])
    p.add_argument("--link", type=link_rate(), default="unlimited", help="the configured rate, tc units (for the comparison)")
    p.add_argument("--reps", type=integer(1, INT32_MAX), default=5,
                   help="bandwidth round trips and exchanges both ways per pair, and fan-outs of S bytes each "
                   "(2 REPS + 1 of S / n bytes each) (default 5)")
    p.add_argument("--lat-iters", type=integer(1, INT32_MAX), default=200, help="latency round trips per pair (default 200)")
    p.add_argument("--out", type=outpath(empty=True), default="", help="write the measurements to this JSON file")
    prov.add_options(p, real)
    args = p.parse_args(argv)
    if args.reps < 1 or args.lat_iters < 1:
        p.error("--reps and --lat-iters must be at least 1")
    rate = parse_rate(args.link)
    comm = MPI.COMM_WORLD
    try:
        watch = prov.guard(args, comm)  # rank 0's verdict on every rank
    except ValueError as e:
        if comm.rank == 0:
            print(f"{p.prog}: error: {e}", file=sys.stderr, flush=True)
        return 2
    nodes = find_nodes(comm)
    n_nodes = int(nodes.max()) + 1
    leaders = [int(np.flatnonzero(nodes == i)[0]) for i in range(n_nodes)]
    size = link_size(rate)
    rows = []
    racks = int(os.environ.get("COMMLAB_RACKS", "1") or 1)
    per_rack = n_nodes // racks if racks >= 1 and n_nodes % racks == 0 else n_nodes
    for i in range(n_nodes):
        for j in range(i + 1, n_nodes):
            row = _measure(comm, leaders[i], leaders[j], size, args)
            if row is not None:
                kind = "inter-node" if i // per_rack == j // per_rack else "inter-rack"
                rows.append(dict(row, pair=f"node{i}-node{j}", kind=kind))
    same = np.flatnonzero(nodes == 0)
    if len(same) >= 2:
        row = _measure(comm, int(same[0]), int(same[1]), 64 << 20, args)
        if row is not None:
            rows.append(dict(row, pair="within node0", kind="intra-node"))
    far = [r for r in range(comm.size) if nodes[r] != 0]
    fan = []
    sizes = ((size // len(far), 2 * args.reps + 1), (size, args.reps)) if len(far) > 1 else ((size, args.reps),) * bool(far)
    for nbytes, reps in sizes:
        _quiet_barrier(comm)  # a quarter second in all, then each
        got = fanout(comm, 0, far, nbytes, reps, 1)
        fan.append({"bytes": nbytes, "messages": len(far), "reps": reps,
                    "fractions": np.median(got, axis=0).tolist() if comm.rank == 0 else []})
    if comm.rank == 0:
        _report(rows, args, rate, n_nodes, comm.size, watch, command_line("training.emulator.calibrate", argv),
                fan)
    else:
        watch.summary()  # stops this rank's sampling: rank 0 alone writes
    return 0


def _report(rows, args, rate, n_nodes, size, watch, command, fan=()):
    """Print the table and the summary; write the JSON file, stamped with ``watch`` and ``command``."""
    configured = f"{rate / 1e6:g} Mbit/s" if rate else "unshaped"
    print(f"link calibration: {n_nodes} nodes, {size} ranks, configured {args.link} ({configured}) each way")
    print(f"{'pair':<16}{'level':<12}{'latency us':>12}{'bandwidth Mbit/s':>18}{'range':>20}{'/ configured':>14}"
          f"{'both ways':>11}")
    for r in rows:
        ratio = r["bandwidth_bps"] / rate if rate and r["kind"] != "intra-node" else None
        r["ratio"] = ratio
        span = f"{r['bandwidth_min_bps'] / 1e6:.1f}-{r['bandwidth_max_bps'] / 1e6:.1f}"
        print(f"{r['pair']:<16}{r['kind']:<12}{r['latency_us']:>12.1f}{r['bandwidth_bps'] / 1e6:>18.1f}{span:>20}"
              f"{'' if ratio is None else f'{ratio:.3f}':>14}{r['duplex']:>11.3f}")
    inter = [r["bandwidth_bps"] for r in rows if r["kind"] != "intra-node"]
    summary = {"levels": {kind: {"latency_us": float(np.median([r["latency_us"] for r in rows if r["kind"] == kind])),
                                 "bandwidth_bps": float(np.median([r["bandwidth_bps"] for r in rows if r["kind"] == kind]))}
                          for kind in ("intra-node", "inter-node", "inter-rack") if any(r["kind"] == kind for r in rows)}}
    if inter:
        med = float(np.median(inter))
        summary.update(inter_bandwidth_bps=med, inter_min_bps=min(inter), inter_max_bps=max(inter))
        summary["duplex"] = float(np.median([r["duplex"] for r in rows if r["kind"] != "intra-node"]))
        line = f"inter-node bandwidth {med / 1e6:.1f} Mbit/s (pairs {min(inter) / 1e6:.1f}-{max(inter) / 1e6:.1f})"
        if rate:
            ok = all(abs(b / rate - 1) <= TOLERANCE for b in inter)
            summary.update(ratio=med / rate, within_tolerance=ok)
            line += f" = {med / rate:.3f} of configured; every pair within {TOLERANCE:.0%}: {'yes' if ok else 'NO'}"
        print(line)
        print(f"both ways busy: each direction at {summary['duplex']:.3f} of the ping-pong bandwidth "
              "(median over the pairs of nodes)")
    for f in fan:
        summary.setdefault("fanout", []).append(f)
        print(f"fan-out of {f['messages']} x {f['bytes']} bytes from node 0: ends at "
              f"{' '.join(f'{x:.2f}' for x in f['fractions'])} of the last (median of {f['reps']})")
    if args.out:
        result = {"config": {"link": args.link, "link_bps": rate, "nodes": n_nodes, "reps": args.reps,
                             "lat_iters": args.lat_iters, "tolerance": TOLERANCE},
                  "mpi_library": mpi_library(), "P": size,
                  "host": platform.node(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "rows": rows, "summary": summary}
        prov.stamp(result, watch, P=size, command=command)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}")
    else:
        watch.summary()  # no file to stamp: stops the sampling
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())

"""The options of the collectives sweep (:mod:`experiments.bench.collectives`): its configuration,
command line and checks, and the plan of what a sweep measures."""
import math
from dataclasses import dataclass

import numpy as np

import collectives
import collectives.schedules.registry
from collectives.schedules import load_algorithm
from experiments import harness
from experiments.bench.output import UNSTABLE
from training.settings.options import INT32_MAX, Parser, byte_count, integer, names, outpath, parsed_by, real, text

__all__ = ["BenchConfig", "FORMATS", "OPS", "REFERENCES", "DESCRIPTION", "NO_TORCH", "default_algorithms", "sweep_plan",
           "parse_args"]

#: What ``--help`` says the command does.
DESCRIPTION = "Sweep commlab's collectives against MPI's own, size by size, the way OSU and nccl-tests measure."


#: Printed output formats (``--format``).
FORMATS = ("table", "nccl-tests")

#: Collectives the sweep knows, in default order.
OPS = ("allreduce", "reduce_scatter", "allgather", "broadcast")

#: Reference rows per op besides commlab's algorithms: MPI's own call made directly (no commlab layer;
#: not for float16, which MPI lacks), its non-blocking form posted and waited at once (``MPI_I...`` +
#: ``MPI_Wait``: the library call commlab posts, so the floor of its repeated calls) and, for all-reduce, MPI's persistent form made directly, commlab's
#: persistent plan (``allreduce_init`` with ``auto``, steady state), ``auto`` with ``timeout=60``, the
#: loops that price the executor and ``limit``, the local memory work no all-reduce avoids
#: (:func:`experiments.bench.references.limit`).
REFERENCES = {"allreduce": ("MPI_Allreduce", "MPI_Iallreduce", "MPI_Allreduce_init", "persistent", "auto-timeout",
                             "ring-direct", "ring-execute", "limit", "shm-persistent"),
              "reduce_scatter": ("MPI_Reduce_scatter", "MPI_Ireduce_scatter_block", "limit"),
              "allgather": ("MPI_Allgather", "MPI_Iallgather", "limit"), "broadcast": ("MPI_Bcast",)}

#: Why ``--baseline gloo`` cannot run here.
NO_TORCH = "--baseline gloo needs PyTorch with torch.distributed on every rank (pip install torch)"


@dataclass
class BenchConfig:
    """Configuration of one sweep (every field maps onto a command-line flag)."""

    ops: tuple = OPS                          # collectives to sweep
    algorithms: tuple = ()                    # algorithm names; empty = all of each op (+ references)
    min_bytes: int = 8                        # smallest message, bytes
    max_bytes: int = 64 << 20                 # largest message, bytes; sizes double from min_bytes
    dtype: str = "float32"                    # element type
    redop: str = "sum"                        # reduction of all-reduce and reduce-scatter
    iters_small: int = 1000                   # timed calls per size up to large_bytes
    iters_large: int = 100                    # timed calls per size above large_bytes
    warmup_small: int = 200                   # uncounted calls per size up to large_bytes
    warmup_large: int = 10                    # uncounted calls per size above large_bytes
    large_bytes: int = 8192                   # bytes; the small/large iteration boundary (OSU's)
    max_time: float = 0.0                     # seconds; cap on one timed loop (fewer iters), 0 = none
    rounds: int = 1                           # segments per timed loop, algorithms taking turns (1 = OSU)
    repeats: int = 3                          # passes over the whole sweep; rows hold the median pass
    baseline: str = ""                        # "gloo": torch.distributed all-reduce as an extra row
    format: str = "table"                     # printed output: "table" (commlab's columns) or "nccl-tests"
    out: str = "results/bench_collectives"    # path prefix of PREFIX.csv and PREFIX.json
    max_load: float = None                    # refuse to start above this load average (None: 0.25 x cores)
    allow_noisy: bool = False                 # start on a busy machine anyway, the results marked noisy
    settle: float = 0.0                       # seconds rank 0 may wait for the load to fall below max_load
    timeline: str = ""                        # per-round timeline of each hand-made row: PREFIX-OP-ALG-BYTES.json


def _names(text):
    return tuple(n.strip() for n in text.split(",") if n.strip())


def default_algorithms(op):
    """Return every algorithm of ``op`` the sweep runs by default, ``mpi`` first."""
    names = list(collectives.ALGORITHMS) if op == "allreduce" else list(collectives.schedules.registry.OP_ALGORITHMS[op])
    names.remove("mpi")
    return ["mpi"] + names + list(REFERENCES[op])


def sweep_plan(cfg, P):
    """Return the (bytes, op) pairs a sweep of ``cfg`` on ``P`` ranks measures, in order.

    A size below one element (below P elements for all-gather) has nothing to measure and is left out.
    """
    itemsize = np.dtype(cfg.dtype).itemsize
    sizes = [cfg.min_bytes << k for k in range(64) if cfg.min_bytes << k <= cfg.max_bytes]
    return [(n, op) for n in sizes for op in cfg.ops if n // itemsize >= (P if op == "allgather" else 1)]


def parse_args(argv=None, size=1):
    """Return the :class:`BenchConfig` described by command-line ``argv``.

    Parameters
    ----------
    size : int
        Communicator size P the sweep will run on; a sweep with no size large enough to hold one
        element (P elements for all-gather) is rejected.
    """
    p = _parser()
    a = p.parse_args(argv)
    try:  # FILE.py:FUNCTION or module:FUNCTION: a schedule builder, verified and registered on every rank
        a.algorithms = tuple(load_algorithm(n) if ":" in n else n for n in a.algorithms)
    except (ValueError, ImportError) as exc:
        p.error(f"--algorithms: {exc}")
    for name in ("iters", "warmup"):
        if getattr(a, name) is not None:
            setattr(a, f"{name}_small", getattr(a, name))
            setattr(a, f"{name}_large", getattr(a, name))
    _check_arguments(p, a)
    cfg = BenchConfig(ops=a.ops, algorithms=a.algorithms, min_bytes=a.min_bytes, max_bytes=a.max_bytes,
                      dtype=a.dtype, redop=a.redop, iters_small=a.iters_small, iters_large=a.iters_large,
                      warmup_small=a.warmup_small, warmup_large=a.warmup_large, large_bytes=a.large_bytes,
                      max_time=a.max_time, rounds=a.rounds, repeats=a.repeats, baseline=a.baseline or "", out=a.out,
                      format=a.format, max_load=a.max_load, allow_noisy=a.allow_noisy,
                      settle=a.settle, timeline=a.timeline)
    if not sweep_plan(cfg, size):
        need = min(np.dtype(cfg.dtype).itemsize * (size if op == "allgather" else 1) for op in cfg.ops)
        p.error(f"no sizes/ops to measure: --max-bytes {cfg.max_bytes} is below the smallest message of "
                f"{', '.join(cfg.ops)} in {cfg.dtype} on {size} ranks ({need} B: one element, P for allgather)")
    return cfg


def _parser():
    """Return the argument parser, one flag per :class:`BenchConfig` field (plus ``--iters``, ``--warmup``)."""
    d = BenchConfig()
    p = Parser(description=DESCRIPTION, prog="python -m experiments.bench.collectives")
    p.add_argument("--ops", type=names(OPS, least=0), default=d.ops, help=f"comma list of {', '.join(OPS)} (default all)")
    p.add_argument("--algorithms", type=parsed_by(_names, 'a comma-separated list of algorithms'), default=d.algorithms,
                   help="comma list; each op runs the ones it has (default: all, plus the references "
                        "MPI_<Op>, and ring-direct and ring-execute for all-reduce); FILE.py:FUNCTION or "
                        "module:FUNCTION adds a schedule builder of one's own, verified first")
    p.add_argument("--min-bytes", type=byte_count(), default=d.min_bytes, help="smallest size (default 8)")
    p.add_argument("--max-bytes", type=byte_count(), default=d.max_bytes, help="largest size (default 64M)")
    p.add_argument("--dtype", default=d.dtype, choices=[t.name for t in collectives.backend.DTYPES],
                   help="element type (default float32)")
    p.add_argument("--redop", default=d.redop, choices=list(collectives.backend.OPS),
                   help="reduction of all-reduce and reduce-scatter (default sum)")
    p.add_argument("--iters", type=integer(1, INT32_MAX), help="timed calls at every size (sets both of the next two)")
    p.add_argument("--iters-small", type=integer(1, INT32_MAX), default=d.iters_small, help="timed calls up to --large-bytes (1000)")
    p.add_argument("--iters-large", type=integer(1, INT32_MAX), default=d.iters_large, help="timed calls above --large-bytes (100)")
    p.add_argument("--warmup", type=integer(0, INT32_MAX), help="uncounted calls at every size (sets both of the next two)")
    p.add_argument("--warmup-small", type=integer(0, INT32_MAX), default=d.warmup_small, help="uncounted calls up to --large-bytes (200)")
    p.add_argument("--warmup-large", type=integer(0, INT32_MAX), default=d.warmup_large, help="uncounted calls above --large-bytes (10)")
    p.add_argument("--large-bytes", type=byte_count(), default=d.large_bytes,
                   help="largest size that counts as small (default 8K)")
    p.add_argument("--max-time", type=real(0, 1e15), default=d.max_time,
                   help="seconds one timed loop may take; fewer iterations (at least 3) above it (default: no cap)")
    p.add_argument("--rounds", type=integer(1, INT32_MAX), default=d.rounds,
                   help="split each timed loop into this many segments, the algorithms taking turns (default 1)")
    p.add_argument("--repeats", type=integer(1, INT32_MAX), default=d.repeats,
                   help="passes over the whole sweep, one after another; every row holds the median of the "
                        "passes, ratios their median and range, and sizes whose passes differ by more than "
                        f"{UNSTABLE:.0%}% are flagged (default {d.repeats})")
    p.add_argument("--baseline", choices=["gloo"], default=None, help="add torch.distributed all-reduce on gloo")
    p.add_argument("--format", choices=FORMATS, default=d.format,
                   help="printed output: table (commlab's columns as rows are measured, then the Markdown "
                        "summary) or nccl-tests (at the end, one table per op and algorithm in nccl-tests' "
                        "columns: time as the mean over ranks, out-of-place and in-place groups, the "
                        "in-place calls measured too; default table)")
    p.add_argument("--out", type=outpath(), default=d.out, help=f"path prefix of the .csv and .json results (default {d.out})")
    p.add_argument("--timeline", type=text(), default=d.timeline, metavar="PREFIX",
                   help="after timing each row of a hand-made algorithm, record 10 more calls round by round "
                        "(collectives.engine.timeline): print the slowest rank's rounds and write their "
                        "Chrome/Perfetto trace to PREFIX-OP-ALGORITHM-BYTES.json (default: none)")
    harness.add_options(p)
    return p


def _check_arguments(p, a):
    """Exit through ``p.error`` when the parsed arguments ``a`` name unknown ops or algorithms or bad counts."""
    if not a.ops:
        p.error(f"--ops: no ops to measure (choose from {', '.join(OPS)})")
    if bad := [o for o in a.ops if o not in OPS]:
        p.error(f"--ops: unknown {', '.join(bad)} (choose from {', '.join(OPS)})")
    known = {n for op in a.ops for n in default_algorithms(op)}
    if bad := [n for n in a.algorithms if n not in known]:
        p.error(f"--algorithms: {', '.join(bad)} not an algorithm of {', '.join(a.ops)}")
    if a.algorithms and any(not [n for n in default_algorithms(op) if n in a.algorithms] for op in a.ops):
        p.error("--algorithms: every op in --ops needs at least one of them")
    if not 1 <= a.min_bytes <= a.max_bytes:
        p.error("--min-bytes must be >= 1 and at most --max-bytes")
    if min(a.iters_small, a.iters_large, a.rounds, a.repeats) < 1 or min(a.warmup_small, a.warmup_large) < 0:
        p.error("iterations, --rounds and --repeats must be >= 1 and warm-up >= 0")
    if not (math.isfinite(a.max_time) and a.max_time >= 0):
        p.error(f"--max-time must be a finite number of seconds >= 0, got {a.max_time}")

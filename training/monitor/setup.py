"""The monitoring options of a run: checked on every rank before anything starts, then opened.

Monitoring is on with ``--monitor``, ``--metrics-port PORT`` or ``--tensorboard DIR``. Before the
run directory exists, :func:`check_monitor` finds on every rank alike what would stop it: a
missing library (``prometheus_client``, ``tensorboardX``: the ``monitor`` extra), a TensorBoard
directory that cannot be written, and a metrics port that is taken or cannot be bound on the rank
that serves it (rank 0 tries, and tells the others with one broadcast), so that the job ends with
one message and no rank starts training.
"""
import math
import time

import numpy

from ps.job.settings import parse_rank_spec
from training.monitor.board import check_logdir
from training.monitor.exporter import check_endpoint

__all__ = ["monitoring", "check_monitor", "open_monitor", "open_ps_monitor", "close_monitor", "slow_factor", "arrival",
           "straggler_schedule", "OFF"]

_REASON = 120  # bytes of the bind error broadcast from rank 0


def monitoring(cfg):
    """Return True when ``cfg`` asks for live monitoring (``--monitor``, ``--metrics-port`` or ``--tensorboard``).

    Examples
    --------
    >>> from training.settings.config import Config
    >>> monitoring(Config()), monitoring(Config(metrics_port=9100))
    (False, True)
    """
    return bool(cfg.monitor or cfg.metrics_port or cfg.tensorboard)


def straggler_schedule(spec):
    """Parse ``--straggler``: ``RANK:FACTOR``, or a data-parallel schedule ``RANK:FACTOR,RANK:FACTOR@STEP,...``.

    Each entry names the one slow rank from global step ``STEP`` on (the first entry from step 0,
    ``@STEP`` optional there), until the next entry: ``1:2,0:2@60`` slows rank 1 by 2x for steps
    0-59 and rank 0 from step 60, when rank 1 is back to full speed (a slowdown that moves, which
    ``--balance`` must follow).

    Returns
    -------
    list of (int, int, float)
        ``(from_step, rank, factor)``, steps ascending; ``[]`` for an empty ``spec``.

    Raises
    ------
    ValueError
        An entry that is not ``RANK:FACTOR[@STEP]`` with a rank >= 0 and a finite factor >= 1, or
        steps that do not start at 0 and increase.

    Examples
    --------
    >>> straggler_schedule("1:2,0:3@60")
    [(0, 1, 2.0), (60, 0, 3.0)]
    >>> straggler_schedule("1:2@5")
    Traceback (most recent call last):
    ...
    ValueError: --straggler 1:2@5: the first entry's step must be 0 (steps start at 0 and increase)
    """
    out = []
    for entry in str(spec).split(",") if spec else []:
        head, at, step = entry.strip().partition("@")
        rank, factor = parse_rank_spec(head, "straggler", float)
        try:
            first = int(step) if at else (0 if not out else None)
        except ValueError:
            first = None
        if first is None:
            raise ValueError(f"--straggler {spec}: {entry.strip()!r} needs @STEP, a whole step number (every "
                             "entry after the first says from which step it holds)")
        if rank < 0 or not (factor >= 1 and math.isfinite(factor)):
            raise ValueError(f"--straggler {spec}: rank must be >= 0 and factor a finite number >= 1, got "
                             f"{entry.strip()!r}")
        if (not out and first != 0) or (out and first <= out[-1][0]):
            raise ValueError(f"--straggler {spec}: the {'first' if not out else 'next'} entry's step must be "
                             f"{'0' if not out else f'above {out[-1][0]}'} (steps start at 0 and increase)")
        out.append((first, rank, factor))
    return out


def slow_factor(cfg, rank, step=0):
    """Return this rank's step-time multiplier under ``--straggler`` at global step ``step`` (1.0 if not slowed).

    Examples
    --------
    >>> from training.settings.config import Config
    >>> slow_factor(Config(straggler="2:4"), 2), slow_factor(Config(straggler="2:4"), 1)
    (4.0, 1.0)
    >>> [slow_factor(Config(straggler="1:2,0:2@3"), 0, s) for s in (2, 3)]
    [1.0, 2.0]
    """
    now = [e for e in straggler_schedule(cfg.straggler) if e[0] <= step]
    return now[-1][2] if now and now[-1][1] == rank else 1.0


def check_monitor(cfg, comm):
    """Raise on every rank of ``comm`` alike when the monitoring options cannot work (collective).

    Raises
    ------
    ImportError
        ``--metrics-port`` without ``prometheus_client``, ``--tensorboard`` without ``tensorboardX``.
    ValueError
        ``--tensorboard`` cannot be written; ``--metrics-host``:``--metrics-port`` cannot be bound on
        rank 0 (in use, or not an address of this host); ``--straggler`` names no rank of the job.
    """
    if cfg.straggler and cfg.mode == "dp":
        for _, target, _ in straggler_schedule(cfg.straggler):
            if not 0 <= target < comm.Get_size():
                raise ValueError(f"--straggler {cfg.straggler}: rank {target} is not a rank of this job "
                                 f"(0..{comm.Get_size() - 1})")
    if cfg.tensorboard:
        import importlib.util

        if importlib.util.find_spec("tensorboardX") is None:
            raise ImportError("--tensorboard needs tensorboardX; install the monitor extra: pip install -e '.[monitor]'")
        check_logdir(cfg.tensorboard)
    if not cfg.metrics_port:
        return
    try:
        import prometheus_client  # noqa: F401
    except ImportError as e:
        raise ImportError(f"--metrics-port needs prometheus_client ({e}); install the monitor extra: "
                          "pip install -e '.[monitor]'") from None
    reason = numpy.zeros(_REASON, numpy.uint8)
    if comm.Get_rank() == 0:
        text = check_endpoint(cfg.metrics_host, cfg.metrics_port).encode()[:_REASON]
        reason[:len(text)] = numpy.frombuffer(text, numpy.uint8)
    comm.Bcast(reason, root=0)
    text = bytes(reason).rstrip(b"\0").decode(errors="replace")
    if text:
        raise ValueError(f"--metrics-port {cfg.metrics_port}: cannot serve the metrics on "
                         f"{cfg.metrics_host}:{cfg.metrics_port} ({text}); choose a free port, or --monitor "
                         f"without an endpoint")


class _Off:
    """The monitor of a run without monitoring: does nothing."""

    arrive = None  # train_step sends no heartbeat

    def step(self, step, r):
        """Do nothing."""

    def close(self):
        """Return no findings."""
        return {}


#: The monitor of a run without monitoring.
OFF = _Off()


def open_monitor(cfg, comm, run_dir):
    """Return the monitor of a synchronous run (collective when monitoring is on), else :data:`OFF`.

    Returns
    -------
    training.monitor.sync.SyncMonitor or OFF
    """
    if not monitoring(cfg):
        return OFF
    from training.monitor.sync import SyncMonitor

    return SyncMonitor(cfg, comm, run_dir)


def open_ps_monitor(cfg, comm, run_dir):
    """Return the monitor of a parameter-server run (collective when monitoring is on), else None.

    Returns
    -------
    training.monitor.ps_reports.PSMonitor or None
    """
    if not monitoring(cfg):
        return None
    from training.monitor.ps_reports import PSMonitor

    return PSMonitor(cfg, comm, run_dir)


def close_monitor(monitor):
    """Close a parameter-server run's monitor (None: nothing); return its findings (rank 0), else ``{}``."""
    return {} if monitor is None else monitor.close()


def arrival(monitor, slow=1.0, jitter=0.0, rng=None):
    """Return the ``arrive`` of :func:`training.dp.data_parallel.train_step` for this rank, or None.

    ``arrive(compute_s)`` sleeps ``slow - 1`` times the step's compute so far (``--straggler``, from
    :func:`slow_factor`; ``slow`` a number, or a function returning the factor at the time of the
    call, for a slowdown that moves) plus a uniform ``[0, jitter]`` seconds drawn from ``rng`` (``--jitter``, as
    the parameter server's workers sleep; a generator seeded per rank, so that runs repeat), then
    sends ``monitor``'s heartbeat; None when none applies.

    Examples
    --------
    >>> arrival(OFF) is None
    True
    >>> arrive = arrival(OFF, slow=3.0)
    >>> t = time.perf_counter(); arrive(0.01); 0.02 <= time.perf_counter() - t < 1.0
    True
    """
    beat = monitor.arrive
    if not callable(slow) and slow <= 1 and not jitter:
        return None if beat is None else (lambda compute_s: beat())
    rng = rng if rng is not None else numpy.random.default_rng()

    def arrive(compute_s):
        factor = slow() if callable(slow) else slow
        time.sleep(max(0.0, factor - 1) * compute_s + (rng.uniform(0.0, jitter) if jitter else 0.0))
        if beat is not None:
            beat()

    return arrive

"""The monitoring options of a run: checked on every rank before anything starts, then opened.

Monitoring is on with ``--monitor``, ``--metrics-port PORT`` or ``--tensorboard DIR``. Before the
run directory exists, :func:`check_monitor` finds on every rank alike what would stop it: a
missing library (``prometheus_client``, ``tensorboardX``: the ``monitor`` extra), a TensorBoard
directory that cannot be written, and a metrics port that is taken or cannot be bound on the rank
that serves it (rank 0 tries, and tells the others with one broadcast), so that the job ends with
one message and no rank starts training.
"""
import time

import numpy

from ps.job.settings import parse_rank_spec
from training.monitor.board import check_logdir
from training.monitor.exporter import check_endpoint

__all__ = ["monitoring", "check_monitor", "open_monitor", "open_ps_monitor", "close_monitor", "slow_factor", "arrival",
           "OFF"]

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


def slow_factor(cfg, rank):
    """Return this rank's step-time multiplier of ``--straggler RANK:FACTOR`` (1.0 for the other ranks).

    Examples
    --------
    >>> from training.settings.config import Config
    >>> slow_factor(Config(straggler="2:4"), 2), slow_factor(Config(straggler="2:4"), 1)
    (4.0, 1.0)
    """
    if not cfg.straggler:
        return 1.0
    target, factor = parse_rank_spec(cfg.straggler, "straggler", float)
    return factor if target == rank else 1.0


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
        target, _ = parse_rank_spec(cfg.straggler, "straggler", float)
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
    :func:`slow_factor`) plus a uniform ``[0, jitter]`` seconds drawn from ``rng`` (``--jitter``, as
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
    if slow <= 1 and not jitter:
        return None if beat is None else (lambda compute_s: beat())
    rng = rng if rng is not None else numpy.random.default_rng()

    def arrive(compute_s):
        time.sleep(max(0.0, slow - 1) * compute_s + (rng.uniform(0.0, jitter) if jitter else 0.0))
        if beat is not None:
            beat()

    return arrive

"""Settings of a parameter-server run and the parsers of its fault/heterogeneity specs.

Every check raises on every rank before any message is sent, so a bad setting never hangs a job.
"""
import math
from dataclasses import dataclass

from ps.serving.consistency import CONSISTENCY

__all__ = ["PSOptions", "CONFLICTS", "parse_rank_spec"]

#: Conflict policies of ASP and SSP (``conflict``): ``accept`` applies every push; ``cas`` refuses a
#: push whose base version is more than ``conflict_lag`` versions behind the shard's (the worker pulls,
#: recomputes and pushes again: optimistic concurrency, compare-and-swap on the version); ``scale``
#: divides the step by the gradient's staleness (Zhang et al. 2016, the same as ``staleness_lr``).
CONFLICTS = ("accept", "cas", "scale")


@dataclass
class PSOptions:
    """Resolved settings of one parameter-server run.

    Raises
    ------
    ValueError
        From :meth:`validate`, naming the offending field.

    Examples
    --------
    >>> opts = PSOptions(servers=1, consistency="ssp", staleness=1, budget=20)
    >>> opts.validate(size=3)  # one server, two workers
    >>> PSOptions(servers=2).validate(size=2)
    Traceback (most recent call last):
    ...
    ValueError: servers must be in [1, 1] so that at least one worker remains on 2 ranks, got 2
    >>> PSOptions(servers=2, replicas=2).shards  # one shard on a chain of two server ranks
    1
    """

    servers: int = 1                # number of server ranks S (the first S ranks of the communicator)
    consistency: str = "bsp"        # "bsp", "asp" or "ssp"
    staleness: int = 2              # SSP bound s (clocks)
    staleness_lr: bool = False      # divide the step by max(1, tau) (Zhang et al. 2016)
    budget: int = 100               # pushes (worker gradients) the servers apply before STOP
    lr: float = 0.1                 # base learning rate (dimensionless step size); the update rule
                                    # itself is the optimizer given to ps.job.runner.run
    lr_at: object = None            # the caller's schedule, lr_at(pushes, horizon) -> step size; None: lr
    horizon: int = 0                # pushes over which the schedule runs (0: the budget)
    ps_timeout: float = 30.0        # a worker silent this long is dropped (seconds)
    straggler: str = ""             # "RANK:FACTOR": that worker's step takes FACTOR x its compute time
    jitter: float = 0.0             # extra delay per step, uniform in [0, jitter] (seconds)
    delay_prob: float = 0.0         # transient delays: each worker, each clock, sleeps delay_s with
                                    # this probability (Cui et al., USENIX ATC 2014) (probability)
    delay_s: float = 0.0            # length of one transient delay (seconds)
    fail_worker: str = ""           # "RANK:STEP": that worker stops communicating before step STEP
    worker_batch: int = 1           # nominal batch of one worker per clock (samples); balancing
                                    # keeps the global batch W x worker_batch
    global_batch: int = 0           # samples per clock over all workers, split by ps.shards.key_ranges.proportional
                                    # (any W: 64 over 3 is 22/21/21); 0: W x worker_batch
    max_batch: int = 0              # largest batch balancing gives one worker (samples: its memory bound; 0: none)
    balance: bool = False           # give faster workers larger batches (speed measured online)
    balance_every: int = 10         # clocks between speed reports when balancing (clocks)
    snapshot_every: int = 0         # keep a copy of the shards every this many pushes (0: never)
    checkpoint_dir: str = ""        # directory of the server checkpoints ("" : none)
    checkpoint_every_pushes: int = 0  # checkpoint every this many pushes (0: at the end only)
    resume_dir: str = ""            # directory of server checkpoints to resume from ("" : fresh)
    run_id: str = ""                # the run's id: written into every server checkpoint, and required
                                    # of the checkpoint resumed from ("" : none, not checked)
    allow_foreign: bool = False     # resume from a checkpoint that another run wrote
    seed: int = 0                   # seed of the jitter draws (seconds of delay)
    conflict: str = "accept"        # ASP/SSP conflict policy: "accept", "cas" or "scale" (CONFLICTS)
    conflict_lag: int = 0           # cas: largest accepted lag of a push's base version (versions)
    retries: int = 0                # resends of a request that gets no answer (0: none)
    retry_s: float = 1.0            # first wait for an answer before a resend, doubling (seconds)
    drop_replies: float = 0.0       # fault injection: fraction of pull replies a server drops once
    late_replies: float = 0.0       # fault injection: fraction of pull replies sent late_s late
    late_s: float = 0.0             # fault injection: delay of a late reply (seconds)
    replicas: int = 1               # server ranks holding each shard (a chain: primary, then backups)

    @property
    def shards(self):
        """Number of shards: ``servers / replicas`` (each held by ``replicas`` consecutive server ranks)."""
        return self.servers // max(1, self.replicas)

    def validate(self, size):
        """Check every field against a communicator of ``size`` ranks.

        Parameters
        ----------
        size : int
            Number of ranks in the communicator (servers plus workers).

        Raises
        ------
        ValueError
            Naming the first field that is out of range.
        """
        if size < 2:
            raise ValueError(f"a parameter-server job needs at least 2 ranks (a server and a worker), got {size}")
        if not 1 <= self.servers < size:
            raise ValueError(f"servers must be in [1, {size - 1}] so that at least one worker remains "
                             f"on {size} ranks, got {self.servers}")
        self._check_replicas()
        if not isinstance(self.run_id, str):
            raise ValueError(f"run_id must be a str, got {self.run_id!r}")
        if self.consistency not in CONSISTENCY:
            raise ValueError(f"consistency must be one of {CONSISTENCY}, got {self.consistency!r}")
        if self.conflict not in CONFLICTS:
            raise ValueError(f"conflict must be one of {CONFLICTS}, got {self.conflict!r}")
        if self.conflict != "accept" and self.consistency == "bsp":
            raise ValueError(f"conflict {self.conflict!r} needs asp or ssp: under bsp every push of a clock is "
                             "computed from the same version, so none conflicts")
        if self.conflict_lag < 0 or self.retries < 0:
            raise ValueError(f"conflict_lag and retries must be >= 0, got {self.conflict_lag}, {self.retries}")
        if not (self.retry_s > 0 and math.isfinite(self.retry_s)):
            raise ValueError(f"retry_s must be a positive number of seconds, got {self.retry_s}")
        for name in ("drop_replies", "late_replies"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be a fraction in [0, 1), got {getattr(self, name)}")
        if not (self.late_s >= 0 and math.isfinite(self.late_s)):
            raise ValueError(f"late_s must be >= 0 seconds, got {self.late_s}")
        if self.staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {self.staleness}")
        if self.budget < 0:
            raise ValueError(f"budget must be >= 0, got {self.budget}")
        if not (self.ps_timeout > 0 and math.isfinite(self.ps_timeout)):
            raise ValueError(f"ps_timeout must be a positive number of seconds, got {self.ps_timeout}")
        for name in ("lr", "jitter", "delay_prob", "delay_s"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.jitter < 0:
            raise ValueError(f"jitter must be >= 0 seconds, got {self.jitter}")
        if not 0.0 <= self.delay_prob <= 1.0:
            raise ValueError(f"delay_prob must be a probability in [0, 1], got {self.delay_prob}")
        if self.delay_s < 0:
            raise ValueError(f"delay_s must be >= 0 seconds, got {self.delay_s}")
        if self.worker_batch < 1:
            raise ValueError(f"worker_batch must be >= 1, got {self.worker_batch}")
        if self.global_batch < 0 or self.max_batch < 0:
            raise ValueError(f"global_batch and max_batch must be >= 0 samples, got {self.global_batch}, "
                             f"{self.max_batch}")
        if self.balance_every < 1:
            raise ValueError(f"balance_every must be >= 1, got {self.balance_every}")
        if self.snapshot_every < 0 or self.checkpoint_every_pushes < 0:
            raise ValueError("snapshot_every and checkpoint_every_pushes must be >= 0")
        for name, kind in (("straggler", float), ("fail_worker", int)):
            spec = getattr(self, name)
            if name == "straggler" and ("," in str(spec) or "@" in str(spec)):
                raise ValueError(f"straggler {spec!r}: a slowdown that moves (RANK:FACTOR,RANK:FACTOR@STEP) is for "
                                 "data-parallel training; the parameter server takes one RANK:FACTOR")
            if spec:
                rank, value = parse_rank_spec(spec, name, kind)
                if not self.servers <= rank < size:
                    raise ValueError(f"{name} rank must be a worker rank in [{self.servers}, {size - 1}], "
                                     f"got {rank}")
                if name == "straggler" and not (value >= 1 and math.isfinite(value)):
                    raise ValueError(f"straggler factor must be a finite number >= 1, got {value}")
                if name == "fail_worker" and value < 0:
                    raise ValueError(f"fail_worker step must be >= 0, got {value}")

    def _check_replicas(self):
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 1:
            raise ValueError(f"replicas (--ps-replicas) must be an integer >= 1, got {self.replicas!r}")
        if self.replicas > self.servers:
            raise ValueError(f"replicas (--ps-replicas) {self.replicas} is larger than the servers "
                             f"(--servers) {self.servers}: each shard needs that many server ranks")
        if self.servers % self.replicas:
            raise ValueError(f"replicas (--ps-replicas) {self.replicas} must divide the servers (--servers) "
                             f"{self.servers}: each shard is held by that many consecutive server ranks")
        if self.replicas > 1 and (self.balance or self.conflict == "cas"):
            raise ValueError("replicas (--ps-replicas) > 1 works without --balance and --ps-conflict cas: "
                             "the primary alone would hold their state")


def parse_rank_spec(spec, name, kind):
    """Split ``"RANK:VALUE"`` into ``(int rank, kind(value))``.

    Parameters
    ----------
    spec : str
        Text such as ``"2:4"`` (``--straggler``) or ``"3:10"`` (``--fail-worker``).
    name : str
        Option name used in the error message.
    kind : type
        ``int`` or ``float``, the type of VALUE.

    Returns
    -------
    tuple of (int, int or float)

    Raises
    ------
    ValueError
        When ``spec`` is not ``RANK:VALUE`` with numbers.

    Examples
    --------
    >>> parse_rank_spec("2:4", "straggler", float)
    (2, 4.0)
    >>> parse_rank_spec("3", "fail_worker", int)
    Traceback (most recent call last):
    ...
    ValueError: fail_worker must be RANK:STEP, got '3'
    """
    rank, sep, value = str(spec).partition(":")
    try:
        if not sep:
            raise ValueError
        return int(rank), kind(value)
    except ValueError:
        raise ValueError(f"{name} must be RANK:{'FACTOR' if kind is float else 'STEP'}, got {spec!r}") from None

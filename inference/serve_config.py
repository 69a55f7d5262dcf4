"""Serving configuration: one dataclass, a comment per field with its unit, checked on every rank."""
import dataclasses
import math
from dataclasses import dataclass

from inference.policies.balance import POLICIES

__all__ = ["ServeConfig", "parse_pair", "parse_pairs"]


def parse_pair(text, name, kind):
    """Parse ``"REPLICA:VALUE"`` into ``(int, kind(VALUE))``, or ``None`` for ``""``.

    Raises
    ------
    ValueError
        Naming ``name`` when the text is not of that form.
    """
    if not text:
        return None
    head, sep, tail = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return int(head), kind(tail)
    except ValueError:
        raise ValueError(f"{name} must be REPLICA:{kind.__name__.upper()}, got {text!r}") from None


def parse_pairs(text, name, kind):
    """Parse ``"R:V[,R:V...]"`` into a dict ``{R: kind(V)}`` (empty for ``""``).

    Raises
    ------
    ValueError
        Naming ``name`` when an item is malformed or a replica appears twice.
    """
    out = {}
    for item in filter(None, text.split(",")):
        r, v = parse_pair(item, name, kind)
        if r in out:
            raise ValueError(f"{name}: replica {r} given twice in {text!r}")
        out[r] = v
    return out


#: Bytes the front keeps per request of a load test (its record, arrival and answer), for the memory check.
_RECORD_BYTES = 2048


@dataclass
class ServeConfig:
    """Resolved configuration of one serving job.

    Raises
    ------
    ValueError
        From :meth:`validate`, naming the offending field.
    """

    checkpoint: str = ""              # training run directory (newest checkpoint) or .npz file
    replicas: int = 1                 # model replicas R; the job needs 1 + R * T ranks
    tensor_parallel: int = 1          # ranks per replica T (tensor-parallel degree)
    balance: str = "least-outstanding"  # round-robin, least-outstanding or power-of-two
    requests: int = 1000              # requests the load generator sends
    rate: float = 200.0               # open-loop Poisson arrival rate (requests/s)
    clients: int = 0                  # closed-loop concurrent clients (0: open loop at --rate)
    malformed: int = 0                # how many of the requests are malformed
    max_batch: int = 8                # dynamic batching: largest batch (requests)
    max_wait_ms: float = 2.0          # dynamic batching: longest wait of the oldest request (ms)
    straggler: str = ""               # slow replicas "REPLICA:FACTOR[,...]" (service-time multiplier)
    service_ms: float = 0.0           # emulated accelerator time per batch (ms), slept by the replica
    fail_replica: str = ""            # replicas that stop answering "REPLICA:BATCHES[,...]"
    replica_timeout: float = 2.0      # remove a busy replica silent this long (s)
    algorithm: str = "auto"           # tensor-parallel all-reduce algorithm (collectives.ALGORITHMS)
    inflight: int = 1                 # batches a replica holds at once; the rest wait and merge at the front
    slo_ms: float = 0.0               # latency objective (ms): AIMD batch size, early refusal (0: none)
    max_queue: int = 1024             # requests that may wait at the front; more are refused (HTTP 503)
    fail_front: int = -1              # raise on the front after this many batches (fault injection; -1: never)
    http: int = -1                    # HTTP port on the front rank (0: any free port; -1: load test)
    host: str = "127.0.0.1"           # address the HTTP server binds
    model_name: str = "model"         # the model's name in the Open Inference Protocol's routes
    max_body_bytes: int = 1 << 20     # largest request body (bytes); larger ones get 413
    read_timeout: float = 5.0         # seconds a request body may take to arrive (else 408), and a request head
    max_connections: int = 1024       # HTTP connections served at once; a request on one more gets 503
    seed: int = 0                     # seed of arrivals, test rows and power-of-two draws
    run_dir: str = "runs/serve"       # output directory (summary.json, requests.jsonl, config.json)

    def to_dict(self):
        """Return the configuration as a JSON-ready dict."""
        return dataclasses.asdict(self)

    def validate(self, world_size=None):
        """Check every field; with ``world_size``, also that the job has 1 + R * T ranks.

        Raises
        ------
        ValueError
            Naming the first field out of range.
        """
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"{f.name} must be a finite number, got {v!r}")
        if not self.checkpoint:
            raise ValueError("checkpoint must name a training run directory or checkpoint file (--checkpoint)")
        for name in ("replicas", "tensor_parallel", "requests", "max_batch", "inflight", "max_queue",
                     "max_body_bytes", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.max_queue > 2 ** 20 or self.max_batch > self.max_queue:
            raise ValueError(f"max_batch ({self.max_batch}) must be at most max_queue ({self.max_queue}), itself at "
                             f"most {2 ** 20}: a batch is made of requests waiting at the front, whose buffers of "
                             "max_batch rows per replica are made before the first request")
        from training.ctr.data import available_bytes  # pure NumPy

        if self.requests * _RECORD_BYTES > available_bytes():
            raise ValueError(f"requests ({self.requests}) would need {self.requests * _RECORD_BYTES / 2 ** 30:.1f} GiB "
                             f"for their records ({_RECORD_BYTES} bytes each), more than this node has free")
        if self.balance not in POLICIES:
            raise ValueError(f"balance must be one of {', '.join(POLICIES)}, got {self.balance!r}")
        if self.clients < 0 or not 0 <= self.malformed <= self.requests:
            raise ValueError("clients must be >= 0 and malformed in [0, requests]")
        if self.clients == 0 and not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s for the open loop, got {self.rate!r}")
        if self.max_wait_ms < 0 or self.service_ms < 0 or not self.replica_timeout > 0:
            raise ValueError("max_wait_ms and service_ms must be >= 0 and replica_timeout > 0")
        if self.slo_ms < 0 or (self.slo_ms and self.slo_ms <= self.service_ms * max(
                parse_pairs(self.straggler, "straggler", float).values(), default=1.0)):
            raise ValueError(f"slo_ms must be 0 (none) or exceed one batch's service time (--service-ms "
                             f"{self.service_ms:g} x the slowest straggler factor), got {self.slo_ms!r}")
        if not self.read_timeout > 0:
            raise ValueError(f"read_timeout must be > 0 seconds, got {self.read_timeout!r}")
        if not self.model_name or not self.model_name.replace("_", "").replace("-", "").replace(".", "").isalnum():
            raise ValueError(f"model_name must be letters, digits, '_', '-' or '.', got {self.model_name!r}")
        if self.http < -1 or self.http > 65535:
            raise ValueError(f"http must be a TCP port (0: any free one) or -1, got {self.http!r}")
        for name, kind in (("straggler", float), ("fail_replica", int)):
            for r, v in parse_pairs(getattr(self, name), name, kind).items():
                if not 0 <= r < self.replicas:
                    raise ValueError(f"{name}: replica {r} does not exist (replicas 0..{self.replicas - 1})")
                if v < 1 if kind is float else v < 0:
                    raise ValueError(f"{name}: {'factor must be >= 1' if kind is float else 'batches must be >= 0'}, "
                                     f"got {v!r}")
        from collectives import ALGORITHMS

        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        need = 1 + self.replicas * self.tensor_parallel
        if world_size is not None and world_size != need:
            raise ValueError(f"--replicas {self.replicas} x --tensor-parallel {self.tensor_parallel} needs "
                             f"1 + {self.replicas} * {self.tensor_parallel} = {need} ranks, the job has {world_size}")

"""The configuration a prediction is made for: one dataclass, read from JSON or ``KEY=VALUE`` pairs.

A configuration file holds one JSON object, or a list of them (each predicted in turn); on the
command line ``--config algorithm=torus bucket_bytes=4194304 overlap=true`` sets fields directly.
Unknown keys and bad values are one :class:`ValueError` line naming the field.
"""
from dataclasses import asdict, dataclass, field, fields

from collectives.compression.catalog import COMPRESSORS, parse_literal
from collectives.schedules.registry import REGISTRY, load_algorithm

from training.predict.files import read_json

__all__ = ["JobConfig", "ALGORITHMS", "parse", "load", "from_pairs"]

#: All-reduce algorithms the predictor replays (those with schedules).
ALGORITHMS = tuple(a.name for a in REGISTRY.values() if a.allreduce_builder is not None)


@dataclass
class JobConfig:
    """One configuration of a training step (fields with their units)."""

    name: str = ""                   # a label for tables ("" : built from the fields)
    mode: str = "dp"                 # dp (all-reduce) or ps (parameter server)
    algorithm: str = "ring"          # all-reduce algorithm with schedules (ALGORITHMS, registered, FILE.py:FUNCTION)
    grid: object = None              # 2d / torus grid: list of ints, "topology", or None (the default grid)
    bucket_bytes: int = 0            # gradient bucket size (bytes), 0: one fused all-reduce
    overlap: bool = False            # start each bucket's all-reduce during the backward pass
    progress: str = "tests"          # overlap progress: "tests" (commlab's executor: a round per test between
                                     # layers) or "continuous" (a progress engine, e.g. NCCL's)
    compression: str = "none"        # compressor (a key of collectives.compression.COMPRESSORS)
    compression_args: dict = field(default_factory=dict)  # its arguments (as in the profile's codecs)
    servers: int = 1                 # ps: server ranks S (the first S ranks)
    tensor_parallel: int = 1         # T: ranks sharing each layer
    pipeline_parallel: int = 1       # Q: pipeline stages
    micro_batches: int = 1           # m: micro-batches per step (pipeline)
    schedule: str = "1f1b"           # pipeline schedule: 1f1b or gpipe
    batch_size: int = 0              # global batch (samples); 0: the profile's rows per data-parallel rank

    def label(self):
        """Return :attr:`name`, or a short description built from the fields."""
        if self.name:
            return self.name
        if self.mode == "ps":
            return f"ps S={self.servers}"
        parts = [self.algorithm + (f"{list(self.grid)}" if isinstance(self.grid, (list, tuple)) else "")]
        if self.bucket_bytes:
            parts.append(f"b={self.bucket_bytes >> 20}MiB" if self.bucket_bytes >= 1 << 20
                         else f"b={self.bucket_bytes >> 10}KiB")
        if self.overlap:
            parts.append("overlap")
        if self.compression != "none":
            parts.append(self.compression)
        if self.tensor_parallel > 1 or self.pipeline_parallel > 1:
            parts.append(f"T{self.tensor_parallel}xQ{self.pipeline_parallel}m{self.micro_batches}")
        return " ".join(parts)

    def to_dict(self):
        """Return the fields as a JSON-ready dict."""
        return asdict(self)


def _bad(key, what, v):
    return ValueError(f"config field {key!r} {what}, got {v!r}")


def parse(doc):
    """Check one configuration object and return its :class:`JobConfig`.

    Raises
    ------
    ValueError
        The first unknown key or bad value, named.

    Examples
    --------
    >>> parse({"algorithm": "torus", "grid": "topology", "overlap": True}).label()
    'torus overlap'
    >>> parse({"bucket_bytes": -1})
    Traceback (most recent call last):
    ...
    ValueError: config field 'bucket_bytes' must be an integer >= 0, got -1
    """
    if not isinstance(doc, dict):
        raise ValueError(f"a configuration is a JSON object, got {type(doc).__name__}")
    names = [f.name for f in fields(JobConfig)]
    for key in doc:
        if key not in names:
            raise ValueError(f"config field {key!r} is unknown; accepted: {', '.join(names)}")
    if isinstance(doc.get("algorithm"), str) and ":" in doc["algorithm"]:  # FILE.py:FUNCTION, module:FUNCTION
        doc = dict(doc, algorithm=load_algorithm(doc["algorithm"]))  # verified and registered first
    cfg = JobConfig(**doc)
    hand_made = tuple(a.name for a in REGISTRY.values() if a.allreduce_builder is not None)  # registered ones too
    choices = {"mode": ("dp", "ps"), "algorithm": hand_made, "progress": ("tests", "continuous"),
               "compression": tuple(COMPRESSORS), "schedule": ("1f1b", "gpipe")}
    for key, allowed in choices.items():
        if getattr(cfg, key) not in allowed:
            raise _bad(key, f"must be one of {', '.join(allowed)}", getattr(cfg, key))
    for key, low in (("bucket_bytes", 0), ("servers", 1), ("tensor_parallel", 1), ("pipeline_parallel", 1),
                     ("micro_batches", 1), ("batch_size", 0)):
        v = getattr(cfg, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise _bad(key, f"must be an integer >= {low}", v)
    if not isinstance(cfg.overlap, bool):
        raise _bad("overlap", "must be true or false", cfg.overlap)
    if not isinstance(cfg.compression_args, dict):
        raise _bad("compression_args", "must be an object", cfg.compression_args)
    g = cfg.grid
    if g is not None and g != "topology":
        if (not isinstance(g, (list, tuple)) or not g
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in g)):
            raise _bad("grid", "must be a list of positive integers, \"topology\" or null", g)
        cfg.grid = tuple(g)
    if cfg.mode == "ps" and (cfg.tensor_parallel > 1 or cfg.pipeline_parallel > 1 or cfg.compression != "none"):
        raise _bad("mode", "ps takes no tensor or pipeline grid and no compressor", cfg.mode)
    if cfg.compression != "none" and (cfg.overlap or cfg.bucket_bytes):
        raise _bad("compression", "runs on the whole gradient after the backward pass (no buckets, no overlap)",
                   cfg.compression)
    return cfg


def load(path):
    """Read a configuration file (one object or a list); return a list of :class:`JobConfig`.

    Raises
    ------
    ValueError
        Not JSON, or a bad entry (``PATH[i]: config field ...``).
    """
    doc = read_json(path)
    docs = doc if isinstance(doc, list) else [doc]
    if not docs:
        raise ValueError(f"{path}: an empty list of configurations: give at least one")
    out = []
    for i, d in enumerate(docs):
        try:
            out.append(parse(d))
        except ValueError as e:
            raise ValueError(f"{path}[{i}]: {e}" if isinstance(doc, list) else f"{path}: {e}") from None
    return out


def from_pairs(pairs):
    """Return the one :class:`JobConfig` that ``KEY=VALUE`` strings set (values read as literals).

    Examples
    --------
    >>> from_pairs(["algorithm=2d", "bucket_bytes=1048576", "overlap=true"]).label()
    '2d b=1MiB overlap'
    """
    doc = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"config item {item!r} is not KEY=VALUE")
        v = parse_literal(value)
        doc[key.strip()] = list(v) if isinstance(v, tuple) else v
    return parse(doc)

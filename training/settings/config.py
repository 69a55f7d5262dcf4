"""Training configuration: one dataclass and its JSON form (the command line is :mod:`training.settings.cli`).

Every field carries a comment with its unit. The command line maps one flag onto each field
(``--batch-size`` -> ``batch_size``); only the flags a user gives override the defaults (or, with
``--resume``, the configuration saved in the run directory). Unknown keys are rejected.
"""
import dataclasses
import math
import os
from dataclasses import dataclass, field

__all__ = ["Config", "CHOICES"]

#: Allowed values of the fields that take a name.
CHOICES = {
    "mode": ("dp", "ps", "hybrid"),
    "model": ("mlp", "ctr"),
    "ctr_sharding": ("hash", "range"),
    "data": ("digits", "mnist", "synthetic"),
    "activation": ("relu", "tanh"),
    "dtype": ("float32", "float64"),
    "device": ("cpu", "gpu"),
    "optimizer": ("adam", "sgd", "adagrad"),
    "lr_schedule": ("constant", "cosine"),
    "consistency": ("bsp", "asp", "ssp"),
    "schedule": ("1f1b", "gpipe"),
    "ps_conflict": ("accept", "cas", "scale"),
}


@dataclass
class Config:
    """Resolved configuration of one training run (see ``HELP`` for what each field means).

    Raises
    ------
    ValueError
        From :meth:`validate` or :meth:`from_dict`, naming the offending field.
    """

    # --- what runs
    mode: str = "dp"                  # "dp" (data-parallel all-reduce), "ps" (parameter server), "hybrid" (ctr)
    model: str = "mlp"                # mlp (dense features) or ctr (embedding tables + MLP, docs/guide/ctr.md)
    # --- data
    data: str = "digits"              # data set: digits (embedded), mnist (IDX files), synthetic
    data_dir: str = ""                # directory holding the MNIST IDX files (gz or raw)
    test_fraction: float = 0.2        # fraction of samples held out for test (digits, synthetic)
    samples: int = 20000              # synthetic: number of samples
    features: int = 256               # synthetic: features per sample
    classes: int = 10                 # synthetic: number of classes
    # --- model
    hidden: tuple = (512,)            # hidden layer widths (units), empty for a linear model
    activation: str = "relu"          # hidden activation: relu (He init) or tanh (Glorot init)
    dtype: str = "float32"            # parameter and activation dtype
    device: str = "cpu"               # cpu (NumPy) or gpu (CuPy, one device per rank)
    # --- optimization
    epochs: int = 40                  # passes over the training set
    stop_after: int = 0               # stop after this epoch (0: run all epochs); resume later
    batch_size: int = 64              # global batch (samples), split across the P ranks (equal shares; --balance: by speed)
    optimizer: str = "adam"           # adam or sgd (with momentum)
    lr: float = 1e-3                  # learning rate (step size, dimensionless)
    lr_schedule: str = "cosine"       # constant, or cosine decay to 0 over all epochs
    momentum: float = 0.9             # SGD momentum coefficient
    weight_decay: float = 0.0         # L2 penalty coefficient added to the gradient
    beta1: float = 0.9                # Adam first-moment decay
    beta2: float = 0.999              # Adam second-moment decay
    eps: float = 1e-8                 # Adam denominator floor
    seed: int = 0                     # seed of initialization, split and shuffling
    shuffle: bool = True              # reshuffle the training set every epoch (seed + epoch)
    drop_last: bool = False           # drop the tail instead of padding to a multiple of P
    # --- communication
    algorithm: str = "auto"           # all-reduce algorithm, one of collectives.ALGORITHMS, or FILE.py:FUNCTION
    bucket_bytes: int = 0             # gradient bucket size (bytes), 0: one fused all-reduce
    overlap: bool = False             # start each bucket's all-reduce during the backward pass (DDP)
    compression: str = "none"         # gradient compressor name, "none" for plain all-reduce
    compression_args: dict = field(default_factory=dict)  # compressor keyword arguments
    timeout: float = 300.0            # a collective waiting this long on a silent peer ends the job (seconds)
    elastic: bool = False             # ULFM: the survivors of a dead rank shrink and keep training (docs/guide/elastic.md)
    elastic_min: int = 1              # --elastic: fewest ranks that keep training; below it, checkpoint and stop (ranks)
    elastic_respawn: bool = False     # --elastic: start a replacement (MPI_Comm_spawn) for each lost rank
    # --- the ctr model (training.ctr; docs/guide/ctr.md)
    ctr_rows: int = 100000            # embedding rows in all tables together (rows)
    ctr_tables: int = 8               # categorical features, one embedding table each
    ctr_dim: int = 16                 # embedding dimension (elements per row)
    ctr_bag: int = 2                  # ids per feature and sample, mean-pooled (ids)
    ctr_train: int = 400000           # synthetic training samples
    ctr_test: int = 200000            # synthetic test samples
    ctr_sharding: str = "hash"        # rows over the servers: hash or range (key ranges)
    ctr_hot: int = 0                  # hottest rows split column-wise over all servers (rows; 0: none)
    memory_gb: float = 0.0            # memory a rank may use (GiB): ctr model (0: what the node has free); dp/ps batch shares (0: no bound)
    # --- model parallelism (mode "dp" with tensor_parallel * pipeline_parallel > 1)
    tensor_parallel: int = 1          # T: ranks sharing each layer (Megatron column/row split)
    pipeline_parallel: int = 1        # Q: pipeline stages (consecutive layers per stage)
    micro_batches: int = 1            # micro-batches per data-parallel replica's batch per step
    schedule: str = "1f1b"            # pipeline schedule: 1f1b (PipeDream-Flush) or gpipe
    # --- parameter server (mode "ps")
    servers: int = 1                  # number of server ranks
    consistency: str = "bsp"          # bsp, asp or ssp
    staleness: int = 2                # SSP staleness bound (clocks)
    staleness_lr: bool = False        # divide the step by max(1, staleness in clocks)
    straggler: str = ""               # slow rank or worker "RANK:FACTOR" (step time multiplier)
    jitter: float = 0.0               # extra delay per step, uniform in [0, jitter] (seconds)
    ps_timeout: float = 30.0          # drop a worker silent this long (seconds)
    ps_conflict: str = "accept"       # ASP/SSP conflict policy: accept, cas or scale
    ps_conflict_lag: int = 0          # cas: largest accepted lag of a push's base version (versions)
    ps_retries: int = 0               # resends of an unanswered push/pull, applied once by the servers
    ps_replicas: int = 1              # server ranks holding each shard (a chain; --servers / this = shards)
    fail_worker: str = ""             # worker that stops communicating "RANK:STEP"
    balance: bool = False             # faster ranks/workers get larger batch shares (global batch unchanged)
    balance_every: int = 10           # --balance: steps (PS: clocks) between two gathers of the measured speeds
    balance_gain: float = 0.05        # --balance (data-parallel): smallest predicted step-time saving (fraction) that re-splits
    # --- skewed data across workers (data-parallel and parameter server; docs/guide/non_iid.md)
    partition: str = "iid"            # samples over workers: iid, dirichlet:alpha=A, classes:k=K, quantity:alpha=A
    resample: bool = False            # class-balanced batches on every worker (each class b/m times per batch)
    shared_fraction: float = 0.0      # fraction of the training set every worker also holds (shared IID subset)
    local_steps: int = 1              # local SGD: optimizer steps between model averages (1: data-parallel)
    post_local_epoch: int = 0         # post-local SGD: epochs trained data-parallel before the local steps
    average_optimizer: bool = False   # local SGD: average the optimizer state with the model
    weighted_average: bool = False    # weight each worker's gradient (H = 1) or model (local SGD) by its shard's samples
    # --- live monitoring (docs/guide/monitoring.md)
    monitor: bool = False             # gather per-rank metrics, watch for stragglers and stalls (implied by the next two)
    metrics_port: int = 0             # TCP port of rank 0's Prometheus endpoint (0: none)
    metrics_host: str = "127.0.0.1"   # address the Prometheus endpoint binds
    tensorboard: str = ""             # TensorBoard log directory written by rank 0 ("": none)
    metrics_every: int = 10           # steps between two gathers of the metrics (synchronous modes)
    metrics_interval: float = 1.0     # seconds between two reports of a parameter-server rank
    straggler_factor: float = 2.0     # k: a rank whose step time before the collective is above k x the median...
    straggler_intervals: int = 3      # ...for this many gathers (or PS report rounds) in a row is a straggler
    stall_seconds: float = 60.0       # name a rank this late at a step's collective (seconds; 0: never)
    # --- run directory, checkpoints, output
    run_dir: str = "runs"             # parent directory of run directories
    name: str = ""                    # run directory name ("" : timestamp-mode-data-P, mode tpT-ppQ on a grid)
    checkpoint_every: int = 1         # save a checkpoint every this many epochs (0: only the last)
    keep_checkpoints: int = 2         # checkpoints kept in the run directory (most recent)
    resume: str = ""                  # run directory or checkpoint file to continue from
    allow_foreign_checkpoint: bool = False  # --resume: accept a checkpoint written by another run
    eval_batch: int = 1024            # evaluation batch per rank (samples)
    threads: int = 0                  # BLAS threads per rank (0: cores / ranks on the node)
    progress: bool = True             # show a tqdm progress bar on rank 0
    trace: str = ""                   # Chrome trace file (JSON, times in microseconds) written by rank 0 ("": none)
    log_level: str = ""               # debug, info, warning, error or critical ("": $COMMLAB_LOG_LEVEL, else info)

    # ----------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d):
        """Build a configuration from a mapping, rejecting unknown keys.

        Parameters
        ----------
        d : dict
            Field name -> value, as written by :meth:`to_dict`.

        Returns
        -------
        Config

        Raises
        ------
        ValueError
            When ``d`` holds a key that is not a field, a value of the wrong type (JSON ``null``
            for a number, say), or a value that fails :meth:`validate`.

        Examples
        --------
        >>> cfg = Config.from_dict({"optimizer": "sgd", "lr": 1, "hidden": [64, 32]})
        >>> cfg.optimizer, cfg.lr, cfg.hidden  # an int is taken as a float, a list as a tuple
        ('sgd', 1.0, (64, 32))
        >>> Config.from_dict({"learning_rate": 0.1})
        Traceback (most recent call last):
        ...
        ValueError: unknown configuration key(s): learning_rate
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown configuration key(s): {', '.join(unknown)}")
        d = {f.name: _typed(f, d[f.name]) for f in dataclasses.fields(cls) if f.name in d}
        cfg = cls(**d)
        cfg.validate()
        return cfg

    def to_dict(self):
        """Return the configuration as a JSON-ready dict."""
        d = dataclasses.asdict(self)
        d["hidden"] = list(self.hidden)
        return d

    def replace(self, **changes):
        """Return a validated copy with ``changes`` applied (unknown keys raise ``ValueError``)."""
        d = self.to_dict()
        d.update(changes)
        return Config.from_dict(d)

    def validate(self):
        """Check every field's type and range.

        The checks run in named groups, in this order: names with fixed choices, counts, the mode's
        combinations, ranges, inputs and outputs (files, names), then the names registered by
        ``collectives`` (algorithm, compressor, log level).

        Raises
        ------
        ValueError
            Naming the first field whose value is out of range or not one of its choices.
        """
        self._check_choices()
        self._check_counts()
        self._check_modes()
        self._check_ranges()
        self._check_skew()
        self._check_inputs()
        self._check_monitor()
        self._check_registries()
        self._check_memory()

    def _check_choices(self):
        for name, choices in CHOICES.items():
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {getattr(self, name)!r}")

    def _check_counts(self):
        for f in dataclasses.fields(self):  # NaN and inf pass every range check below
            if isinstance(getattr(self, f.name), float) and not math.isfinite(getattr(self, f.name)):
                raise ValueError(f"{f.name} must be a finite number, got {getattr(self, f.name)!r}")
        positive = ("epochs", "batch_size", "samples", "features", "eval_batch", "servers",
                    "tensor_parallel", "pipeline_parallel", "micro_batches")
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.classes < 2:
            raise ValueError(f"classes must be >= 2, got {self.classes!r}")
        nonneg = ("stop_after", "bucket_bytes", "checkpoint_every", "threads", "staleness",
                  "jitter", "weight_decay")
        for name in nonneg:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")

    def _check_modes(self):
        if self.model == "ctr":
            from training.ctr.data import check_ctr_config  # pure NumPy

            check_ctr_config(self)
        elif self.mode == "hybrid":
            raise ValueError("mode 'hybrid' needs model 'ctr' (embeddings on the servers, the MLP all-reduced)")
        if self.mode == "ps" and self.tensor_parallel * self.pipeline_parallel * self.micro_batches > 1:
            raise ValueError("tensor_parallel, pipeline_parallel and micro_batches need mode 'dp' (the "
                             "parameter server holds whole-model shards)")
        if self.elastic_min < 1:
            raise ValueError(f"elastic_min must be >= 1, got {self.elastic_min!r}")
        if self.elastic_respawn and not self.elastic:
            raise ValueError("elastic_respawn needs elastic (--elastic --elastic-respawn)")
        if self.elastic:  # what the elastic loop re-forms (training.driver.elastic): one data-parallel replica per rank
            grid = self.tensor_parallel * self.pipeline_parallel * self.micro_batches > 1
            other = ("--mode ps" if self.mode != "dp" else "a model-parallel grid (--tensor-parallel, "
                     "--pipeline-parallel, --micro-batches)" if grid else "--model ctr" if self.model == "ctr"
                     else "--local-steps" if self.local_steps > 1 else "--balance" if self.balance
                     else "--weighted-average" if self.weighted_average else "--trace" if self.trace
                     else "--metrics-port" if self.metrics_port else "--tensorboard" if self.tensorboard
                     else "--straggler or --jitter" if self.straggler or self.jitter else "")
            if other:
                raise ValueError(f"--elastic supports plain data-parallel training (with --bucket-bytes, "
                                 f"--overlap and --compression), not {other}")

    def _check_ranges(self):
        if self.keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be >= 1, got {self.keep_checkpoints!r}")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {self.test_fraction!r}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if self.data == "synthetic" and self.samples - max(1, round(self.samples * self.test_fraction)) < 1:
            raise ValueError(f"samples ({self.samples}) with test_fraction {self.test_fraction} leaves no "
                             "training sample: at least one training and one test sample are needed")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"beta1 and beta2 must be in [0, 1), got {self.beta1!r}, {self.beta2!r}")
        if not self.eps > 0 or not self.ps_timeout > 0:
            raise ValueError("eps and ps_timeout must be > 0")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {self.timeout!r}")
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden widths must be >= 1, got {list(self.hidden)}")

    def _check_skew(self):
        from training.data.partition import parse_partition  # pure NumPy

        parse_partition(self.partition)
        if self.local_steps < 1:
            raise ValueError(f"local_steps must be >= 1, got {self.local_steps!r}")
        if self.post_local_epoch < 0:
            raise ValueError(f"post_local_epoch must be >= 0, got {self.post_local_epoch!r}")
        if not 0.0 <= self.shared_fraction < 1.0:
            raise ValueError(f"shared_fraction must be in [0, 1), got {self.shared_fraction!r}")
        local = self.local_steps > 1
        if not local and (self.post_local_epoch or self.average_optimizer):
            raise ValueError("post_local_epoch and average_optimizer need local_steps > 1")
        if local and self.mode != "dp":
            raise ValueError("local_steps > 1 (local SGD) needs mode 'dp'")
        self._check_balance()
        if self.weighted_average and self.mode != "dp":
            raise ValueError("weighted_average needs mode 'dp' (the parameter server weights every worker's push alike)")
        if self.weighted_average and self.compression != "none":
            raise ValueError("weighted_average averages over the plain all-reduce: it needs compression 'none'")
        skewed = self.partition != "iid" or self.resample or self.shared_fraction > 0 or local or self.weighted_average
        if skewed and self.tensor_parallel * self.pipeline_parallel * self.micro_batches > 1:
            raise ValueError("partition, resample, shared_fraction, local_steps and weighted_average apply to "
                             "data-parallel and parameter-server runs, not the model-parallel grid")

    def _check_balance(self):
        if self.balance_every < 1:
            raise ValueError(f"balance_every must be >= 1 (steps between two gathers of the speeds), got "
                             f"{self.balance_every!r}")
        if not 0 <= self.balance_gain < 1:
            raise ValueError(f"balance_gain must be in [0, 1) (a fraction of the step time), got {self.balance_gain!r}")
        if self.memory_gb < 0:
            raise ValueError(f"memory_gb must be >= 0 GiB (0: no bound), got {self.memory_gb!r}")
        if not self.balance or self.mode != "dp" or self.model == "ctr":
            return
        if self.tensor_parallel * self.pipeline_parallel * self.micro_batches > 1:
            raise ValueError("balance shares the global batch among data-parallel ranks that each hold the whole "
                             "model (--mode dp without --tensor-parallel, --pipeline-parallel, --micro-batches) or "
                             "parameter-server workers (--mode ps), not the model-parallel grid")
        if self.local_steps > 1:
            raise ValueError("balance re-splits each step's global batch; local SGD (--local-steps > 1) has none: "
                             "drop one of them")
        if self.partition != "iid" or self.resample or self.shared_fraction > 0:
            raise ValueError("balance moves samples of each global batch between ranks, which a skewed "
                             "--partition, --resample or --shared-fraction (each rank its own shard) rules out; "
                             "it needs --partition iid")

    def _check_memory(self):
        """Refuse a dense model or synthetic data set larger than this node's free memory, before any
        rank allocates: parameters, gradients and up to three optimizer and reduction copies of them,
        the synthetic samples, and an evaluation batch's activations (the ctr model has its own check)."""
        if self.model == "ctr":
            return
        from training.ctr.data import available_bytes  # pure NumPy

        item = 4 if self.dtype == "float32" else 8
        features = {"digits": 64, "mnist": 784}.get(self.data, self.features)
        classes = self.classes if self.data == "synthetic" else 10
        widths = [features, *self.hidden, classes]
        model = sum((a + 1) * b for a, b in zip(widths, widths[1:])) * item * 5
        data = self.samples * (features + 1) * 8 if self.data == "synthetic" else 0
        activations = self.eval_batch * max(widths) * item * 3
        free = available_bytes()
        if model + data + activations > free:
            gib = 2 ** 30
            what = (f"--hidden {','.join(map(str, self.hidden))} with {features} features makes a model needing "
                    f"{model / gib:.1f} GiB (parameters, gradients, optimizer state)" if model >= data else
                    f"--samples {self.samples} x --features {features} needs {data / gib:.1f} GiB of data")
            raise ValueError(f"{what}, more than the {free / gib:.1f} GiB this node has free; lower it")

    def _check_inputs(self):
        if not isinstance(self.compression_args, dict):
            raise ValueError("compression_args must be a dict")
        if self.compression_args and self.compression == "none":
            raise ValueError(f"--compression-arg {', '.join(map(str, self.compression_args))}: an argument of a "
                             "compressor, but --compression is 'none': name the compressor with --compression")
        if self.data == "mnist" and not self.data_dir:
            raise ValueError("data_dir must name the directory of the MNIST IDX files (--data-dir)")
        if self.trace:
            if self.tensor_parallel * self.pipeline_parallel > 1 or self.micro_batches > 1:
                raise ValueError("trace records data-parallel and parameter-server runs, not the model-parallel "
                                 "grid (--tensor-parallel, --pipeline-parallel, --micro-batches)")
            folder = os.path.dirname(os.path.abspath(self.trace))
            if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
                raise ValueError(f"trace: cannot write {self.trace!r}: directory {folder} does not exist or "
                                 f"is not writable")
        if self.name and ("/" in self.name or self.name in (".", "..", "latest")):
            raise ValueError(f"name must be a plain directory name, got {self.name!r}")

    def _check_monitor(self):
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be a TCP port in 1..65535, or 0 for none, got {self.metrics_port!r}")
        if self.metrics_every < 1 or self.straggler_intervals < 1:
            raise ValueError(f"metrics_every and straggler_intervals must be >= 1, got {self.metrics_every!r}, "
                             f"{self.straggler_intervals!r}")
        if not self.metrics_interval > 0 or self.stall_seconds < 0:
            raise ValueError(f"metrics_interval must be > 0 and stall_seconds >= 0 seconds, got "
                             f"{self.metrics_interval!r}, {self.stall_seconds!r}")
        if not self.straggler_factor > 1:
            raise ValueError(f"straggler_factor must be > 1, got {self.straggler_factor!r}")
        if self.straggler and self.tensor_parallel * self.pipeline_parallel * self.micro_batches > 1:
            raise ValueError("straggler slows a data-parallel rank or a parameter-server worker, not the "
                             "model-parallel grid")
        if self.ps_replicas > 1 and (self.monitor or self.metrics_port or self.tensorboard):
            raise ValueError("live monitoring (--monitor, --metrics-port, --tensorboard) watches an unreplicated "
                             "parameter server: its reports go to server 0, which a replicated run may lose; "
                             "drop --ps-replicas or the monitoring options")

    def _check_registries(self):
        from collectives import ALGORITHMS  # late import: MPI is loaded by validation, not by importing config
        from collectives.compression import COMPRESSORS
        from commlab.logs import LEVELS

        if isinstance(self.algorithm, str) and ":" in self.algorithm:  # FILE.py:FUNCTION or module:FUNCTION
            from collectives.schedules import load_algorithm  # verified and registered, on every rank alike
            self.algorithm = load_algorithm(self.algorithm)
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, or FILE.py:FUNCTION naming a "
                             f"schedule builder, got {self.algorithm!r}")
        if self.compression not in COMPRESSORS:
            raise ValueError(f"compression must be one of {', '.join(COMPRESSORS)}, got {self.compression!r}")
        if self.log_level and self.log_level.lower() not in LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LEVELS)}, got {self.log_level!r}")


def _typed(f, value):
    """Return ``value`` as the type of field ``f`` (ints pass as floats), or raise naming the field."""
    kind = type(f.default) if f.default is not dataclasses.MISSING else type(f.default_factory())
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is tuple and isinstance(value, (list, tuple)) and all(
            isinstance(h, int) and not isinstance(h, bool) for h in value):
        return tuple(value)
    if kind is float and number:
        return float(value)
    if kind is int and (isinstance(value, int) or isinstance(value, float) and value.is_integer()) and number:
        return int(value)
    if kind in (bool, str, dict) and isinstance(value, kind):
        return value
    what = {tuple: "a list of integers", float: "a number", int: "an integer", bool: "true or false",
            str: "a string", dict: "a mapping"}[kind]
    raise ValueError(f"{f.name} must be {what}, got {value!r}")

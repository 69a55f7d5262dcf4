"""Skewed (non-IID) partitions of a training set across workers: which samples each worker holds.

A partition gives every training sample to exactly one of W workers. :func:`parse_partition` reads
the ``--partition`` text, :func:`draw_partition` draws the shards from a seed (NumPy's PCG64, so the
same seed gives the same partition on any machine), redrawing with the next seed while a worker would
hold less than one batch, and :func:`label_histogram` counts each worker's labels. Pure NumPy, no MPI.

Kinds (Hsieh et al., "The Non-IID Data Quagmire of Decentralized Machine Learning", ICML 2020,
section 2, name the label-skew and quantity-skew settings):

``iid``
    A random permutation cut into W near-equal parts (``numpy.array_split``).
``dirichlet:alpha=A``
    Label skew of Hsu, Qi and Brown, "Measuring the Effects of Non-Identical Data Distribution for
    Federated Visual Classification", 2019, section 3: each class's samples are spread over the
    workers in proportions drawn from Dirichlet(A, ..., A); small A puts most of a class on few workers.
``classes:k=K``
    Each worker holds K classes (McMahan et al., AISTATS 2017, section 3, the pathological split):
    with the classes in a seeded random order c_0..c_{C-1}, worker w holds c_{(wK + j) mod C},
    j < K; a class's samples are split evenly among the workers that hold it.
``quantity:alpha=A``
    Quantity skew: IID labels, shard sizes in proportions drawn from Dirichlet(A, ..., A).
"""
from dataclasses import dataclass

import numpy

__all__ = ["KINDS", "MAX_REDRAWS", "PartitionSpec", "Partition", "parse_partition", "check_partition",
           "draw_partition", "label_histogram"]

#: The partition kinds ``--partition`` accepts.
KINDS = ("iid", "dirichlet", "classes", "quantity")
#: Draws tried (the seed, then seed + 1, ...) before a partition that leaves a worker without a batch fails.
MAX_REDRAWS = 50
_STREAM = 0x5CA1E  # second word of the partition's seed: its draws never coincide with shuffling's


@dataclass(frozen=True)
class PartitionSpec:
    """A parsed ``--partition``: its kind and parameter (``alpha`` > 0 or ``k`` >= 1, else None)."""

    kind: str
    alpha: float = None  # Dirichlet concentration (dimensionless), dirichlet and quantity
    k: int = None        # classes per worker, classes

    def __str__(self):
        if self.kind == "iid":
            return "iid"
        return f"{self.kind}:k={self.k}" if self.kind == "classes" else f"{self.kind}:alpha={self.alpha:g}"


@dataclass
class Partition:
    """The shards of one partition and how they were drawn.

    Attributes
    ----------
    shards : list of ndarray, int64
        Worker w's sample indices into the training set, sorted.
    seed : int
        The seed of the accepted draw (the requested seed plus ``redraws``).
    redraws : int
        Draws rejected because a worker held less than one batch.
    """

    shards: list
    seed: int
    redraws: int

    @property
    def sizes(self):
        """Samples per worker, a list of int."""
        return [int(s.size) for s in self.shards]


def parse_partition(text):
    """Parse a ``--partition`` value into a :class:`PartitionSpec`.

    Parameters
    ----------
    text : str
        ``iid``, ``dirichlet:alpha=A``, ``classes:k=K`` or ``quantity:alpha=A``.

    Returns
    -------
    PartitionSpec

    Raises
    ------
    ValueError
        Naming ``partition`` when the kind is unknown, its parameter missing or misnamed, ``alpha``
        not a finite number > 0 or ``k`` not an integer >= 1.

    Examples
    --------
    >>> parse_partition("dirichlet:alpha=0.1")
    PartitionSpec(kind='dirichlet', alpha=0.1, k=None)
    >>> str(parse_partition("classes:k=3"))
    'classes:k=3'
    >>> parse_partition("dirichlet:alpha=0")
    Traceback (most recent call last):
    ...
    ValueError: partition dirichlet:alpha=0: alpha must be a finite number > 0, got 0.0
    """
    if not isinstance(text, str):
        raise ValueError(f"partition must be a string, got {text!r}")
    kind, _, arg = text.strip().partition(":")
    if kind not in KINDS:
        raise ValueError(f"partition must be iid, dirichlet:alpha=A, classes:k=K or quantity:alpha=A, got {text!r}")
    if kind == "iid":
        if arg:
            raise ValueError(f"partition iid takes no parameter, got {text!r}")
        return PartitionSpec("iid")
    want = "k" if kind == "classes" else "alpha"
    key, eq, value = arg.partition("=")
    if key.strip() != want or not eq:
        raise ValueError(f"partition {text}: expected {kind}:{want}=VALUE")
    try:
        number = float(value) if want == "alpha" else int(value)
    except ValueError:
        raise ValueError(f"partition {text}: {want} must be {'a number' if want == 'alpha' else 'an integer'}, "
                         f"got {value!r}") from None
    if want == "alpha":
        if not (numpy.isfinite(number) and number > 0):
            raise ValueError(f"partition {text}: alpha must be a finite number > 0, got {number!r}")
        return PartitionSpec(kind, alpha=number)
    if number < 1:
        raise ValueError(f"partition {text}: k must be >= 1, got {number}")
    return PartitionSpec(kind, k=number)


def check_partition(spec, n_classes, workers):
    """Check that ``spec`` can be drawn for ``n_classes`` classes over ``workers`` workers.

    Raises
    ------
    ValueError
        For ``classes:k=K`` when K exceeds the number of classes, or when K x workers < classes
        (some class would be on no worker).

    Examples
    --------
    >>> check_partition(parse_partition("classes:k=2"), 10, 4)
    Traceback (most recent call last):
    ...
    ValueError: partition classes:k=2 on 4 workers holds 8 class slots for 10 classes: some class would be on no worker (need k >= 3)
    """
    if spec.kind != "classes":
        return
    if spec.k > n_classes:
        raise ValueError(f"partition {spec}: k must be at most the number of classes ({n_classes})")
    if spec.k * workers < n_classes:
        raise ValueError(f"partition {spec} on {workers} workers holds {spec.k * workers} class slots for "
                         f"{n_classes} classes: some class would be on no worker (need k >= "
                         f"{-(-n_classes // workers)})")


def _draw(labels, workers, spec, rng, n_classes):
    """One draw: the list of per-worker index arrays (unsorted)."""
    n = labels.size
    parts = [[] for _ in range(workers)]
    if spec.kind in ("iid", "quantity"):
        order = rng.permutation(n)
        if spec.kind == "iid":
            pieces = numpy.array_split(order, workers)
        else:
            cuts = (numpy.cumsum(rng.dirichlet(numpy.full(workers, spec.alpha))) * n).astype(numpy.int64)[:-1]
            pieces = numpy.split(order, cuts)
        return [numpy.asarray(p, numpy.int64) for p in pieces]
    holders = [[] for _ in range(n_classes)]
    if spec.kind == "classes":
        classes = rng.permutation(n_classes)
        for w in range(workers):
            for j in range(spec.k):
                holders[classes[(w * spec.k + j) % n_classes]].append(w)
    for c in range(n_classes):
        idx = rng.permutation(numpy.flatnonzero(labels == c))
        if spec.kind == "dirichlet":
            cuts = (numpy.cumsum(rng.dirichlet(numpy.full(workers, spec.alpha))) * idx.size).astype(numpy.int64)
            pieces, owners = numpy.split(idx, cuts[:-1]), range(workers)
        else:
            pieces, owners = numpy.array_split(idx, len(holders[c])), holders[c]
        for w, piece in zip(owners, pieces):
            parts[w].append(piece)
    return [numpy.concatenate(p).astype(numpy.int64) if p else numpy.empty(0, numpy.int64) for p in parts]


def draw_partition(labels, workers, spec, seed, n_classes=None, min_size=1, max_redraws=MAX_REDRAWS):
    """Draw the shards of ``workers`` workers; redraw with the next seed while one holds < ``min_size``.

    Parameters
    ----------
    labels : ndarray, shape (N,), int
        Training labels in ``[0, n_classes)``.
    workers : int
        Number of workers W >= 1.
    spec : PartitionSpec or str
        The partition (a string is parsed by :func:`parse_partition`).
    seed : int
        Seed of the first draw; draw i uses ``seed + i`` (PCG64 seeded with ``[seed + i, 0x5CA1E]``).
    n_classes : int, optional
        Number of classes (default ``labels.max() + 1``).
    min_size : int
        Fewest samples a worker may hold (its local batch).
    max_redraws : int
        Redraws tried before giving up.

    Returns
    -------
    Partition
        Shards that cover every sample exactly once, each sorted.

    Raises
    ------
    ValueError
        From :func:`check_partition`; when ``workers`` or ``min_size`` is below 1; or when no draw
        in ``max_redraws + 1`` gives every worker ``min_size`` samples.

    Examples
    --------
    >>> labels = numpy.repeat(numpy.arange(4), 25)   # 100 samples, 4 classes
    >>> p = draw_partition(labels, 2, "classes:k=2", seed=0)
    >>> p.sizes, sorted(numpy.concatenate(p.shards).tolist()) == list(range(100))
    ([50, 50], True)
    >>> label_histogram(labels, p.shards, 4).tolist()
    [[25, 25, 0, 0], [0, 0, 25, 25]]
    """
    spec = parse_partition(spec) if isinstance(spec, str) else spec
    labels = numpy.asarray(labels)
    n_classes = int(labels.max(initial=-1)) + 1 if n_classes is None else int(n_classes)
    if workers < 1 or min_size < 1:
        raise ValueError(f"workers and min_size must be >= 1, got {workers} and {min_size}")
    check_partition(spec, n_classes, workers)
    if labels.size < workers * min_size:
        raise ValueError(f"partition {spec}: {labels.size} samples cannot give {workers} workers "
                         f"{min_size} samples (one batch) each")
    for i in range(max_redraws + 1):
        rng = numpy.random.default_rng([seed + i, _STREAM])
        shards = _draw(labels, workers, spec, rng, n_classes)
        if min(s.size for s in shards) >= min_size:
            return Partition([numpy.sort(s) for s in shards], seed + i, i)
    raise ValueError(f"partition {spec}: {max_redraws + 1} draws (seeds {seed}..{seed + max_redraws}) each left "
                     f"a worker with fewer than {min_size} samples (one batch); use a larger alpha, fewer "
                     f"workers or a smaller batch")


def label_histogram(labels, shards, n_classes):
    """Return the (W, n_classes) int64 counts of each worker's labels.

    Examples
    --------
    >>> label_histogram(numpy.array([0, 1, 1, 2]), [numpy.array([0, 1]), numpy.array([2, 3])], 3).tolist()
    [[1, 1, 0], [0, 1, 1]]
    """
    labels = numpy.asarray(labels)
    return numpy.stack([numpy.bincount(labels[s], minlength=n_classes) for s in shards]).astype(numpy.int64)

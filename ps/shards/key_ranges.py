"""Key-range sharding of the flat parameter vector across the server ranks.

The flat vector of ``n`` parameters is cut into ``S`` contiguous shards whose sizes differ by at
most one element, with the larger shards first -- the splitting rule of ``numpy.array_split`` that
the collectives use for their chunks (``collectives.schedules.schedule.chunk_bounds``, reused here). Server ``r`` owns
``[offsets[r], offsets[r + 1])``. This is
ps-lite's key-range partition (Li et al., "Scaling Distributed Machine Learning with the Parameter
Server", OSDI 2014, section 3.3) on a dense key space ``0 .. n - 1``.
"""
import numpy as np

from collectives.schedules.schedule import chunk_bounds

__all__ = ["shard_sizes", "shard_offsets", "shard_slice", "split_shards", "join_shards", "proportional"]


def _check(n, servers):
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n must be an integer, got {type(n).__name__}")
    if isinstance(servers, bool) or not isinstance(servers, (int, np.integer)):
        raise TypeError(f"servers must be an integer, got {type(servers).__name__}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")


def shard_sizes(n, servers):
    """Return the number of parameters each server owns.

    Parameters
    ----------
    n : int
        Length of the flat parameter vector (elements), ``n >= 0``.
    servers : int
        Number of server ranks ``S >= 1``.

    Returns
    -------
    ndarray, shape (S,), int64
        ``sizes[r]`` is ``n // S + 1`` for ``r < n % S`` and ``n // S`` otherwise, so the sizes
        sum to ``n`` and differ by at most one (``numpy.array_split`` sizes).

    Raises
    ------
    TypeError
        When ``n`` or ``servers`` is not an integer.
    ValueError
        When ``n < 0`` or ``servers < 1``.

    Examples
    --------
    >>> shard_sizes(10, 3)
    array([4, 3, 3])
    >>> shard_sizes(10, 0)
    Traceback (most recent call last):
    ...
    ValueError: servers must be >= 1, got 0
    """
    _check(n, servers)
    return np.diff(np.array(chunk_bounds(int(n), int(servers)), dtype=np.int64))


def shard_offsets(n, servers):
    """Return the shard boundaries: server ``r`` owns ``[offsets[r], offsets[r + 1])``.

    Parameters
    ----------
    n : int
        Length of the flat parameter vector (elements).
    servers : int
        Number of server ranks ``S``.

    Returns
    -------
    ndarray, shape (S + 1,), int64
        ``offsets[0] == 0`` and ``offsets[S] == n``.

    Raises
    ------
    TypeError, ValueError
        As :func:`shard_sizes`.

    Examples
    --------
    >>> shard_offsets(10, 3)
    array([ 0,  4,  7, 10])
    """
    _check(n, servers)
    return np.array(chunk_bounds(int(n), int(servers)), dtype=np.int64)


def shard_slice(n, servers, server):
    """Return the ``slice`` of the flat vector owned by ``server``.

    Parameters
    ----------
    n : int
        Length of the flat parameter vector (elements).
    servers : int
        Number of server ranks ``S``.
    server : int
        Server index ``0 <= server < S``.

    Returns
    -------
    slice

    Raises
    ------
    ValueError
        When ``server`` is out of range (and as :func:`shard_sizes`).

    Examples
    --------
    >>> shard_slice(10, 3, 1)
    slice(4, 7, None)
    """
    offsets = shard_offsets(n, servers)
    if not 0 <= server < servers:
        raise ValueError(f"server must be in [0, {servers}), got {server}")
    return slice(int(offsets[server]), int(offsets[server + 1]))


def split_shards(x, servers):
    """Return views of the 1-D array ``x``, one per server, in server order.

    Parameters
    ----------
    x : ndarray, shape (n,)
        Flat parameter or gradient vector (any dtype; NumPy or CuPy).
    servers : int
        Number of server ranks ``S``.

    Returns
    -------
    list of ndarray
        ``S`` contiguous views whose lengths are :func:`shard_sizes` ``(n, S)``.

    Raises
    ------
    ValueError
        When ``x`` is not one-dimensional.

    Examples
    --------
    >>> x = np.arange(5.0)
    >>> a, b = split_shards(x, 2)
    >>> a, b
    (array([0., 1., 2.]), array([3., 4.]))
    >>> b[0] = 9.0  # views: x changes too
    >>> x
    array([0., 1., 2., 9., 4.])
    """
    if getattr(x, "ndim", None) != 1:
        raise ValueError(f"x must be a 1-D array, got shape {getattr(x, 'shape', None)}")
    offsets = shard_offsets(int(x.shape[0]), servers)
    return [x[int(a):int(b)] for a, b in zip(offsets[:-1], offsets[1:])]


def join_shards(shards, out=None):
    """Concatenate per-server shards back into the flat vector.

    Parameters
    ----------
    shards : sequence of ndarray, each shape (n_r,)
        Host (NumPy) shards in server order, as produced by :func:`split_shards`.
    out : ndarray, shape (sum n_r,), optional
        Destination written in place.

    Returns
    -------
    ndarray, shape (sum n_r,)

    Raises
    ------
    ValueError
        When ``out`` has the wrong length or a shard is not 1-D.

    Examples
    --------
    >>> join_shards([np.array([0.0, 1.0, 2.0]), np.array([3.0, 4.0])])
    array([0., 1., 2., 3., 4.])
    >>> join_shards([np.zeros(2)], out=np.empty(3))
    Traceback (most recent call last):
    ...
    ValueError: out must have shape (2,), got (3,)
    """
    if any(getattr(s, "ndim", None) != 1 for s in shards):
        raise ValueError("shards must be 1-D arrays")
    n = sum(int(s.shape[0]) for s in shards)
    if out is None:
        out = np.empty(n, dtype=shards[0].dtype if shards else np.float64)
    elif out.shape != (n,):
        raise ValueError(f"out must have shape ({n},), got {out.shape}")
    pos = 0
    for s in shards:
        out[pos:pos + s.shape[0]] = s
        pos += s.shape[0]
    return out


def proportional(rate, total, cap=None):
    """Split ``total`` samples in proportion to ``rate``: largest remainders, each active share in [1, cap].

    The rule (Hamilton's largest-remainder method, as LB-BSP splits a batch by measured speed: Chen et
    al., "Semi-dynamic load balancing", SoCC 2020, section 4): share ``q_i = rate_i total / sum rate``;
    each active share starts at ``floor(q_i)`` raised to 1 and cut to ``cap``; the samples still
    missing go one each to the shares with the largest remainders ``q_i - floor(q_i)`` (ties to the
    lower index) that are below ``cap``, round after round; samples over ``total`` (from the raise
    to 1) are taken back one each from the largest shares above 1 with the smallest remainders. The
    result depends only on its inputs, so every rank that holds the same ``rate`` computes the same split.

    Used by the parameter server's load balancing (``rate``: each worker's samples per second, 0 for
    a worker that left) and by data-parallel training's batch shares (:mod:`training.dp.shares`).

    Parameters
    ----------
    rate : ndarray, shape (W,), float
        Speed of each worker (samples per second, or any weights); <= 0: inactive, share 0.
    total : int
        Samples to split (the global batch).
    cap : int, optional
        Largest share of one worker (samples; None: no limit).

    Returns
    -------
    ndarray, shape (W,), int64
        Shares summing to ``total`` (all zeros when no worker is active).

    Raises
    ------
    ValueError
        When ``total`` is smaller than the active workers (a share would be 0), or larger than
        ``cap`` times them, or ``cap`` < 1.

    Examples
    --------
    >>> proportional(np.array([1.0, 3.0, 0.0]), 8).tolist()
    [2, 6, 0]
    >>> proportional(np.ones(3), 64).tolist()       # equal speeds: 64 over 3 is 22/21/21
    [22, 21, 21]
    >>> proportional(np.array([1.0, 1.0, 1000.0]), 3).tolist()   # at least one sample each
    [1, 1, 1]
    >>> proportional(np.array([1.0, 4.0]), 10, cap=6).tolist()    # a memory bound of 6 samples
    [4, 6]
    """
    rate = np.asarray(rate, dtype=np.float64)
    out = np.zeros(rate.shape[0], dtype=np.int64)
    active = np.flatnonzero(rate > 0)
    if active.size == 0:
        return out
    total = int(total)
    if cap is not None and int(cap) < 1:
        raise ValueError(f"the largest share must be >= 1 sample, got {cap}")
    if total < active.size:
        raise ValueError(f"a batch of {total} samples cannot give each of {active.size} workers at least one")
    high = total if cap is None else int(cap)
    if total > high * active.size:
        raise ValueError(f"a batch of {total} samples does not fit {active.size} workers of at most {high} "
                         f"samples each")
    r = rate[active]
    quota = r * total / r.sum()  # (W,): exact for integer weights that divide total
    base = np.floor(quota)
    rest = quota - base
    share = np.clip(base.astype(np.int64), 1, high)
    by_rest = np.lexsort((np.arange(active.size), -rest))      # largest remainder first, ties to the lower index
    while share.sum() < total:
        for i in by_rest:
            if share.sum() == total:
                break
            if share[i] < high:
                share[i] += 1
    by_fit = np.lexsort((np.arange(active.size), rest, -share))  # largest share, smallest remainder first
    while share.sum() > total:
        for i in by_fit:
            if share.sum() == total:
                break
            if share[i] > 1:
                share[i] -= 1
    out[active] = share
    return out

"""Recursive-doubling and Rabenseifner all-reduce schedules, for any number of ranks.

Source: R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of collective communication operations
in MPICH", IJHPCA 19(1), 2005, section 4.5 (recursive doubling; Rabenseifner's reduce-scatter +
all-gather), and R. Rabenseifner, "Optimization of collective reduction operations", ICCS 2004.

Non-powers of two use the usual fold: with ``P' = 2**floor(log2 P)`` and ``r = P - P'``, among the
first ``2r`` ranks each even rank sends its vector to the odd rank above it and sits out; the odd
ranks and ranks ``>= 2r`` (``P'`` in all) run the power-of-two algorithm on *new ranks*; at the end
each odd rank sends the result back to its even partner.
"""
from collectives.schedules.schedule import Round, Schedule, chunk_bounds

__all__ = ["recursive_doubling_allreduce", "rabenseifner_allreduce"]


def _fold(rank, size):
    """Return (p2, rem, newrank) for the non-power-of-two fold; newrank is -1 for a rank that sits out."""
    p2 = 1 << (size.bit_length() - 1)
    rem = size - p2
    if rank < 2 * rem:
        return p2, rem, (rank // 2 if rank % 2 else -1)
    return p2, rem, rank - rem


def _real(newrank, rem):
    """Map a new rank of the folded power-of-two group back to a communicator rank."""
    return 2 * newrank + 1 if newrank < rem else newrank + rem


def _with_fold(rank, size, count, core):
    """Wrap the power-of-two rounds from ``core(newrank, p2, rem)`` with the fold and unfold steps."""
    p2, rem, nr = _fold(rank, size)
    if nr < 0:  # even rank among the first 2r: hand the vector over, get the result back
        return [Round([(rank + 1, 0, count)], [], "fold"), Round([], [(rank + 1, 0, count, False)], "unfold")]
    rounds = []
    if rank < 2 * rem:
        rounds.append(Round([], [(rank - 1, 0, count, True)], "fold"))
    rounds += core(nr, p2, rem)
    if rank < 2 * rem:
        rounds.append(Round([(rank - 1, 0, count)], [], "unfold"))
    return rounds


def recursive_doubling_allreduce(rank, size, count):
    """Build the recursive-doubling all-reduce schedule.

    Steps: fold to ``P'`` ranks; for ``m = 1, 2, 4, .., P'/2`` exchange the whole vector with new rank
    ``newrank XOR m`` and combine; unfold. Every rank computes the same combinations (the ops are
    commutative), so all ranks hold bitwise identical results.

    Cost (n bytes, P a power of two): ``log2 P (alpha + n beta + n gamma)``; best for small messages.
    Source: Thakur et al. 2005, section 4.5.

    Examples
    --------
    >>> recursive_doubling_allreduce(0, 4, 8)  # log2 4 = 2 whole-vector exchanges
    Schedule('recursive_doubling', rank=0, size=4, count=8, rounds=2, messages=2, elements_sent=16)
    >>> [rd.phase for rd in recursive_doubling_allreduce(0, 3, 8).rounds]  # P = 3: rank 0 sits out
    ['fold', 'unfold']
    """
    def core(nr, p2, rem):
        rounds, mask = [], 1
        while mask < p2:
            peer = _real(nr ^ mask, rem)
            rounds.append(Round([(peer, 0, count)], [(peer, 0, count, True)], "recursive-doubling"))
            mask <<= 1
        return rounds

    return Schedule("recursive_doubling", rank, size, count, _with_fold(rank, size, count, core))


def rabenseifner_allreduce(rank, size, count):
    """Build Rabenseifner's all-reduce: recursive-halving reduce-scatter, recursive-doubling all-gather.

    Steps: fold to ``P'`` ranks; split the vector into ``P'`` blocks (``numpy.array_split`` sizes);
    reduce-scatter by recursive halving (``m = P'/2 .. 1``: keep the half of the current window that
    matches bit ``m`` of the new rank, send the other half to ``newrank XOR m``, combine the received
    half) so new rank ``i`` owns block ``i``; all-gather by recursive doubling (``m = 1 .. P'/2``:
    exchange windows with ``newrank XOR m``); unfold.

    Cost (n bytes, P a power of two): ``2 log2 P alpha + 2 (P-1)/P n beta + (P-1)/P n gamma``; with
    a fold, ``+ 2 (alpha + n beta) + n gamma``. Source: Rabenseifner 2004; Thakur et al. 2005, 4.5.

    Examples
    --------
    >>> s = rabenseifner_allreduce(0, 4, 8)  # halves 4 then 2 elements, doubles 2 then 4
    >>> s
    Schedule('rabenseifner', rank=0, size=4, count=8, rounds=4, messages=4, elements_sent=12)
    >>> [rd.phase for rd in s.rounds]
    ['reduce-scatter', 'reduce-scatter', 'all-gather', 'all-gather']
    """
    def core(nr, p2, rem):
        b = chunk_bounds(count, p2)
        rounds, mask = [], p2 >> 1
        while mask >= 1:  # reduce-scatter by recursive halving
            peer = _real(nr ^ mask, rem)
            lo = nr & ~(2 * mask - 1)
            keep, give = (lo + mask, lo) if nr & mask else (lo, lo + mask)
            rounds.append(Round([(peer, b[give], b[give + mask])], [(peer, b[keep], b[keep + mask], True)],
                                "reduce-scatter"))
            mask >>= 1
        mask = 1
        while mask < p2:  # all-gather by recursive doubling
            peer = _real(nr ^ mask, rem)
            mine, theirs = nr & ~(mask - 1), (nr ^ mask) & ~(mask - 1)
            rounds.append(Round([(peer, b[mine], b[mine + mask])], [(peer, b[theirs], b[theirs + mask], False)],
                                "all-gather"))
            mask <<= 1
        return rounds

    return Schedule("rabenseifner", rank, size, count, _with_fold(rank, size, count, core))

"""Bidirectional ring all-reduce: one ring all-reduce per half of the vector, in opposite directions.

The first half runs the ring of Patarasuk and Yuan (2009, section 3) to the right, the second half
the same ring to the left, in the same rounds, so every link carries data both ways:
``2 (P-1) alpha + (P-1)/P n beta + (P-1)/P n gamma`` on a full-duplex ring.
"""
from collectives.schedules import Round, Schedule, chunk_bounds


def bidirectional_ring_allreduce(rank, size, count):
    half = count // 2
    parts = {+1: chunk_bounds(half, size),  # chunk bounds of the right-going half
             -1: [half + x for x in chunk_bounds(count - half, size)]}  # and of the left-going one
    rounds = []
    for phase, reduce, shift in (("reduce-scatter", True, 1), ("all-gather", False, 0)):
        for s in range(size - 1):
            sends, recvs = [], []
            for d, b in parts.items():
                me = rank * d % size  # position along this direction's ring
                out, into = (me - s - shift) % size, (me - s - shift - 1) % size
                sends.append(((rank + d) % size, b[out], b[out + 1]))
                recvs.append(((rank - d) % size, b[into], b[into + 1], reduce))
            rounds.append(Round(sends, recvs, phase))
    return Schedule("bidirectional_ring", rank, size, count, rounds)

"""All-to-all all-reduce: one all-to-all reduce-scatter round, then one all-to-all all-gather round.

Rank r owns chunk r of the vector (``chunk_bounds`` sizes). In round 1 every rank sends chunk j
to rank j and receives chunk r from every other rank, combining all P - 1 messages into its chunk;
in round 2 it sends its reduced chunk to every rank and receives chunk j from rank j. Two rounds of
P - 1 messages each: ``2 alpha + 2 (P-1)/P n beta + (P-1)/P n gamma`` when the network carries all
messages at once (the direct algorithm of Thakur, Rabenseifner and Gropp 2005, section 4).
"""
from collectives.schedules import Round, Schedule, chunk_bounds


def alltoall_allreduce(rank, size, count):
    b = chunk_bounds(count, size)
    peers = [p for p in range(size) if p != rank]
    scatter = Round([(p, b[p], b[p + 1]) for p in peers],
                    [(p, b[rank], b[rank + 1], True) for p in peers], "reduce-scatter")
    gather = Round([(p, b[rank], b[rank + 1]) for p in peers],
                   [(p, b[p], b[p + 1], False) for p in peers], "all-gather")
    return Schedule("alltoall", rank, size, count, [scatter, gather])

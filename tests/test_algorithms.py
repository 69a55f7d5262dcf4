"""Writing an algorithm: the round's one semantics, the verifier, registration (in one process, no MPI).

Oracles: NumPy's sum of the ranks' inputs (int64, exact) for what the executor's compiled program
computes, replayed in-process by :func:`collectives.model.simulate.replay` (the executor's own
program and :func:`~collectives.schedules.schedule.apply_receive`) in place and from a separate
input; a corpus of wrong schedules, each refused with its violation; random schedules of the
allowed forms (hypothesis): whenever the verifier accepts one, it computes the all-reduce. The
executor itself under ``mpiexec`` is in ``tests/mpi_algorithms.py``.
"""
import functools
import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from collectives.errors import ScheduleViolation
from collectives.model.simulate import replay
from collectives.schedules import Round, Schedule, check, chunk_bounds, verify
from collectives.schedules.registry import (BUILT_IN, REGISTRY, build_allreduce_schedule, load_algorithm,
                                            names, register_algorithm, unregister_algorithm, verify_share)

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "examples")
sys.path.insert(0, EXAMPLES)
from alltoall import alltoall_allreduce  # noqa: E402  (the guide's example files)
from bidirectional_ring import bidirectional_ring_allreduce  # noqa: E402

sys.path.remove(EXAMPLES)


def _run(builder, P, count, from_input):
    """Replay ``builder``'s schedules on int64 inputs; return (results, NumPy's sum)."""
    rng = np.random.default_rng(P * 1000 + count)
    data = [rng.integers(-10 ** 6, 10 ** 6, count) for _ in range(P)]
    want = np.sum(data, axis=0) if count else np.zeros(0, np.int64)
    replay([builder(r, P, count) for r in range(P)], data, from_input=from_input)
    return data, want


@pytest.mark.parametrize("from_input", [False, True])
def test_several_reducing_receives_into_one_region_all_count(from_input):
    """The one-round all-to-all reduce-scatter: P - 1 reductions into one chunk in one round.

    Out of place (``from_input``) each reduction was compiled as the chunk's first and overwrote the
    one before, returning the rank's own input plus the last peer's only.
    """
    for P in (2, 3, 4, 7):
        for count in (0, 1, P - 1, P + 1, 3 * P + 2):
            got, want = _run(alltoall_allreduce, P, count, from_input)
            for r in range(P):
                assert np.array_equal(got[r], want), (P, count, r, got[r], want)


def test_program_reads_each_reduction_in_order():
    """The compiled out-of-place program: only the first reduction into a region reads the input."""
    s = alltoall_allreduce(1, 4, 8)
    prog, final = s.program(True)
    firsts = [rv[3] for rv in prog[0][1]]
    assert firsts == [True, False, False]
    assert final == []


@pytest.mark.parametrize("from_input", [False, True])
def test_send_carries_the_value_before_a_same_round_receive(from_input):
    """A round that sends a region and copies a message into it: the send carries the old value."""
    swap = [Schedule("swap", r, 2, 4, [Round([(1 - r, 0, 4)], [(1 - r, 0, 4, False)])]) for r in range(2)]
    assert swap[0].scratch == 4 and swap[0].program()[0][1][0][2] is not None  # lands in scratch
    data = [np.arange(4) + 10 * r for r in range(2)]
    replay(swap, data, from_input=from_input)
    assert np.array_equal(data[0], np.arange(4) + 10) and np.array_equal(data[1], np.arange(4))


@pytest.mark.parametrize("from_input", [False, True])
def test_overlapping_receives_apply_in_listed_order(from_input):
    """Copy then reduce into overlapping regions of one round: the reduction sees the copy."""
    def build(r):
        if r == 0:
            return Schedule("o", 0, 3, 4, [Round([], [(1, 0, 4, False), (2, 2, 4, True)])])
        return Schedule("o", r, 3, 4, [Round([(0, 0, 4) if r == 1 else (0, 0, 2)], [])])
    data = [np.full(4, 1), np.full(4, 10), np.full(4, 100)]
    replay([build(r) for r in range(3)], data, from_input=from_input)
    assert data[0].tolist() == [10, 10, 110, 110]


def test_region_outside_the_buffer_is_refused_when_built():
    with pytest.raises(ValueError, match=r"rank 1 round 0 \(x\): receive region \[2, 9\) lies outside the buffer of 4"):
        Schedule("bad", 1, 2, 4, [Round([(0, 0, 2)], [(0, 2, 9, True)], "x")])
    with pytest.raises(ValueError, match="names peer 5, not a rank of 0..1"):
        Schedule("bad", 1, 2, 4, [Round([(5, 0, 2)], [], "x")])


#: The P the built-in algorithms are verified at: every P to 33 (every residue a power-of-two or
#: square-grid rule looks at), then both sides of 48 and of 64. The cost grows as P squared, so all
#: of 1..64 for every algorithm costs 3.5 times as much; the default range itself is checked below.
SIZES = [*range(1, 34), 47, 48, 49, 63, 64]


@pytest.mark.parametrize("algorithm", [a for a in BUILT_IN if REGISTRY[a].allreduce_builder is not None])
def test_verifier_accepts_every_built_in_algorithm_up_to_64_ranks(algorithm):
    out = verify(functools.partial(build_allreduce_schedule, algorithm), sizes=SIZES)
    assert out["cases"] == 3 * len(SIZES)


def test_the_verifiers_default_range_is_every_p_from_1_to_64():
    seen = set()

    def doubling(rank, size, count):  # the cheapest to verify: P log P messages
        seen.add(size)
        return build_allreduce_schedule("recursive_doubling", rank, size, count)
    assert verify(doubling)["cases"] == 3 * 64 and seen == set(range(1, 65))


@pytest.mark.parametrize("algorithm", [a for a in BUILT_IN if REGISTRY[a].allreduce_builder is not None])
def test_simulator_runs_every_built_in_algorithm_as_numpy_sums_it(algorithm):
    """The executor's compiled program, in place and from a separate input, replayed for P = 1, 2, 3, 5, 8."""
    builder = functools.partial(build_allreduce_schedule, algorithm)
    for P in (1, 2, 3, 5, 8):
        for count in (0, 1, P - 1, 2 * P + 1):
            for fi in (False, True):
                got, want = _run(builder, P, count, fi)
                assert all(np.array_equal(g, want) for g in got), (P, count, fi)


@pytest.mark.parametrize("builder", [alltoall_allreduce, bidirectional_ring_allreduce])
def test_verifier_accepts_the_guide_examples_up_to_64_ranks(builder):
    verify(builder, sizes=SIZES)
    for P in range(2, 9):  # and they compute it: in place and from a separate input
        for fi in (False, True):
            got, want = _run(builder, P, 2 * P + 1, fi)
            assert all(np.array_equal(g, want) for g in got)


def test_verifier_checks_the_other_collectives():
    from collectives.schedules.ring import ring_allgather, ring_reduce_scatter
    from collectives.schedules.tree import tree_broadcast, tree_reduce
    verify(ring_reduce_scatter, "reduce_scatter", sizes=range(1, 17))
    verify(ring_allgather, "allgather", sizes=range(1, 17))
    verify(tree_broadcast, "broadcast", sizes=range(1, 17))
    verify(tree_reduce, "reduce", sizes=range(1, 17))
    with pytest.raises(ScheduleViolation, match="missing") as err:  # a reduce-scatter is no all-reduce
        verify(ring_reduce_scatter, "allreduce", sizes=[3])
    assert err.value.kind == "missing" and err.value.rank == 0
    with pytest.raises(ScheduleViolation, match="read before write"):  # an all-reduce has no input to reduce
        verify(lambda r, P, b: build_allreduce_schedule("ring", r, P, b[-1]), "allgather", sizes=[3], counts=[6])


# -- the corpus: each wrong schedule refused with its violation -----------------------------------------

def _ring(P, n, edit=None):
    s = [build_allreduce_schedule("ring", r, P, n) for r in range(P)]
    if edit:
        edit(s)
    return s


def _set(s, rank, index, sends=None, recvs=None):
    rd = s[rank].rounds[index]
    s[rank].rounds[index] = Round(rd.sends if sends is None else sends, rd.recvs if recvs is None else recvs, rd.phase)


def _drop_message(s):  # rank 0's first send and rank 1's first receive go: rank 1 misses rank 0's share
    _set(s, 0, 0, sends=[])
    _set(s, 1, 0, recvs=[])


def _double(s):  # rank 1 reduces the same message twice: rank 0's contribution doubled (and 0 sends twice)
    _set(s, 0, 0, sends=s[0].rounds[0].sends * 2)
    _set(s, 1, 0, recvs=s[1].rounds[0].recvs * 2)


def _short(s):  # rank 1 expects one element less than rank 0 sends
    p, a, b, red = s[1].rounds[0].recvs[0]
    _set(s, 1, 0, recvs=[(p, a, b - 1, red)])


def _unmatched(s):  # rank 1 posts a receive from rank 2 that rank 2 never sends
    _set(s, 1, 0, recvs=list(s[1].rounds[0].recvs) + [(2, 0, 1, True)])


def _deadlock(s):  # ranks 0 and 1 each receive first, then send: each waits for the other forever
    for r in (0, 1):
        rd = s[r].rounds[0]
        other = Round([(1 - r, 0, 2)], [], "late")
        s[r].rounds[0] = Round([], [(1 - r, 0, 2, True)], "early")
        s[r].rounds.insert(1, other)
        del rd


CORPUS = [
    ("missing", lambda: _ring(3, 6, _drop_message), r"rank 0 after its final round, region \[4, 6\): contributions of rank\(s\) 0 missing"),
    ("doubled", lambda: _ring(3, 6, _double), r"contributions of rank\(s\) 0 counted more than once"),
    ("length", lambda: _ring(3, 6, _short), r"rank 1 round 0, region \[4, 5\): length: receives 1 elements from rank 0, whose matching send .* has 2"),
    ("unmatched receive", lambda: _ring(3, 6, _unmatched), r"rank 1 round 0, region \[0, 1\): unmatched receive: receive from rank 2"),
    # rank 1 drops its first receive: rank 0's messages then meet its later receives, the last one none
    ("unmatched send", lambda: _ring(3, 6, lambda s: _set(s, 1, 0, recvs=[])), r"rank 0 round 3, region \[4, 6\)"),
    ("read before write", lambda: [Schedule("r", r, 2, 4, [Round([(1 - r, 0, 4)], [(1 - r, 0, 4, True)])])
                                   for r in range(2)], None),
    ("deadlock", lambda: [Schedule("d", r, 2, 2, [Round([], [(1 - r, 0, 2, True)]), Round([(1 - r, 0, 2)], [])])
                          for r in range(2)], r"rank 0 in its round 0 waits for rank 1 to reach its round 1"),
    ("misplaced", lambda: [Schedule("m", r, 2, 4, [Round([(1 - r, 0, 2)], [(1 - r, 2, 4, True)])]) for r in range(2)],
     r"reduces inputs' elements from position x \+ -2"),
]


@pytest.mark.parametrize("kind,build,text", CORPUS, ids=[c[0] for c in CORPUS])
def test_corpus_of_wrong_schedules_each_refused_with_its_violation(kind, build, text):
    schedules = build()
    collective = "allgather" if kind == "read before write" else "allreduce"
    with pytest.raises(ScheduleViolation) as err:
        check(schedules, collective)
    assert err.value.kind == kind, str(err.value)
    if text:
        assert __import__("re").search(text, str(err.value)), str(err.value)


# -- random schedules of the allowed forms -----------------------------------------------------------------

@st.composite
def _schedules(draw):
    """An all-reduce built from random pieces, sometimes broken by one random edit.

    The vector is cut into random blocks; each block is reduced to a random owner either directly
    (every other rank sends it in one round; the owner reduces all P - 1 messages into it) or along
    a random chain, then spread back directly (copies) or along a chain. Blocks run side by side, so
    rounds hold several messages, several to one peer, and reductions into one region.
    """
    P = draw(st.integers(1, 5))
    count = draw(st.integers(0, 12))
    cuts = sorted(draw(st.lists(st.integers(0, count), max_size=4)))
    bounds = [0] + cuts + [count]
    rounds = [dict() for _ in range(P)]  # rank -> {round: ([sends], [recvs])}

    def add(t, src, dst, a, b, red):
        rounds[src].setdefault(t, ([], []))[0].append((dst, a, b))
        rounds[dst].setdefault(t, ([], []))[1].append((src, a, b, red))

    for a, b in zip(bounds, bounds[1:]):
        owner = draw(st.integers(0, P - 1))
        others = [r for r in range(P) if r != owner]
        t = 0
        if draw(st.booleans()):
            for r in others:
                add(0, r, owner, a, b, True)
            t = 1
        else:
            chain = draw(st.permutations(others)) + [owner]
            for k in range(len(chain) - 1):
                add(k, chain[k], chain[k + 1], a, b, True)
            t = len(chain) - 1
        if draw(st.booleans()):
            for r in others:
                add(t, owner, r, a, b, False)
        else:
            chain = [owner] + draw(st.permutations(others))
            for k in range(len(chain) - 1):
                add(t + k, chain[k], chain[k + 1], a, b, False)
    edit = draw(st.sampled_from(["none", "none", "flip", "drop", "twice"]))
    scheds = []
    for r in range(P):
        rs = [Round(*rounds[r][t]) if t in rounds[r] else Round() for t in range(max(rounds[r], default=-1) + 1)]
        scheds.append(rs)
    busy = [(r, i) for r in range(P) for i, rd in enumerate(scheds[r]) if rd.recvs]
    if edit != "none" and busy:
        r, i = draw(st.sampled_from(busy))
        rd = scheds[r][i]
        j = draw(st.integers(0, len(rd.recvs) - 1))
        p, a, b, red = rd.recvs[j]
        recvs = list(rd.recvs)
        if edit == "flip":
            recvs[j] = (p, a, b, not red)
        elif edit == "twice":
            recvs.insert(j, (p, a, b, red))
            k = [m for m, rr in enumerate(scheds[p]) if any(s[0] == r and (s[1], s[2]) == (a, b) for s in rr.sends)]
            sd = scheds[p][k[0]]
            scheds[p][k[0]] = Round(list(sd.sends) + [(r, a, b)], sd.recvs, sd.phase)
        else:
            del recvs[j]
        scheds[r][i] = Round(rd.sends, recvs, rd.phase)
    return [Schedule("random", r, P, count, scheds[r]) for r in range(P)]


@settings(max_examples=300, deadline=None)
@given(_schedules(), st.booleans())
def test_a_schedule_the_verifier_accepts_computes_the_allreduce(schedules, from_input):
    P, count = len(schedules), schedules[0].count
    try:
        check(schedules)
    except ScheduleViolation:
        return
    rng = np.random.default_rng(count)
    data = [rng.integers(-1000, 1000, count) for _ in range(P)]
    want = np.sum(data, axis=0) if count else np.zeros(0, np.int64)
    replay(schedules, data, from_input=from_input)
    for r in range(P):
        assert np.array_equal(data[r], want), (r, data[r], want)


# -- registration --------------------------------------------------------------------------------------------

def test_register_verifies_first_and_refuses_a_wrong_algorithm():
    def half(rank, size, count):
        """Only the reduce-scatter half."""
        from collectives.schedules.ring import ring_reduce_scatter
        return Schedule("half", rank, size, count, ring_reduce_scatter(rank, size, count).rounds)
    with pytest.raises(ScheduleViolation, match=r"allreduce P=2 count=1: rank 1 after its final round, region \[0, 1\): contributions of rank\(s\) 0"):
        register_algorithm("half", half, sizes=range(1, 9))
    assert "half" not in names("allreduce")


def test_register_then_every_table_sees_it_and_unregister():
    from collectives.calls.allreduce import ALGORITHMS
    assert "a2a" not in ALGORITHMS
    register_algorithm("a2a", alltoall_allreduce, sizes=range(1, 9))
    try:
        assert "a2a" in ALGORITHMS and list(ALGORITHMS)[-3:] == ["a2a", "mpi", "auto"]
        assert register_algorithm("a2a", alltoall_allreduce) is REGISTRY["a2a"]  # again: nothing changes
        with pytest.raises(ValueError, match="already registered with another builder"):
            register_algorithm("a2a", bidirectional_ring_allreduce)
        from collectives.model.cost import simulate, Topology
        assert simulate("a2a", 8, 8 * 2 ** 20, Topology(alpha_inter=1e-5, beta_inter=1e-9)) > 0
    finally:
        unregister_algorithm("a2a")
    assert "a2a" not in ALGORITHMS


def test_load_algorithm_from_a_file_registers_the_function():
    path = os.path.join(EXAMPLES, "bidirectional_ring.py")
    try:
        spec = f"{path}:bidirectional_ring_allreduce"
        assert load_algorithm(spec, sizes=range(1, 9)) == "bidirectional_ring_allreduce"
        assert load_algorithm(spec) == "bidirectional_ring_allreduce"  # imported once, registered once
        assert "bidirectional_ring_allreduce" in names()
    finally:
        unregister_algorithm("bidirectional_ring_allreduce")
    with pytest.raises(ValueError, match="no file"):
        load_algorithm("nowhere.py:f")


def test_verify_shares_cover_every_size_once():
    """The shares of 1..4 ranks: each size checked by exactly one rank, and a share out of range refused."""
    spec = "collectives.schedules.ring:ring_allreduce"
    for count in range(1, 5):
        seen = []
        for index in range(count):
            with verify_share(index, count):
                name = load_algorithm(spec, sizes=range(1, 12))
            seen += REGISTRY[name].verified["sizes"]
            unregister_algorithm(name)
        assert sorted(seen) == list(range(1, 12)), (count, seen)
    assert load_algorithm(spec, sizes=range(1, 4)) and REGISTRY["ring_allreduce"].verified["sizes"] == (1, 2, 3)
    unregister_algorithm("ring_allreduce")
    with pytest.raises(ValueError, match="0 <= index < count"):
        with verify_share(4, 4):
            pass


WRONG_AT_6 = """
from collectives.schedules.ring import ring_allreduce, ring_reduce_scatter
from collectives.schedules import Schedule

def wrong_at_6(rank, size, count):
    "The ring, but only its reduce-scatter half at P = 6."
    if size == 6:
        return Schedule("wrong_at_6", rank, size, count, ring_reduce_scatter(rank, size, count).rounds)
    return ring_allreduce(rank, size, count)
"""


def test_a_violation_in_one_ranks_share_stops_every_rank_before_training(tmp_path):
    """Four ranks verify P = 1..64 in shares; P = 6 is rank 1's: every rank stops with status 2 before
    a step, rank 1 naming the violation once (oracle: the verifier on the same builder in this process)."""
    from tests.mpirun import run_mpi
    path = tmp_path / "wrong.py"
    path.write_text(WRONG_AT_6)
    with pytest.raises(ScheduleViolation) as want:
        load_algorithm(f"{path}:wrong_at_6")
    res = run_mpi(4, "training.train", "--algorithm", f"{path}:wrong_at_6", "--epochs", "1", "--no-progress",
                  "--run-dir", str(tmp_path / "runs"), timeout=120, check=False)
    out = res.stdout  # (stderr joined to it)
    assert res.returncode == 2 and out.count(str(want.value)) == 1, out
    assert "error: rank 1:" in out and "fails on rank(s) 1 only" in out and "test accuracy" not in out, out


def test_examples_equal_mpi_allreduce_bitwise_for_2_to_8_ranks():
    """One launch per P, every mode and count in it (``tests/mpi_algorithms.py``)."""
    from tests.mpirun import run_mpi
    for P in range(2, 9):
        out = run_mpi(P, "tests.mpi_algorithms", timeout=180).stdout
        assert f"algorithms P={P}: 0 failures" in out, out


def test_an_installed_packages_entry_point_registers_when_its_name_is_asked_for(monkeypatch):
    from collectives.schedules import registry

    class EntryPoint:
        name = "a2a_installed"

        def load(self):
            return alltoall_allreduce

    asked = []
    monkeypatch.setattr(registry.importlib.metadata, "entry_points",
                        lambda group: asked.append(group) or [EntryPoint()])
    monkeypatch.setattr(registry, "_LOADED", [False])
    try:
        registry.check_algorithm("a2a_installed")
        assert asked == [registry.ENTRY_POINTS] and "a2a_installed" in names()
        assert build_allreduce_schedule("a2a_installed", 0, 3, 6).rounds[0].phase == "reduce-scatter"
    finally:
        unregister_algorithm("a2a_installed")

"""The shape of the package: the public face, and the pure parts that run without MPI."""
import os
import subprocess
import sys

import collectives

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_NO_MPI = r"""
import sys

class Block:  # mpi4py is not installed, as far as this process can tell
    def find_spec(self, name, path=None, target=None):
        if name == "mpi4py" or name.startswith("mpi4py."):
            raise ImportError("No module named 'mpi4py' (blocked by the test)")

sys.meta_path.insert(0, Block())
import numpy as np
import collectives
from collectives.errors import CommlabError, Timeout, CollectiveTimeout
from collectives.schedules.registry import build_allreduce_schedule
from collectives.model.simulate import replay
from collectives.model import cost
from collectives.compression import make_compressor

P, n = 5, 23
xs = [np.arange(n, dtype=np.float64) * (r + 1) for r in range(P)]
for alg in ("ring", "tree", "recursive_doubling", "rabenseifner"):
    data = [x.copy() for x in xs]
    replay([build_allreduce_schedule(alg, r, P, n) for r in range(P)], data)
    assert all(np.allclose(d, sum(xs)) for d in data), alg  # NumPy's sum is the oracle
assert cost.predict("ring", 64, 1 << 20, {"alpha": 1e-6, "beta": 1e-9, "gamma": 1e-10}) > 0
c = make_compressor("topk", ratio=0.25)
payloads, ctx = c.compress(np.arange(8.0, dtype=np.float32), "g")
assert c.decompress(payloads, ctx).shape == (8,)
assert issubclass(CollectiveTimeout, Timeout) and issubclass(Timeout, CommlabError)
from collectives.model.auto import model_choice, select_allreduce
assert select_allreduce(4, 1 << 20) == model_choice(4, 1 << 20)  # no MPI library, so no shipped table
from collectives.compression import *  # noqa: F401,F403 - the compressors, none of the MPI parts
assert not any(m.startswith("mpi4py") for m in sys.modules)
print("pure parts ran without mpi4py")
"""


def test_pure_parts_import_and_run_without_mpi4py():
    proc = subprocess.run([sys.executable, "-c", _NO_MPI], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pure parts ran without mpi4py" in proc.stdout


def test_importing_collectives_starts_no_mpi():
    code = "import sys, collectives; assert 'mpi4py' not in sys.modules, sorted(sys.modules); print('ok')"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_public_face_holds_only_the_collectives_request_plan_algorithms_registration_and_errors():
    assert set(collectives.__all__) == {
        "allreduce", "iallreduce", "allreduce_init", "reduce_scatter", "allgather", "broadcast", "reduce",
        "Request", "AllreducePlan", "ALGORITHMS", "register_algorithm",
        "CommlabError", "Timeout", "CollectiveError", "CollectiveMismatch", "CollectiveTimeout", "ProcessFailed"}
    for name in collectives.__all__:
        assert getattr(collectives, name) is not None
    import inspect
    for name in ("allreduce", "iallreduce", "allreduce_init", "reduce_scatter", "allgather", "broadcast", "reduce"):
        params = inspect.signature(getattr(collectives, name)).parameters.values()
        assert [p.name for p in params if p.kind is not p.KEYWORD_ONLY] == ["x"], name  # the data, then keywords
    assert dir(collectives) == sorted(collectives.__all__)
    try:
        collectives.execute
    except AttributeError as e:
        assert "execute" in str(e)
    else:
        raise AssertionError("an engine internal is on the public face")


def test_every_error_raised_on_purpose_has_one_root():
    from collectives.errors import CommlabError, ScheduleDeadlock, Timeout
    from ps.wire.messages import PSError, PSTimeout
    from commlab.file_formats import CheckpointError
    from training.runtime.checkpoint import RunDirError
    for cls in (collectives.CollectiveError, collectives.CollectiveMismatch, collectives.CollectiveTimeout, PSError,
                PSTimeout, CheckpointError, RunDirError, ScheduleDeadlock):
        assert issubclass(cls, CommlabError), cls
    assert issubclass(PSTimeout, Timeout) and issubclass(collectives.CollectiveTimeout, Timeout)
    assert issubclass(CheckpointError, ValueError) and issubclass(PSError, RuntimeError)  # what callers caught before


def test_every_gradient_hook_implements_the_one_contract():
    import numpy as np
    from mpi4py import MPI

    from collectives.compression import make_hook
    from collectives.compression.hook import GradientHook
    from training.dp.hooks import AllreduceHook

    grad = np.arange(6, dtype=np.float32)
    for hook in (AllreduceHook(MPI.COMM_SELF, algorithm="ring"), make_hook("topk", comm=MPI.COMM_SELF, ratio=0.5)):
        assert isinstance(hook, GradientHook), type(hook)
        reduced, info = hook(grad.copy())  # one rank: the mean is the (decompressed) gradient itself
        assert reduced.shape == grad.shape and {"bytes_sent", "compress_s", "decompress_s"} <= set(info)
        assert isinstance(hook.state_dict(), dict) and isinstance(hook.owns_momentum, bool)
        hook.close()
    assert not isinstance(object(), GradientHook)


_ROUTE = r"""
import sys
import numpy as np
import collectives

ENTRY = "collectives.calls.allreduce"
ROUTES = {"collectives.library.mpi_allreduce", "collectives.engine.schedule_allreduce"}
CACHED = "collectives.library.plans"


def walk(fn, data):
    '''Return the stops of the all-reduce's input from the entry: (module, entered again after it was left).

    Every call frame of the project is traced; a frame carries the input when one of its arguments is
    ``data`` or an array sharing its memory (a view, a flat reshape). Following the input, a module is
    entered when such a frame starts while none of its frames carrying the input runs, and left when
    the last of them returns.'''
    events = []

    def carries(frame):
        return any(isinstance(v, np.ndarray) and np.may_share_memory(v, data) for v in frame.f_locals.values())

    def tracer(frame, event, arg):
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(("collectives", "commlab")) or not carries(frame):
            return None
        events.append(("call", name))

        def local(f, ev, a):
            if ev == "return":
                events.append(("return", name))
            return local
        return local

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    live, left, stops = {}, set(), []
    for ev, name in events:
        if ev == "call":
            if not live.get(name):
                stops.append((name, name in left))
            live[name] = live.get(name, 0) + 1
        else:
            live[name] -= 1
            if not live[name]:
                left.add(name)
    return stops


collectives.allreduce(np.zeros(3), algorithm="mpi")  # the first call makes the library context
cases = {"mpi, small": (np.arange(7, dtype=np.float32), "mpi"), "mpi, large": (np.ones(5000), "mpi"),
         "ring": (np.arange(9, dtype=np.float32), "ring"), "auto": (np.arange(5, dtype=np.float32), "auto")}
for name, (data, algorithm) in cases.items():
    for call in ("first", "repeated"):
        stops = walk(lambda: collectives.allreduce(data, algorithm=algorithm), data)
        modules = [m for m, _ in stops]
        again = [m for m, back in stops if back]
        assert modules[0] == ENTRY and not again, (name, call, "entered again after it was left:", again, modules)
        routes = [m for m in modules if m in ROUTES]
        assert len(routes) <= 1, (name, call, modules)  # one route, entered once
        if name == "mpi, small" and call == "repeated":  # the cached plan, found by one look-up before any check
            assert modules == [ENTRY, "collectives.calls.signatures", CACHED], (name, call, modules)
        else:
            assert len(routes) == 1 and modules.index("collectives.arguments") < modules.index(routes[0]), (name, call, modules)
print("one route per call")
"""


def test_an_allreduce_visits_each_module_once_from_check_to_route():
    proc = subprocess.run([sys.executable, "-c", _ROUTE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "one route per call" in proc.stdout

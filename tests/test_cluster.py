"""The emulated cluster: node discovery, link rate, teardown after failure and SIGINT, the privilege error.

Every case runs the real command line (``python -m training.emulator.emulate``) with a hard timeout. They
need network namespaces (root, or unprivileged user namespaces) and iproute2/util-linux: where those
are missing the cases skip with the emulator's own reason.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from training.emulator.emulate import namespace_command
from tests.mpirun import finish

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "COMMLAB_CLUSTER_TEST"


def _unavailable():
    """The reason the emulator cannot run here, or None."""
    from training.emulator.launch import flavour
    from tests.mpirun import mpiexec_path

    try:
        flavour(mpiexec_path())  # MPICH's Hydra or Open MPI's PRRTE
    except ValueError as exc:
        return str(exc)
    for tool in ("unshare", "nsenter", "ip", "tc", "mount", "hostname"):
        if shutil.which(tool) is None:
            return f"'{tool}' not found"
    probe = subprocess.run([*namespace_command(), "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create network namespaces: {probe.stderr.strip()}"
    # what the emulator does inside, tried with the system's tools alone: a tmpfs, a veth pair, tbf
    inside = ("mount -n -t tmpfs probe /run && ip link add p0 type veth peer name p1 && "
              "tc qdisc add dev p0 root tbf rate 1mbit burst 10kb limit 10kb")
    probe = subprocess.run([*namespace_command(), "sh", "-c", inside], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"namespaces lack what the emulator needs (tmpfs, veth, tbf): {probe.stderr.strip()}"
    return None


_WHY = _unavailable()
needs_namespaces = pytest.mark.skipif(_WHY is not None, reason=str(_WHY))


def _cluster(*args, mark=None, timeout=90, **popen):
    """Start ``python -m training.emulator.emulate ARGS`` with the test's marker in its environment."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=ROOT)
    if mark:
        env[MARK] = mark
    return subprocess.Popen([sys.executable, "-m", "training.emulator.emulate", *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            **popen)


def _finish(proc, timeout=90):
    out, err = finish(proc, timeout, "training.emulator.emulate")
    return proc.returncode, out, err


def _marked(mark):
    """PIDs of the processes whose environment carries ``mark`` (the job and its namespaces' holders)."""
    found = []
    needle = f"{MARK}={mark}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            pass
    return found


def _host_state():
    """What the emulator must leave as it found: links, named namespaces, mounts, /run, /dev/shm."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    with open("/proc/self/mountinfo") as f:
        mounts = sorted(" ".join(line.split()[3:5]) for line in f)
    # Open MPI's session directories (prted.PID, prterun.*) belong in the job's own /dev/shm, never the host's /tmp
    tmp = sorted(d for d in os.listdir("/tmp") if d.startswith(("prted.", "prterun.", "prte.")))
    return {"links": sorted(l.split(":")[1].split("@")[0].strip() for l in links.splitlines()),
            "netns": netns, "mounts": mounts, "run": sorted(os.listdir("/run")), "shm": sorted(os.listdir("/dev/shm")),
            "tmp": tmp}


def _assert_clean(before, mark):
    deadline = time.monotonic() + 3
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _marked(mark) == [], "processes of the emulated cluster outlived it"
    assert _host_state() == before


PROBE = r"""
import socket, sys, numpy as np
from mpi4py import MPI
import collectives
from collectives.engine.context import get_context
comm = MPI.COMM_WORLD
local = comm.Split_type(MPI.COMM_TYPE_SHARED)
nodes, per = get_context(comm).nodes()
x = np.arange(1000, dtype=np.float64) * (comm.rank + 1)
want = np.empty_like(x)
comm.Allreduce(x, want)
got = collectives.allreduce(x, algorithm="2d", grid="node")
sys.stdout.write(f"RANK {comm.rank} {socket.gethostname()} {local.size} {nodes} {per} {np.array_equal(got, want)}\n")
"""


RACKS_PROBE = r"""
import os, socket, sys, numpy as np
from mpi4py import MPI
import collectives
from collectives.engine.context import get_context
comm = MPI.COMM_WORLD
x = np.arange(1000, dtype=np.float64) * (comm.rank + 1)
want = np.empty_like(x)
comm.Allreduce(x, want)
got = collectives.allreduce(x, algorithm="torus", grid="topology")
levels = get_context(comm).levels()
from training.settings.config import Config
from training.job import set_threads
sys.stdout.write(f"RANK {comm.rank} {socket.gethostname()} {os.environ.get('COMMLAB_RACKS')} "
                 f"{'x'.join(map(str, levels))} {np.array_equal(got, want)} {set_threads(Config(), comm)}\n")
if comm.rank == 0:
    from commlab.provenance import provenance
    sys.stdout.write(f"PROVENANCE {provenance(command='python -m probe')['command']}\n")
"""


@needs_namespaces
def test_racks_behind_uplinks_give_the_torus_its_third_level():
    """2 racks x 2 nodes x 1 rank behind 100 Mbit/s uplinks: every rank is on its node, sees
    COMMLAB_RACKS=2 and the levels 2 x 2 x 1, and the torus on the job's levels matches MPI; each node's
    BLAS threads are its share of the host's cores (COMMLAB_NODE_CORES), not all of them; a results
    file's provenance names the emulator's command before the one that wrote it (COMMLAB_EMULATED)."""
    rc, out, err = _finish(_cluster("--racks", 2, "--nodes", 2, "--ranks-per-node", 1, "--link", "1gbit",
                                    "--uplink", "100mbit", "--timeout", 60, "--", sys.executable, "-c", RACKS_PROBE))
    assert rc == 0 and "2 racks x 2 nodes x 1 ranks per node" in err and "uplinks 100mbit" in err, out + err
    rows = sorted((m.split() for m in re.findall(r"RANK (\d+ \S+ \S+ \S+ \w+ \d+)", out)), key=lambda r: int(r[0]))
    threads = str(max(1, len(os.sched_getaffinity(0)) // 4))  # 4 nodes share the host's cores, 1 rank each
    assert [r[1:] for r in rows] == [[f"node{k}", "2", "2x2x1", "True", threads] for k in range(4)], out
    assert re.findall(r"PROVENANCE (.*)", out) == [
        "python -m training.emulator.emulate --racks 2 --uplink 100mbit --nodes 2 --ranks-per-node 1 --link 1gbit "
        "-- python -m probe"], out


@needs_namespaces
@pytest.mark.parametrize("n_nodes,per_node", [(2, 2), (3, 1)])
def test_nodes_found_as_configured(n_nodes, per_node):
    """Every rank runs on node rank // K, Split_type sees K ranks per node, and 2d(grid=node) matches MPI."""
    rc, out, err = _finish(_cluster("--nodes", n_nodes, "--ranks-per-node", per_node, "--link", "1gbit",
                                    "--timeout", 60, "--", sys.executable, "-c", PROBE))
    assert rc == 0, out + err
    rows = sorted((m.split() for m in re.findall(r"RANK (\d+ \S+ \d+ \d+ \d+ \w+)", out)), key=lambda r: int(r[0]))
    assert [int(r[0]) for r in rows] == list(range(n_nodes * per_node)), out
    for r in rows:
        rank = int(r[0])
        assert r[1:] == [f"node{rank // per_node}", str(per_node), str(n_nodes), str(per_node), "True"], out


@needs_namespaces
def test_link_rate_within_tolerance(tmp_path):
    """Ping-pong bandwidth over a 50mbit link is within 20 % of 50 Mbit/s, both directions, all pairs."""
    out_file = tmp_path / "calibration.json"
    rc, out, err = _finish(_cluster("--nodes", 2, "--ranks-per-node", 2, "--link", "50mbit", "--timeout", 80,
                                    "--calibrate", "--allow-noisy", "--out", out_file))  # the machine may be busy
    assert rc == 0, out + err
    result = json.loads(out_file.read_text())
    inter = [r for r in result["rows"] if r["kind"] == "inter-node"]
    assert len(inter) == 1 and result["P"] == 4
    for r in inter:
        assert 0.8 * 50e6 <= r["bandwidth_bps"] <= 1.2 * 50e6, out
        # each direction, both busy: well above the half a link shared by its two directions would give
        # (TCP's acknowledgements ride the other direction's shaped queue: 0.80-0.99 measured)
        assert 0.65 * 50e6 <= r["bidirectional_bps"] <= 1.2 * 50e6, out
    assert 0.65 <= result["summary"]["duplex"] <= 1.2, out
    fan = result["summary"]["fanout"]  # node 0 to node 1's two ranks at once: a quarter second in all, then each
    assert [(f["bytes"], f["messages"]) for f in fan] == [(781250, 2), (1562500, 2)], out
    for f in fan:  # the link carries the bytes at its rate: the first of two ends after half the last, at the least
        first, last = f["fractions"]
        assert last == 1.0 and 0.5 * 0.8 <= first <= 1.0, out
    intra = [r for r in result["rows"] if r["kind"] == "intra-node"]
    assert len(intra) == 1 and intra[0]["bandwidth_bps"] > 2 * 50e6, out  # shared memory is not shaped


@needs_namespaces
def test_teardown_after_failing_command():
    """A rank that aborts ends the job with its status, well before the others' 30 s, leaving nothing behind."""
    before, mark = _host_state(), uuid.uuid4().hex
    code = ("import time; from mpi4py import MPI; c = MPI.COMM_WORLD; "
            "c.Abort(3) if c.rank == 1 else time.sleep(30)")
    t = time.monotonic()
    rc, out, err = _finish(_cluster("--nodes", 2, "--link", "100mbit", "--timeout", 60, "--",
                                    sys.executable, "-c", code, mark=mark))
    assert rc == 3, out + err
    assert time.monotonic() - t < 20, out + err
    _assert_clean(before, mark)


@needs_namespaces
def test_teardown_after_timeout_of_a_hung_job():
    """Rank 0 waits for a message rank 1 never sends, under any launcher: --timeout ends it cleanly (124)."""
    before, mark = _host_state(), uuid.uuid4().hex
    code = ("import time; from mpi4py import MPI; c = MPI.COMM_WORLD; "
            "c.recv(source=1) if c.rank == 0 else time.sleep(60)")
    t = time.monotonic()
    rc, out, err = _finish(_cluster("--nodes", 2, "--link", "100mbit", "--timeout", 4, "--",
                                    sys.executable, "-c", code, mark=mark))
    assert rc == 124 and "--timeout 4" in err, out + err
    assert time.monotonic() - t < 20, out + err
    _assert_clean(before, mark)


@needs_namespaces
def test_teardown_after_sigint():
    """SIGINT while the ranks run: exit 130 within the grace period, nothing left on the host."""
    before, mark = _host_state(), uuid.uuid4().hex
    code = "import sys, time; from mpi4py import MPI; sys.stdout.write('up\\n'); time.sleep(60)"
    proc = _cluster("--nodes", 2, "--ranks-per-node", 2, "--link", "100mbit", "--", sys.executable, "-c", code,
                    mark=mark)
    seen = 0
    while seen < 4:
        line = proc.stdout.readline()
        assert line, "the job ended before all ranks started: " + proc.stderr.read()
        seen += line.strip() == "up"
    assert len(_marked(mark)) >= 4 + 2  # four ranks and two node holders run while the job is up
    t = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rc, out, err = _finish(proc, timeout=30)
    assert rc == 130, out + err
    assert time.monotonic() - t < 10
    _assert_clean(before, mark)


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) not found")
def test_clear_error_without_privileges():
    """Without CAP_SYS_ADMIN (capabilities dropped with setpriv) the emulator says so in one line, exit 2."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop the capabilities of a root process")
    env = dict(os.environ, PYTHONPATH=ROOT)
    cmd = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", sys.executable, "-m", "training.emulator.emulate",
           "--nodes", "2", "--link", "1gbit", "--", "true"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "cannot create network namespaces" in lines[0] and "run as root" in lines[0]
    assert "unprivileged user namespaces" in lines[0]


def test_bad_arguments_fail_before_any_namespace():
    """A bad rate, a missing command, a bad count, a launcher of no known MPI, spare slots without ULFM,
    or ULFM under MPICH: exit 2 with the argument named."""
    from training.emulator.launch import flavour
    from tests.mpirun import mpiexec_path

    mpich = [(["--ulfm", "--", "true"], "--ulfm needs Open MPI's mpirun")] if flavour(mpiexec_path()) == "mpich" else []
    for args, word in [*mpich, (["--spare-slots", "2", "--", "true"], "--spare-slots is for replacements"),
                       (["--spare-slots", "-1", "--ulfm", "--", "true"], "--spare-slots"),
                       (["--link", "fast", "--", "true"], "--link"), (["--nodes", "0", "--", "true"], "--nodes"),
                       (["--ranks-per-node", "0", "--", "true"], "--ranks-per-node"), ([], "COMMAND"),
                       (["--calibrate", "--", "true"], "--calibrate"),
                       (["--allow-noisy", "--", "true"], "--allow-noisy are for --calibrate"),
                       (["--mpiexec", "true", "--", "true"], "neither MPICH's nor Open MPI's")]:
        done = subprocess.run([sys.executable, "-m", "training.emulator.emulate", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=30, env=dict(os.environ, PYTHONPATH=ROOT))
        assert done.returncode == 2 and word in done.stderr, (args, done.stderr)


def test_parse_rate_follows_tc_units():
    """tc's units: bit is bits/s, bps is bytes/s, k/m/g are SI, ki/mi/gi IEC."""
    from training.emulator.net import parse_rate
    assert parse_rate("1gbit") == 1e9
    assert parse_rate("100mbit") == 1e8
    assert parse_rate("10mbps") == 8e7
    assert parse_rate("1mibit") == 2 ** 20
    assert parse_rate("5000") == 5000
    assert parse_rate("unlimited") == 0
    for bad in ("", "1 gigabit", "-5mbit", "0mbit", "mbit"):
        with pytest.raises(ValueError):
            parse_rate(bad)


def test_inter_node_bytes_match_the_algorithms_formulas():
    """Bytes leaving the busiest node, from the schedules, equal the closed forms on 4 nodes x 2 ranks.

    Flat ring: one rank per node sends across, 2 (P - 1) / P n. Hierarchical 2d on node rows: each of
    the K ranks all-reduces n / K across the N nodes, K x 2 (N - 1) / N x n / K.
    """
    from experiments.cluster.node_collectives import node_bytes
    n, P, K, N = 1 << 16, 8, 2, 4
    assert node_bytes("ring", P, K, n // 4) == 2 * (P - 1) / P * n
    assert node_bytes("2d", P, K, n // 4) == K * 2 * (N - 1) / N * n / K
    assert node_bytes("ring", 4, 4, n // 4) == 0  # one node: nothing crosses


def test_model_replay_equals_the_simulator_without_sharing():
    """The calibration's replay with independent links is collectives.model.cost.simulate; sharing only slows it."""
    from collectives.model import cost
    from experiments.cluster.model import ALGS, simulate
    topo = cost.Topology(ranks_per_node=2, alpha_inter=50e-6, beta_inter=8 / 1e9)
    for alg in ALGS:
        want = cost.simulate(alg, 8, 1 << 18, topo)
        assert simulate(alg, 8, 1 << 18, topo, False) == pytest.approx(want, rel=1e-9)
        assert simulate(alg, 8, 1 << 18, topo, True) >= want * (1 - 1e-9)
    one = cost.Topology(ranks_per_node=1, alpha_inter=50e-6, beta_inter=8 / 1e9)
    for alg in ALGS:  # one rank per node: nothing to share (a rank's own sends already queue up)
        assert simulate(alg, 4, 1 << 18, one, True) == pytest.approx(simulate(alg, 4, 1 << 18, one, False))
    # 2d's column phase sends K = 2 messages out of every node at once: its inter-node part doubles
    shared, alone = simulate("2d", 8, 1 << 20, topo, True), simulate("2d", 8, 1 << 20, topo, False)
    assert 1.8 < shared / alone < 2.0


def test_compression_report_reads_epoch_times(tmp_path):
    """Step time leaves the evaluation out; time to target keeps it and is quantized to epochs."""
    from experiments.cluster.compression import report
    runs = []
    for spec, per_step in (("none", 0.04), ("topk:ratio=0.01", 0.01)):
        d = tmp_path / spec
        d.mkdir()
        with open(d / "epochs.jsonl", "w") as f:
            for e, acc in enumerate((0.90, 0.96, 0.97), 1):  # 0.5 s of evaluation after every epoch
                f.write(json.dumps({"epoch": e, "steps": 10, "wall_s": e * (10 * per_step + 0.5), "test_acc": acc}) + "\n")
        with open(d / "metrics.jsonl", "w") as f:
            for e in range(3):
                for k in range(1, 11):
                    f.write(json.dumps({"epoch": e + 1, "wall_s": e * (10 * per_step + 0.5) + k * per_step}) + "\n")
        runs.append({"spec": spec, "seed": 0, "run_dir": str(d), "final_test_acc": 0.97, "bytes_per_step": 1})
    rows = {r["spec"]: r for r in report({"net": {"runs": runs}}, 0.95)}
    assert rows["topk:ratio=0.01"]["step_ms"] == pytest.approx(10.0)
    assert rows["topk:ratio=0.01"]["speedup"] == pytest.approx(4.0)
    assert rows["none"]["time_to_target_s"] == pytest.approx(1.8)  # end of epoch 2, evaluations included
    assert rows["topk:ratio=0.01"]["acc_cost_points"] == 0


@needs_namespaces
def test_a_replicated_servers_primary_dies_across_emulated_nodes(tmp_path):
    """2 nodes x 3 ranks, launched with --survive-crashes: the primary of the only shard (rank 0, node0)
    exits at its 60th message; the workers, on both nodes, fail over to its backup (rank 1) across the
    emulated links, and the run's records (written by a worker) show the lost server and no lost update."""
    train = ["--data", "digits", "--hidden", "16", "--epochs", "1", "--batch-size", "48", "--no-progress",
             "--threads", "1", "--mode", "ps", "--servers", "2", "--ps-replicas", "2", "--ps-timeout", "1",
             "--run-dir", str(tmp_path), "--name", "crash"]
    rc, out, err = _finish(_cluster("--nodes", 2, "--ranks-per-node", 3, "--link", "1gbit", "--survive-crashes",
                                    "--timeout", 100, "--", sys.executable, "-m", "experiments.faults.crash", "ps", 0,
                                    60, *train), timeout=120)
    assert "rank 0: exiting (injected crash" in out + err, out + err
    with open(tmp_path / "crash" / "summary.json") as f:
        summary = json.load(f)
    assert summary["servers_lost"] == [0] and summary["lost_acknowledged"] == 0, (summary, out + err)
    assert summary["failovers"] == 4 and summary["worker_status"] == ["done"] * 4, summary

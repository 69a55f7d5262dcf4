"""The emulated cluster's launch line: MPICH's Hydra or Open MPI's PRRTE started across the nodes.

Both launchers start their per-node daemon (Hydra's ``hydra_pmi_proxy``, PRRTE's ``prted``) through
an ssh stand-in (:func:`training.emulator.net.launcher_script`) and run the ranks' messages over
TCP on the nodes' ``eth0``, shared memory within a node:

* MPICH: ``mpiexec -launcher ssh -launcher-exec RSH -localhost head -iface eth0 -hosts node0:K,...
  -ppn K -n N*K``, with ``MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp`` (the ``mpich`` wheel's default
  UCX netmod refuses TCP between namespaces);
* Open MPI 5: ``mpirun --prtemca plm_ssh_agent RSH --prtemca prte_tmpdir_base /dev/shm --host node0:K,... --map-by slot --bind-to none
  --prtemca oob_tcp_if_include eth0 --mca pml ob1 --mca btl self,sm,tcp --mca btl_tcp_if_include
  eth0 -n N*K`` (``plm_ssh_agent`` is PRRTE's name of Open MPI 4's ``plm_rsh_agent``; ``sm`` is the
  shared-memory transport once called ``vader``; ``ob1`` keeps the wheel's UCX out, as for MPICH),
  with ``OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1`` (the emulator is root in its namespaces) and the
  launcher's directory first on ``PATH``, where the stand-in's shell on a node looks for ``prted``;
  the session directories go to the job's own ``/dev/shm`` (:data:`SESSION_DIR`).

Ranks are placed by slot in both: rank r on node r // K.
"""
import functools
import os
import shutil
import subprocess
import sys

__all__ = ["MPICH_ENV", "OPENMPI_ENV", "SESSION_DIR", "default_mpiexec", "flavour", "launch_command", "launch_env"]

#: Environment MPICH needs across namespaces: the OFI netmod with libfabric's TCP provider.
MPICH_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
#: Where Open MPI's launcher and daemons keep their session directories: the job's own ``/dev/shm``
#: (:func:`training.emulator.net.build` mounts it), not ``/tmp``, which the host shares. A daemon's
#: directory is named by its PID, which restarts in every emulated job's PID namespace: a job
#: killed before its cleanup left ``/tmp/prted.38`` behind, and every later job's daemon of that PID
#: failed to start (status 213).
SESSION_DIR = "/dev/shm"
#: Environment Open MPI 5 needs to run as (namespace) root.
OPENMPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def default_mpiexec():
    """Return the ``mpiexec`` beside this Python (its venv's MPI), else the one on ``PATH``.

    Examples
    --------
    >>> default_mpiexec().endswith("mpiexec")
    True
    """
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else (shutil.which("mpiexec") or "mpiexec")


@functools.lru_cache(maxsize=None)
def flavour(mpiexec):
    """Return ``"mpich"`` or ``"openmpi"``: whose launcher ``mpiexec`` is (from its ``--version``).

    Parameters
    ----------
    mpiexec : str
        Path or name of the launcher.

    Raises
    ------
    ValueError
        When it cannot be run or is neither MPICH's Hydra nor Open MPI's PRRTE launcher.
    """
    try:
        text = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"--mpiexec {mpiexec}: cannot run it ({exc})") from None
    if "Open MPI" in text or "PRRTE" in text:
        return "openmpi"
    if "HYDRA" in text or "MPICH" in text:
        return "mpich"
    raise ValueError(f"--mpiexec {mpiexec}: neither MPICH's nor Open MPI's launcher "
                     f"({(text.strip().splitlines() or ['no --version output'])[0]})")


def launch_command(mpiexec, rsh, head, iface, nodes, per_node, command, survive=False, ulfm=False, spare=0):
    """Return the launcher's command line that runs ``command`` on ``per_node`` ranks of every node.

    Parameters
    ----------
    mpiexec : str
        MPICH's ``mpiexec`` or Open MPI's ``mpirun``/``mpiexec`` (:func:`flavour` tells which).
    rsh : str
        Path of the ssh stand-in that enters a node's namespaces.
    head : str
        Host name of the namespace the launcher runs in.
    iface : str
        The interface that joins the nodes (the same name on every node).
    nodes : int
        Number of nodes (host names ``node0``, ``node1``, ...).
    per_node : int
        Ranks per node.
    command : list of str
        What every rank runs.
    survive : bool
        Keep the other ranks running when one dies: MPICH's ``-disable-auto-cleanup`` (a rank that
        exits with a non-zero status), Open MPI's ``--enable-recovery`` (a rank killed by a signal).
    ulfm : bool
        Launch with User-Level Failure Mitigation, Open MPI's ``--with-ft ulfm`` (the survivors of a
        death go on and learn of it from the MPI library: ``--elastic`` training).
    spare : int
        Slots each node keeps free beyond ``per_node`` (Open MPI): ``--host node0:per_node+spare,...``
        with ``--map-by ppr:per_node:node``, so that ``MPI_Comm_spawn`` has room to start replacements
        (``--elastic-respawn``) on the nodes.

    Returns
    -------
    list of str

    Raises
    ------
    ValueError
        When ``ulfm`` or ``spare`` is asked of MPICH's launcher, which has neither.
    """
    hosts = ",".join(f"node{i}:{per_node + spare}" for i in range(nodes))
    n = str(nodes * per_node)
    if flavour(mpiexec) == "openmpi":
        return [mpiexec, *(["--enable-recovery"] if survive else []), *(["--with-ft", "ulfm"] if ulfm else []),
                "--prtemca", "plm_ssh_agent", rsh, "--prtemca", "prte_tmpdir_base", SESSION_DIR, "--host", hosts,
                "--map-by", f"ppr:{per_node}:node" if spare else "slot",
                "--bind-to", "none", "--prtemca", "oob_tcp_if_include", iface, "--mca", "pml", "ob1",
                "--mca", "btl", "self,sm,tcp", "--mca", "btl_tcp_if_include", iface, "-n", n, *command]
    if ulfm or spare:
        raise ValueError("--ulfm and --spare-slots need Open MPI's mpirun (--mpiexec, or the openmpi extra's python): "
                         "MPICH has no User-Level Failure Mitigation")
    return [mpiexec, *(["-disable-auto-cleanup"] if survive else []), "-launcher", "ssh", "-launcher-exec", rsh,
            "-localhost", head, "-iface", iface, "-hosts", hosts, "-ppn", str(per_node), "-n", n, *command]


def launch_env(mpiexec, base=None):
    """Return the launcher's environment: ``base`` (default ``os.environ``) plus what it needs.

    Values already in ``base`` are kept, so a user may override them.
    """
    env = dict(os.environ if base is None else base)
    if flavour(mpiexec) == "openmpi":
        for key, value in OPENMPI_ENV.items():
            env.setdefault(key, value)
        bindir = os.path.dirname(os.path.abspath(shutil.which(mpiexec) or mpiexec))
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    else:
        for key, value in MPICH_ENV.items():
            env.setdefault(key, value)
    return env

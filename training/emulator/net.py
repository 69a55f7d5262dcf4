"""The emulated cluster's network: one network namespace per node, a bridge, shaped veth links.

Runs inside the private network, mount, UTS and PID namespaces that :mod:`training.emulator.emulate`
creates with ``unshare`` (it never touches the host's network). The picture, for N nodes::

    head namespace (mpiexec runs here)           node namespaces (the ranks run here)
    eth0: bridge, 10.77.0.254  "head"   --+-- n0 ==veth== eth0 10.77.0.1  "node0"
                                          +-- n1 ==veth== eth0 10.77.0.2  "node1"  ...

With racks (:func:`build`'s ``racks``), each rack's node ports sit on a rack bridge ``rJ`` that reaches
the head's bridge through one shaped uplink pair ``uJ ==veth== cJ``.

Every node is a process holding its own network and UTS namespace (hostname ``nodeI``); the node's
``eth0`` is one end of a veth pair whose other end, ``nI``, is a port of the bridge. A token-bucket
filter (``tc qdisc ... tbf``, Linux ``sch_tbf``) shapes the egress of *both* ends of the pair, so
the link is rate-limited in both directions, like a full-duplex switch port: node -> switch on
``eth0``, switch -> node on ``nI``. There is no delay emulation (``netem`` is absent on this
kernel): the latency is the kernel TCP/IP stack's own. Host names resolve through a private
``/etc/hosts`` bind-mounted in the private mount namespace; the files live on a tmpfs mounted on
``/run`` there, so they vanish with the namespaces.
"""
import os
import re
import subprocess

__all__ = ["HEAD", "IFACE", "parse_rate", "tbf_args", "Node", "build", "hosts_text", "launcher_script"]

#: Host name of the namespace that runs ``mpiexec`` (the bridge's address).
HEAD = "head"
#: Interface name in every namespace: the bridge in the head, the veth end in each node.
IFACE = "eth0"
_SUBNET = "10.77"
_RUN = "/run/commlab"

_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 2 ** 10, "mi": 2 ** 20, "gi": 2 ** 30, "ti": 2 ** 40}


def parse_rate(rate):
    """Return a ``tc`` rate string in bits per second.

    Parameters
    ----------
    rate : str
        ``tc``'s units (tc(8), "RATES"): a bare number or ``bit`` is bits/s, ``kbit``, ``mbit``,
        ``gbit``, ``tbit`` (SI) and ``kibit``... (IEC); ``bps``, ``kbps``, ``mbps``... are *bytes*/s.
        ``unlimited`` (no shaping) gives 0.

    Returns
    -------
    float
        Bits per second; 0.0 for ``unlimited``.

    Raises
    ------
    ValueError
        When the string is not a positive rate in those units.
    """
    text = str(rate).strip().lower()
    if text == "unlimited":
        return 0.0
    m = re.fullmatch(r"(\d+(?:\.\d*)?)\s*(?:([kmgt]i?)?(bit|bps))?", text)
    if m is None:
        raise ValueError(f"--link {rate!r}: not a tc rate such as 10mbit, 100mbit, 1gbit or 'unlimited'")
    value = float(m.group(1)) * _UNITS[m.group(2) or ""] * (8 if m.group(3) == "bps" else 1)
    if value <= 0:
        raise ValueError(f"--link {rate!r}: the rate must be positive")
    return value


def tbf_args(bits_per_s, mtu=1500):
    """Return the ``tc qdisc add ... tbf`` arguments for one direction of a link.

    The bucket (``burst``) holds 2 ms of traffic and at least 4 full frames, the queue (``limit``)
    100 ms and at least 64 frames; smaller buckets cost a timer wake-up per few frames on this
    2-core machine, larger ones let short messages pass above the rate.

    Parameters
    ----------
    bits_per_s : float
        Link rate, bits per second.
    mtu : int
        Interface MTU, bytes.

    Returns
    -------
    list of str
    """
    byte_rate = bits_per_s / 8
    frame = mtu + 14
    burst = max(int(byte_rate * 0.002), 4 * frame)
    limit = max(int(byte_rate * 0.1), 64 * frame)
    return ["tbf", "rate", f"{int(bits_per_s)}bit", "burst", str(burst), "limit", str(limit)]


def _run(*cmd):
    """Run one setup command; ``RuntimeError`` with its output when it fails."""
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stdout.strip()}")


class Node:
    """One emulated node: a sleeping process that holds a network and a UTS namespace.

    Parameters
    ----------
    index : int
        Node number; host name ``node{index}``, address ``10.77.0.{index + 1}``.
    """

    __slots__ = ("index", "name", "address", "proc")

    def __init__(self, index):
        self.index = index
        self.name = f"node{index}"
        self.address = f"{_SUBNET}.{index // 250}.{index % 250 + 1}"
        script = f"hostname {self.name} && echo ready && exec sleep 2147483647"
        self.proc = subprocess.Popen(["unshare", "--net", "--uts", "--", "sh", "-c", script],
                                     stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"could not create the namespaces of {self.name}")

    def netns(self):
        """Return the path of the node's network namespace (``/proc/PID/ns/net``)."""
        return f"/proc/{self.proc.pid}/ns/net"

    def run(self, *cmd):
        """Run a setup command inside the node's network namespace."""
        _run("nsenter", f"--net={self.netns()}", "--", *cmd)

    def stop(self):
        """End the holder process (its namespaces go with it)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def hosts_text(nodes):
    """Return the private ``/etc/hosts``: localhost, the head and every node."""
    lines = ["127.0.0.1 localhost", f"{_SUBNET}.255.254 {HEAD}"]
    lines += [f"{n.address} {n.name}" for n in nodes]
    return "\n".join(lines) + "\n"


def launcher_script(nodes):
    """Return the ``-launcher-exec`` program: an ssh stand-in that enters the target node.

    Hydra's ssh launcher calls it as ``PROGRAM [-x] HOST "COMMAND" ARGS...``; like ssh it joins
    COMMAND and ARGS with spaces and hands them to ``sh -c``, here inside HOST's network and UTS
    namespaces (``nsenter``). The node table is written into the script.
    """
    cases = "\n".join(f"  {n.name}) pid={n.proc.pid} ;;" for n in nodes)
    return f"""#!/bin/sh
# ssh stand-in for the emulated cluster: run the command inside the named node's namespaces.
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host=$1; shift
case "$host" in
{cases}
  *) echo "emulated cluster: unknown host '$host'" >&2; exit 255 ;;
esac
exec nsenter --net=/proc/$pid/ns/net --uts=/proc/$pid/ns/uts -- /bin/sh -c "$*"
"""


def build(n_nodes, bits_per_s, mtu=1500, racks=1, uplink_bps=0.0):
    """Create the cluster's network in the current (private) namespaces.

    Mounts a tmpfs on ``/run`` and one on ``/dev/shm``, brings up ``lo`` and the bridge, starts one :class:`Node` per node,
    joins each to the bridge with a veth pair shaped in both directions (no shaping when
    ``bits_per_s`` is 0), bind-mounts the private ``/etc/hosts`` and writes the launcher script.

    With ``racks`` > 1 the nodes are split into that many racks of equal size (node ``i`` in rack
    ``i // (n_nodes / racks)``): each rack has a bridge of its own (``rJ``), joined to the core bridge
    by one veth pair (``uJ`` on the rack's side, ``cJ`` on the core's), shaped in both directions at
    ``uplink_bps``, so that the rack's nodes share one uplink: its rate divided by the rack's node
    links is the oversubscription (a 1 Gbit/s uplink over two 1 Gbit/s node links: 2:1).

    Parameters
    ----------
    n_nodes : int
        Number of nodes (all racks together).
    bits_per_s : float
        Link rate per direction, bits per second; 0 leaves the links unshaped.
    mtu : int
        MTU of every link, bytes.
    racks : int
        Number of racks; it divides ``n_nodes``.
    uplink_bps : float
        Rate of each rack's uplink per direction, bits per second; 0 leaves the uplinks unshaped.

    Returns
    -------
    (list of Node, str)
        The nodes and the path of the launcher script.

    Raises
    ------
    RuntimeError
        When a setup command fails (its output is in the message).
    """
    _run("mount", "-n", "-t", "tmpfs", "-o", "mode=755,size=1m", "commlab", "/run")
    # the job's own /dev/shm: a killed rank's shared-memory segments go with the namespace, and a
    # later job (the same PIDs in a new PID namespace, so the same segment names) finds none of them
    _run("mount", "-n", "-t", "tmpfs", "-o", "mode=1777", "commlab-shm", "/dev/shm")
    os.makedirs(_RUN)
    os.symlink("/dev/shm", "/run/shm")
    _run("ip", "link", "set", "lo", "up")
    _run("ip", "link", "add", IFACE, "type", "bridge")
    _run("ip", "addr", "add", f"{_SUBNET}.255.254/16", "dev", IFACE)
    _run("ip", "link", "set", IFACE, "mtu", str(mtu), "up")
    if racks < 1 or n_nodes % racks:
        raise RuntimeError(f"{racks} racks do not divide {n_nodes} nodes")
    per_rack = n_nodes // racks
    for j in range(racks if racks > 1 else 0):  # rack bridges, each behind one shaped uplink to the core
        _run("ip", "link", "add", f"r{j}", "type", "bridge")
        _run("ip", "link", "set", f"r{j}", "mtu", str(mtu), "up")
        _run("ip", "link", "add", f"u{j}", "mtu", str(mtu), "type", "veth", "peer", "name", f"c{j}")
        _run("ip", "link", "set", f"u{j}", "master", f"r{j}", "up")
        _run("ip", "link", "set", f"c{j}", "master", IFACE, "up")
        if uplink_bps:
            for end in (f"u{j}", f"c{j}"):
                _run("tc", "qdisc", "add", "dev", end, "root", *tbf_args(uplink_bps, mtu))
    nodes = []
    try:
        for i in range(n_nodes):
            node = Node(i)
            nodes.append(node)
            port = f"n{i}"
            _run("ip", "link", "add", port, "mtu", str(mtu), "type", "veth", "peer", "name", IFACE,
                 "netns", str(node.proc.pid))
            _run("ip", "link", "set", port, "master", f"r{i // per_rack}" if racks > 1 else IFACE, "up")
            node.run("ip", "link", "set", "lo", "up")
            node.run("ip", "addr", "add", f"{node.address}/16", "dev", IFACE)
            node.run("ip", "link", "set", IFACE, "up")
            if bits_per_s:
                _run("tc", "qdisc", "add", "dev", port, "root", *tbf_args(bits_per_s, mtu))
                node.run("tc", "qdisc", "add", "dev", IFACE, "root", *tbf_args(bits_per_s, mtu))
        with open(f"{_RUN}/hosts", "w") as f:
            f.write(hosts_text(nodes))
        _run("mount", "-n", "--bind", f"{_RUN}/hosts", "/etc/hosts")
        script = f"{_RUN}/rsh"
        with open(script, "w") as f:
            f.write(launcher_script(nodes))
        os.chmod(script, 0o755)
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    return nodes, script

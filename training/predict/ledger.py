"""The per-rank account of a predicted step, and the profile's compute scaled to a configuration."""
import numpy

__all__ = ["Ledger", "scaled"]


class Ledger:
    """Per-rank seconds of compute, exposed communication, bubble and wait along a synchronous step."""

    def __init__(self, P, cm=1.0):
        self.t, self.cm = 0.0, cm  # the step's clock (seconds); the factor on the profile's compute
        self.parts = {k: numpy.zeros(P) for k in ("compute", "comm", "bubble", "wait")}

    def compute(self, s):
        self.t += s
        self.parts["compute"] += s

    def collective(self, clocks):
        """A collective all ranks enter together; each is busy its own clock, then waits for the slowest."""
        top = float(clocks.max()) if clocks.size else 0.0
        self.t += top
        self.parts["comm"] += clocks
        self.parts["wait"] += top - clocks


def scaled(profile, topo, net, rows):
    """Return per-layer forward and backward seconds (arrays), the extra forward and backward seconds,
    and the compute factor: the profile's times times ``rows / profile.rows``, the topology's
    ``compute_scale`` and the host's oversubscription."""
    cm = topo.compute_scale * net.oversubscription
    f = cm * rows / profile.rows
    fwd = numpy.array([layer["forward_s"] for layer in profile.layers]) * f
    bwd = numpy.array([layer["backward_s"] for layer in profile.layers]) * f
    return fwd, bwd, profile.extra_forward_s * f, profile.extra_backward_s * f, cm

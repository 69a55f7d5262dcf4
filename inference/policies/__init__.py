"""What the front rank decides, as plain objects with no MPI and no HTTP.

- :mod:`inference.policies.batching`: the dynamic batcher (a maximum batch size and a maximum wait);
- :mod:`inference.policies.balance`: load balancing across replicas (round-robin,
  least-outstanding-requests, power of two choices);
- :mod:`inference.policies.slo`: a latency objective (AIMD batch size and admission control).

Imports nothing of the project; every other part of :mod:`inference` may import it.
"""

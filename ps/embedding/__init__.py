"""Embedding tables on the parameter servers (``sparse_push_pull``): a worker pulls the rows its
batch touches and pushes only their gradients, through the dense server's and client's protocol.

Imports: :mod:`ps.serving`, :mod:`ps.worker`, :mod:`ps.shards`, :mod:`ps.wire`; never the job.
"""

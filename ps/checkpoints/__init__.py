"""A parameter server's shard checkpoint (``shard_files``): what a server's file holds, whose run it
is, the generations a resuming job may use, and the checks made before any server resumes.

Imports: :mod:`ps.shards` and the checkpoint file format only; nothing that sends a message.
"""

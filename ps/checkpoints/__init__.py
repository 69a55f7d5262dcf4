"""A parameter server's shard checkpoint (``shard_files``): the file's name, what it holds, whose run it
is, the generations a resuming job may use, and the checks made before any server resumes.

Imports: :mod:`ps.shards` and the checkpoint file format only; nothing that sends a message.
"""

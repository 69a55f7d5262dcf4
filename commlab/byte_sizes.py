"""Byte counts as people write and read them: one parser and one formatter, both binary (K = 1024).

Both are ``humanfriendly``'s ``parse_size`` and ``format_size`` with ``binary=True``: ``"64M"``,
``"64MB"``, ``"64 MiB"`` and ``"67108864"`` all parse to 67,108,864 bytes, which formats as
``"64 MiB"``; 153,640 bytes formats as ``"150.04 KiB"``. Every command-line size (the benchmark's
``--min-bytes``, the simulator's ``--sizes``) and every printed or plotted byte count goes through them.
"""
import argparse

import humanfriendly

__all__ = ["parse_bytes", "format_bytes", "bytes_argument"]

_EXAMPLES = "examples: 4096, 4K, 64M, 1GiB"


def parse_bytes(text, minimum=0):
    """Return the byte count ``text`` names, binary units (K, KB, KiB = 1024 bytes).

    Parameters
    ----------
    text : str or int
        ``"4096"``, ``"4K"``, ``"64 MiB"``, ``"1.5G"`` (a fraction of a byte is cut off).
    minimum : int
        Smallest count accepted, bytes.

    Returns
    -------
    int
        Bytes.

    Raises
    ------
    ValueError
        Naming ``text`` when it is not a byte count (``"inf"``, ``"-1"``, ``"abc"``) or is below
        ``minimum``.
    """
    try:
        value = int(humanfriendly.parse_size(str(text).strip(), binary=True))
    except humanfriendly.InvalidSize:
        raise ValueError(f"not a byte count: {text!r} ({_EXAMPLES})") from None
    if value < minimum:
        raise ValueError(f"{text!r} is below {format_bytes(minimum)} ({_EXAMPLES})")
    return value


def format_bytes(n):
    """Return ``n`` bytes in binary units, e.g. ``'6.74 MiB'``, ``'64 KiB'``, ``'999 bytes'``.

    Parameters
    ----------
    n : int or float
        Bytes, >= 0 (two decimals at most are kept, trailing zeros dropped).

    Returns
    -------
    str
    """
    return humanfriendly.format_size(n, binary=True)


def bytes_argument(minimum=0):
    """Return an ``argparse`` type that reads a byte count with :func:`parse_bytes`.

    Parameters
    ----------
    minimum : int
        Smallest count accepted, bytes.

    Returns
    -------
    callable
        ``str -> int``, raising ``argparse.ArgumentTypeError`` with :func:`parse_bytes`'s message,
        so the usage error names the flag and the value.
    """
    def byte_count(text):
        try:
            return parse_bytes(text, minimum)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return byte_count

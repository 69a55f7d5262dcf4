"""Command-line options with declared ranges: the one parser of every command.

Every command (``training.train``, ``inference.serve``, each ``experiments`` and ``plots`` command)
builds its command line with :class:`Parser`. An option that takes a value declares the values it
accepts once, as its ``type`` -- :func:`integer`, :func:`real`, :func:`text`, :func:`names`,
:func:`listof`, :func:`infile`, :func:`outpath`, :func:`byte_count`, :func:`link_rate` -- or as
``choices``; a parser holding an option that declares none refuses to parse (``TypeError``, before
reading the command line), so an option cannot be added without its range. Checks that tie options
together, or bound the memory a setting implies, are registered with :meth:`Parser.check` and run
inside ``parse_args``: every refusal comes before the command allocates, measures or writes.

Every refusal is one line on stderr, ``PROG: error: MESSAGE (see --help)``, naming the option, and
exit status 2 (argparse's usage block is not printed: ``--help`` prints it).

Examples
--------
>>> p = Parser(prog="demo")
>>> _ = p.add_argument("--steps", type=integer(1, 1000), default=5, help="steps")
>>> p.parse_args(["--steps", "20"]).steps
20
>>> integer(1, 1000)("0")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: must be an integer in [1, 1000], got '0'
"""
from abc import ABC, abstractmethod
import argparse
import math
import os
import sys

from commlab.byte_sizes import format_bytes, parse_bytes

__all__ = ["Parser", "Declared", "integer", "real", "text", "names", "listof", "infile", "outpath", "byte_count",
           "link_rate", "parsed_by", "field_type", "as_flags", "declared", "INT32_MAX"]

#: Largest count any option takes unless it declares less (a 32-bit signed count).
INT32_MAX = 2 ** 31 - 1

#: Actions that take no value, so declare no range.
_NO_VALUE = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction,
             argparse._AppendConstAction, argparse._CountAction, argparse._HelpAction, argparse._VersionAction,
             argparse.BooleanOptionalAction)


class Declared(ABC):
    """The values one option accepts: called on the option's text, returns the value or raises
    ``argparse.ArgumentTypeError`` saying what the option accepts.

    Subclasses set :attr:`what` (the accepted values, in words) and implement :meth:`convert`;
    :meth:`edges` lists texts outside the range, which the tests give to every command.
    """

    what = "a value"

    def __call__(self, text):
        try:
            return self.convert(text)
        except (ValueError, TypeError, OverflowError) as exc:
            reason = str(exc)
            raise argparse.ArgumentTypeError(reason if reason.startswith(("must", "no such", "cannot", "tc "))
                                             else f"must be {self.what}, got {text!r}") from None

    @abstractmethod
    def convert(self, text):
        """Return the value ``text`` stands for; raise ``ValueError`` or ``TypeError`` when it is outside."""

    def edges(self):
        """Return texts this option must refuse (below, above, not a number, ...)."""
        return []

    def __repr__(self):  # argparse names the type in some of its own messages
        return self.what


class _Integer(Declared):
    def __init__(self, low, high):
        self.low, self.high = low, high
        self.what = f"an integer in [{low}, {high}]"

    def convert(self, text):
        text = str(text).strip()
        try:
            value = int(text)
        except ValueError:
            number = float(text)  # "1e6": an integer written as a float
            if not (math.isfinite(number) and number.is_integer()):
                raise
            value = int(number)
        if not self.low <= value <= self.high:
            raise ValueError(f"must be an integer in [{self.low}, {self.high}], got {text!r}")
        return value

    def edges(self):
        return [str(self.low - 1), str(self.high + 1), "1e30", "nan", "1.5", "abc", ""]


class _Real(Declared):
    def __init__(self, low, high, low_open, high_open):
        self.low, self.high, self.low_open, self.high_open = low, high, low_open, high_open
        self.what = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def convert(self, text):
        value = float(str(text).strip())
        below = value <= self.low if self.low_open else value < self.low
        above = value >= self.high if self.high_open else value > self.high
        if not math.isfinite(value) or below or above:
            raise ValueError(f"must be {self.what}, got {text!r}")
        return value

    def edges(self):
        out = ["nan", "inf", "-inf", "abc", ""]
        if math.isfinite(self.low):
            out.append(repr(self.low) if self.low_open else repr(self.low - max(1.0, abs(self.low))))
        if math.isfinite(self.high):
            out.append(repr(self.high) if self.high_open else repr(self.high + max(1.0, abs(self.high))))
        return out


class _Text(Declared):
    def __init__(self, empty, longest, lines):
        self.empty, self.longest, self.lines = empty, longest, lines
        self.what = (f"{'a' if empty else 'a non-empty'} {'text' if lines else 'line of text'} of at most "
                     f"{longest} characters")

    def convert(self, text):
        if not isinstance(text, str) or (not text and not self.empty) or len(text) > self.longest or any(
                c in text for c in ("\0" if self.lines else "\n\r\0")):
            raise ValueError(f"must be {self.what}, got {str(text)[:40]!r}")
        return text

    def edges(self):
        return ["x" * (self.longest + 1), "a\0b" if self.lines else "a\nb"] + ([] if self.empty else [""])


class _Names(Declared):
    def __init__(self, allowed, least):
        self.allowed, self.least = tuple(allowed), least
        self.what = f"a comma-separated list of {', '.join(self.allowed)}"

    def convert(self, text):
        got = tuple(n.strip() for n in str(text).split(",") if n.strip())
        bad = [n for n in got if n not in self.allowed]
        if bad:
            raise ValueError(f"must be {self.what}: unknown {', '.join(bad)}")
        if len(got) < self.least:
            raise ValueError(f"must be {self.what}, at least {self.least} of them, got {text!r}")
        return got

    def edges(self):
        return ["bogus", ","] if self.least else ["bogus"]


class _List(Declared):
    def __init__(self, item, least, most):
        self.item, self.least, self.most = item, least, most
        self.what = f"a comma-separated list of {least} to {most} values, each {item.what}"

    def convert(self, text):
        parts = [p.strip() for p in str(text).split(",") if p.strip()]
        if not self.least <= len(parts) <= self.most:
            raise ValueError(f"must be {self.what}, got {text!r}")
        values = []
        for p in parts:
            try:
                values.append(self.item.convert(p))
            except (ValueError, TypeError, OverflowError):
                raise ValueError(f"must be {self.what}, got {p!r} in {text!r}") from None
        return values

    def edges(self):
        out = [e for e in self.item.edges() if e and "," not in e and "\n" not in e]
        if self.least:
            out.append(",")
        return out


class _InFile(Declared):
    def __init__(self, folder, empty):
        self.folder, self.empty = folder, empty
        self.what = ({True: "an existing folder", False: "an existing readable file"}.get(folder, "an existing file or folder")
                     + (" (or '')" if empty else ""))

    def convert(self, text):
        if text == "" and self.empty:
            return text
        ok = {True: os.path.isdir, False: os.path.isfile}.get(self.folder, os.path.exists)(text)
        if not text or not ok or not os.access(text, os.R_OK):
            kind = {True: "folder", False: "file"}.get(self.folder, "file or folder")
            raise ValueError(f"no such {kind}: {text!r}" if not os.path.exists(text or "") else
                             f"cannot read {text!r}: not a readable {kind}")
        return text

    def edges(self):
        return ([] if self.empty else [""]) + [os.path.join(os.sep, "nonexistent-commlab-input", "x.json")]


class _OutPath(Declared):
    def __init__(self, folder, empty):
        self.folder, self.empty = folder, empty
        self.what = ("a folder to write into" if folder else "a file path to write") + (" (or '')" if empty else "")

    def convert(self, text):
        if text == "" and self.empty:
            return text
        if not text or any(c in text for c in "\n\r\0"):
            raise ValueError(f"must be {self.what}, got {text!r}")
        if not self.folder and os.path.isdir(text):
            raise ValueError(f"cannot write {text!r}: it is a folder")
        if self.folder and os.path.exists(text) and not os.path.isdir(text):
            raise ValueError(f"cannot write into {text!r}: it is a file")
        parent = os.path.dirname(os.path.abspath(text))
        while not os.path.exists(parent):  # made when written: the nearest existing one must be a folder
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            raise ValueError(f"cannot write {text!r}: {parent} is a file")
        return text

    def edges(self):
        return [os.devnull + os.sep + "x"] + ([] if self.empty else [""])


class _Bytes(Declared):
    def __init__(self, low, high):
        self.low, self.high = low, high
        self.what = f"a byte count in [{format_bytes(low)}, {format_bytes(high)}] (4096, 4K, 64M, 1GiB)"

    def convert(self, text):
        value = parse_bytes(text)
        if not self.low <= value <= self.high:
            raise ValueError(f"must be {self.what}, got {text!r}")
        return value

    def edges(self):
        return ["-8", "abc", "nan", "inf", str(self.high + 1)] + ([str(self.low - 1)] if self.low > 0 else [])


class _Rate(Declared):
    what = "a link rate in tc's bits: 10mbit, 100mbit, 1gbit (SI), 1gibit (IEC), or unlimited"

    def convert(self, text):
        import re

        low = str(text).strip().lower()
        if low == "unlimited":
            return low
        m = re.fullmatch(r"(\d+(?:\.\d*)?)\s*(?:([kmgt]i?)?(bit|bps))?", low)
        if m is None or float(m.group(1)) <= 0:
            raise ValueError(f"must be {self.what}, got {text!r}")
        if m.group(3) == "bps":  # tc reads bps as bytes per second: 1gbps is 8 Gbit/s
            bits = f"{float(m.group(1)) * 8:g}{m.group(2) or ''}bit"
            raise ValueError(f"tc reads {text!r} as bytes per second ({bits}); write the rate in bits: {bits}, or "
                             f"{m.group(1)}{m.group(2) or ''}bit for {m.group(1)} {(m.group(2) or '').upper()}bit/s")
        if m.group(3) is None:
            raise ValueError(f"must be {self.what} (a bare number is bits per second to tc: write its unit), "
                             f"got {text!r}")
        return low

    def edges(self):
        return ["1gbps", "0mbit", "-1gbit", "fast", "100"]


def integer(low=0, high=INT32_MAX):
    """Declare an integer option in ``[low, high]`` (an integral float such as ``1e6`` is taken).

    Examples
    --------
    >>> integer(1, 10**9)("1e6"), integer(0)("0")
    (1000000, 0)
    """
    return _Integer(int(low), int(high))


def real(low=-math.inf, high=math.inf, *, low_open=False, high_open=False):
    """Declare a finite number in ``[low, high]`` (``low_open``/``high_open``: the end excluded).

    Examples
    --------
    >>> real(0, 1)("0.5"), real(0, low_open=True).what
    (0.5, 'a number in (0, inf]')
    """
    return _Real(float(low), float(high), low_open, high_open)


def text(empty=True, longest=1 << 16, lines=False):
    """Declare one line of text (no newline or NUL), at most ``longest`` characters, ``''`` if ``empty``;
    with ``lines``, newlines allowed (a command's program text)."""
    return _Text(empty, longest, lines)


def names(allowed, least=1):
    """Declare a comma-separated list of names from ``allowed`` (at least ``least``); gives a tuple.

    Examples
    --------
    >>> names(("ring", "tree"))("ring,tree")
    ('ring', 'tree')
    """
    return _Names(allowed, least)


def listof(item, least=1, most=4096):
    """Declare a comma-separated list of ``least`` to ``most`` values, each of the declared ``item``.

    Examples
    --------
    >>> listof(integer(1, 100))("8,64")
    [8, 64]
    """
    return _List(item, least, most)


def infile(folder=False, empty=False):
    """Declare a path that must exist and be readable now: a file, a folder with ``folder``, either with
    ``folder=None``; ``empty``: ``''`` (none) allowed."""
    return _InFile(folder, empty)


def outpath(folder=False, empty=False):
    """Declare a path to write (a file, or a folder with ``folder``): not a folder where a file is
    wanted, its nearest existing parent a folder; nothing is made here. ``empty``: ``''`` allowed."""
    return _OutPath(folder, empty)


def byte_count(low=0, high=2 ** 40):
    """Declare a byte count in ``[low, high]`` in binary units (:func:`commlab.byte_sizes.parse_bytes`)."""
    return _Bytes(int(low), int(high))


def link_rate():
    """Declare a link rate in ``tc``'s units, in bits (``1gbit``) or ``unlimited``; ``bps`` (bytes per
    second to ``tc``: ``1gbps`` is 8 Gbit/s) and bare numbers are refused with the rate in bits.

    Examples
    --------
    >>> link_rate()("1gbit")
    '1gbit'
    >>> link_rate()("1gbps")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: tc reads '1gbps' as bytes per second (8gbit); write the rate in bits: 8gbit, or 1gbit for 1 Gbit/s
    """
    return _Rate()


def declared(action):
    """Return True when ``action`` (an argparse action) takes no value or declares the values it takes."""
    return isinstance(action, _NO_VALUE) or action.nargs == 0 or isinstance(action.type, Declared) or (
        action.choices is not None)


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose every option declares its range, with one-line errors.

    Parameters
    ----------
    *args, **kwargs
        As for ``argparse.ArgumentParser``.

    Attributes
    ----------
    made : list of Parser
        Class attribute: the parsers made in this process, newest last (the tests walk them).
    """

    made = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._checks = []
        Parser.made.append(self)
        del Parser.made[:-64]

    def check(self, fn):
        """Register ``fn(namespace)``, run after parsing; a ``ValueError`` it raises (its message naming
        the option) becomes the one-line refusal. Returns ``fn`` (usable as a decorator)."""
        self._checks.append(fn)
        return fn

    def undeclared(self):
        """Return the options that take a value without declaring its range (empty when all do)."""
        return [a.option_strings[0] if a.option_strings else a.dest for a in self._actions if not declared(a)]

    def parse_known_args(self, args=None, namespace=None):
        missing = self.undeclared()
        if missing:
            raise TypeError(f"{self.prog}: option(s) {', '.join(missing)} declare no range: give each a type "
                            "from training.settings.options (integer, real, text, names, listof, infile, outpath, ...) "
                            "or choices")
        ns, rest = super().parse_known_args(args, namespace)
        for fn in self._checks:
            try:
                fn(ns)
            except ValueError as exc:
                self.error(str(exc))
        return ns, rest

    def error(self, message):
        """Print ``PROG: error: MESSAGE (see --help)`` on one line and exit with status 2."""
        line = " ".join(str(message).split())
        self.exit(2, f"{self.prog}: error: {line} (see --help)\n")

    def exit(self, status=0, message=None):
        if message:
            sys.stderr.write(message)
            sys.stderr.flush()
        raise SystemExit(status)


class _Custom(Declared):
    def __init__(self, fn, what, edges):
        self.fn, self.what, self._edges = fn, what, list(edges)

    def convert(self, text):
        try:
            return self.fn(text)
        except argparse.ArgumentTypeError as exc:
            raise ValueError(f"must be {self.what}: {exc}") from None

    def edges(self):
        return list(self._edges)


def parsed_by(fn, what, edges=()):
    """Declare an option read by ``fn(text)`` (raising ``ValueError`` or ``argparse.ArgumentTypeError``
    outside its range), accepting ``what`` (words); ``edges``: texts it must refuse."""
    return _Custom(fn, what, edges)


def field_type(kind):
    """Declare the option of a configuration field of type ``kind`` (int, float or str): an integer of
    at most :data:`INT32_MAX` in size, a finite number of at most 1e15 in size, or a line of text. The configuration's own
    ``validate`` narrows these (each field's range is written there once); :func:`as_flags` turns its
    messages into the flags' names."""
    return {int: integer(-INT32_MAX, INT32_MAX), float: real(-1e15, 1e15), str: text(longest=4096)}[kind]


def as_flags(message, fields):
    """Return ``message`` (a configuration's ``ValueError``) led by the flag of the field it names first
    (``batch_size`` -> ``--batch-size: ...``), so that the refusal names what the user typed: a name
    with an underscore wherever it stands, a one-word name (``seed``, also an English word) only where
    the message starts with it. A message naming no field is returned as it is.

    Examples
    --------
    >>> as_flags("batch_size (7) must divide by the servers", ["batch_size", "servers", "seed"])
    '--batch-size: batch_size (7) must divide by the servers'
    >>> as_flags("seed must be >= 0", ["batch_size", "seed"])
    '--seed: seed must be >= 0'
    """
    import re

    message = str(message)
    first = re.match(r"[a-z_0-9]+", message)
    if first and first.group(0) in fields:
        name = first.group(0)
    else:
        found = [m for f in fields if "_" in f for m in re.finditer(r"(?<![\w-])" + re.escape(f) + r"(?![\w])", message)]
        if not found:
            return message
        name = min(found, key=lambda m: (m.start(), -len(m.group(0)))).group(0)
    return f"--{name.replace('_', '-')}: {message}"

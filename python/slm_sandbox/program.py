"""One program, in the child: its namespace (the modules below, the tools, final_answer()), its output
capture into the shared block, and the error line it is reported with.
"""

import sys
import errno
import struct
import builtins
import traceback
import _thread

# Modules every program gets (the reference's extras), imported once here so each fork has them.
import re
import json
import string
import math
import itertools
import collections
from collections import Counter, defaultdict

# Commonly imported by model-written programs: importing them here makes them free in every child
# (and available even where the child's uid could not read the standard library).
import functools, heapq, bisect, random, textwrap, difflib, unicodedata, datetime, typing  # noqa: E401,F401
import urllib.parse, html, pprint, copy, operator, statistics, fractions, decimal, time as _time  # noqa: E401,F401

from .protocol import HEADER, MAX_ERROR_CHARS
from .tools import host_tools


class CpuLimitExceeded(TimeoutError):
    pass


class FinalAnswer(BaseException):
    """Raised by final_answer() to end the program (BaseException: `except Exception` does not catch it)."""


class Capture:
    """sys.stdout/sys.stderr for the program: UTF-8 into the shared block, capped in characters."""

    def __init__(self, shm, cap):
        self.shm, self.cap, self.chars, self.pos, self.truncated = shm, cap, 0, 0, False
        self.sealed = False
        self.lock = _thread.allocate_lock()
        self.encoding, self.errors = 'utf-8', 'replace'

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError('write() argument must be str, not %s' % type(s).__name__)
        with self.lock:
            if self.truncated or self.sealed:
                return len(s)
            take = s
            if self.chars + len(s) > self.cap:
                take = s[: self.cap - self.chars]
                self.truncated = True
            b = take.encode('utf-8', 'replace')
            self.shm[HEADER + self.pos : HEADER + self.pos + len(b)] = b
            self.pos += len(b)
            self.chars += len(take)
            self.shm[0:8] = struct.pack('<II', self.pos, 1 if self.truncated else 0)
        return len(s)

    def seal(self):
        """No more output (threads still running must not change the block the zygote reads)."""
        with self.lock:
            self.sealed = True

    def writelines(self, lines):
        for s in lines:
            self.write(s)

    def flush(self):
        pass

    def isatty(self):
        return False

    def writable(self):
        return True

    def fileno(self):
        raise OSError(errno.EBADF, 'the sandbox output has no file descriptor')


def error_line(e):
    """The exception's last line, as a traceback would print it."""
    if isinstance(e, SyntaxError) and e.lineno is not None:
        line = '%s: %s (line %s)' % (type(e).__name__, e.msg, e.lineno)
    else:
        try:
            line = traceback.format_exception_only(type(e), e)[-1].rstrip('\n')
        except Exception:
            line = type(e).__name__
    if len(line) > MAX_ERROR_CHARS:
        line = line[:MAX_ERROR_CHARS] + '...'
    return line


def run_program(msg, shm, c2z_w, reader):
    """Returns (error line or None, whether the CPU limit ended it, the output capture, the text
    given to final_answer() or None)."""
    cap = int(msg.get('max_output') or 10000)
    out = Capture(shm, cap)
    sys.stdout = sys.stderr = sys.__stdout__ = sys.__stderr__ = out
    sys.stdin = None
    search, extra = host_tools(msg, c2z_w, reader)

    def exit(code=None):
        raise SystemExit(code)

    ns = {
        '__name__': '__main__',
        '__builtins__': builtins,
        're': re,
        'json': json,
        'string': string,
        'math': math,
        'itertools': itertools,
        'collections': collections,
        'Counter': Counter,
        'defaultdict': defaultdict,
    }
    ns.update(search)
    ns.update({'exit': exit, 'quit': exit})
    ns.update(extra)
    # Per-program variables (e.g. the episode's question); the host checked the names and values.
    globals_ = msg.get('globals')
    if isinstance(globals_, dict):
        ns.update(globals_)
    final = [None]
    if msg.get('final_answer'):

        def final_answer(answer):
            """Ends the program; the episode's answer is str(answer) (the first call counts)."""
            text = answer if isinstance(answer, str) else str(answer)
            if final[0] is None:
                final[0] = text
            raise FinalAnswer()

        ns['final_answer'] = final_answer
    err, cpu_limit = None, False
    try:
        code = compile(msg['code'], '<program>', 'exec')
        exec(code, ns)
    except FinalAnswer:
        pass
    except SystemExit as e:
        err = 'SystemExit' if e.code is None else 'SystemExit: %s' % (e.code,)
    except CpuLimitExceeded as e:
        err, cpu_limit = 'TimeoutError: %s' % e, True
    except BaseException as e:
        err = error_line(e)
    if final[0] is not None:
        err = None  # the program gave its answer; what it did after catching FinalAnswer does not matter
    return err, cpu_limit, out, final[0]

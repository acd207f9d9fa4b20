"""slm-train Python sandbox worker. Standard library only; started by lib/sandbox/python.ts.

Shape: this process is a *zygote*. It never runs untrusted code itself. While idle it forks the child
for the next program; the child does the lock-down that does not depend on the program (descriptors,
environment, working directory, user) and waits on its pipe. When a program arrives the zygote hands
it over; the child applies the program's limits and the seccomp filter, runs the program in a fresh
namespace, reports, and exits. So nothing a program does (monkeypatching `json`, redefining
`search_pages`, leaving threads behind, leaking memory) can reach the next program, and a program
that dies or times out costs a fork, not a new worker.

Channels. The host talks to the zygote over stdin/stdout with frames: a 4-byte big-endian length,
then a MessagePack map (the tiny codec below covers nil, bool, int, float, str, bin, array, map; the
host uses msgpackr, plain maps). The child never sees those descriptors: it talks to the zygote over
two private pipes, and the zygote relays whole, checked frames to the host, so a child killed
half-way through a write cannot desynchronise the host channel. The program's printed output goes
into a shared memory block, sealed by the child before it reports and read by the zygote, so output
survives exceptions, `os._exit`, crashes and timeouts.

    host -> zygote: {t:'run', id, code, timeout_ms, cpu_s, memory_mb, max_output[, globals, final_answer]}
                    (passed to the child; globals: variables for the program; final_answer: define final_answer())
                    {t:'ret', id, seq, ok, value | error, etype}        (answer to a call)
                    {t:'exit'}
    zygote -> host: {t:'ready', ...capabilities}
                    {t:'call', seq, name, args}                          (relayed from the child)
                    {t:'done', id, stdout, truncated, error, timed_out[, final_answer]}

What a program is held to, in the child (each item says what it does NOT cover):
- wall-clock timeout: the zygote SIGKILLs the child at the deadline; the host kills the whole worker
  if the zygote itself does not answer shortly after (a program cannot evade this).
- RLIMIT_CPU (soft = cpu_s, raising a Python TimeoutError; hard = cpu_s + 1, SIGKILL), RLIMIT_AS
  (memory), RLIMIT_FSIZE (16 MiB per file), RLIMIT_NOFILE, RLIMIT_CORE = 0. With seccomp in force
  the program cannot raise them; without it, a program could lift its own CPU soft limit (the wall
  clock still applies).
- when the worker runs as root: the child drops to an unprivileged uid/gid (65534 by default) with
  no supplementary groups, so it has no capabilities, cannot raise its hard limits, cannot signal
  processes of other users (the host included) and RLIMIT_NPROC (128) binds it. Skipped when not
  root, or when the standard library would not be readable by that uid (the host's bubblewrap mode
  re-exposes it so that the drop always happens there).
- seccomp (installed through ctypes where available): no fork/vfork/non-thread clone, no exec, no
  socket(), kill/tkill/tgkill only towards the child's own pid, no ptrace or process_vm_*, no
  setrlimit/prlimit with a new limit, no mount/namespace/module/reboot/bpf/keyring/io_uring calls.
  Threads stay allowed (clone with CLONE_THREAD). x86_64 and aarch64 only.
- fresh namespace per program with re, json, string, math, itertools, collections, Counter,
  defaultdict and the three search primitives; stdin is /dev/null; the environment is scrubbed.
- the working directory (empty, private to this worker) is emptied after every program.
Not covered here (the host's wrapper covers them where the machine allows, see isolation.ts):
network and filesystem isolation, and containment of processes a program could create where seccomp
is unavailable (they stay in the child's process group, which is killed after every program, and are
bounded by RLIMIT_NPROC after the uid drop; a process that calls setsid() escapes that group kill).
A program can forge frames on its own pipe to the zygote: that can only misreport its own result.
"""

import os
import sys
import struct
import select
import signal
import time
import mmap
import errno
import resource
import builtins
import traceback

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

MAX_FRAME = 16 * 1024 * 1024
MAX_ERROR_CHARS = 2000
DEFAULT_CAP = 10000  # output cap (characters) the prepared child's shared block is sized for
HEADER = 16  # shared output block: u32 byte length, u32 truncated flag, 8 spare bytes


# ----------------------------------------------------------------------------------------------
# MessagePack (the subset we need)

def pack(obj):
    out = bytearray()
    _pack(obj, out, 0)
    return bytes(out)


def _pack(o, out, depth):
    if depth > 64:
        raise ValueError('value nested too deeply to send')
    if o is None:
        out += b'\xc0'
    elif o is True:
        out += b'\xc3'
    elif o is False:
        out += b'\xc2'
    elif isinstance(o, int):
        if 0 <= o < 0x80:
            out.append(o)
        elif -32 <= o < 0:
            out.append(o & 0xFF)
        elif 0 <= o <= 0xFF:
            out += b'\xcc' + struct.pack('>B', o)
        elif 0 <= o <= 0xFFFF:
            out += b'\xcd' + struct.pack('>H', o)
        elif 0 <= o <= 0xFFFFFFFF:
            out += b'\xce' + struct.pack('>I', o)
        elif 0 <= o <= 0xFFFFFFFFFFFFFFFF:
            out += b'\xcf' + struct.pack('>Q', o)
        elif -0x80 <= o < 0:
            out += b'\xd0' + struct.pack('>b', o)
        elif -0x8000 <= o < 0:
            out += b'\xd1' + struct.pack('>h', o)
        elif -0x80000000 <= o < 0:
            out += b'\xd2' + struct.pack('>i', o)
        elif -0x8000000000000000 <= o < 0:
            out += b'\xd3' + struct.pack('>q', o)
        else:
            out += b'\xcb' + struct.pack('>d', float(o))
    elif isinstance(o, float):
        out += b'\xcb' + struct.pack('>d', o)
    elif isinstance(o, str):
        b = o.encode('utf-8', 'replace')
        n = len(b)
        if n < 32:
            out.append(0xA0 | n)
        elif n <= 0xFF:
            out += b'\xd9' + struct.pack('>B', n)
        elif n <= 0xFFFF:
            out += b'\xda' + struct.pack('>H', n)
        else:
            out += b'\xdb' + struct.pack('>I', n)
        out += b
    elif isinstance(o, (bytes, bytearray, memoryview)):
        b = bytes(o)
        n = len(b)
        if n <= 0xFF:
            out += b'\xc4' + struct.pack('>B', n)
        elif n <= 0xFFFF:
            out += b'\xc5' + struct.pack('>H', n)
        else:
            out += b'\xc6' + struct.pack('>I', n)
        out += b
    elif isinstance(o, (list, tuple)):
        n = len(o)
        if n < 16:
            out.append(0x90 | n)
        elif n <= 0xFFFF:
            out += b'\xdc' + struct.pack('>H', n)
        else:
            out += b'\xdd' + struct.pack('>I', n)
        for v in o:
            _pack(v, out, depth + 1)
    elif isinstance(o, dict):
        n = len(o)
        if n < 16:
            out.append(0x80 | n)
        elif n <= 0xFFFF:
            out += b'\xde' + struct.pack('>H', n)
        else:
            out += b'\xdf' + struct.pack('>I', n)
        for k, v in o.items():
            _pack(k, out, depth + 1)
            _pack(v, out, depth + 1)
    else:
        raise TypeError('cannot send a value of type %s to the host' % type(o).__name__)


def unpack(data):
    value, pos = _unpack(memoryview(data), 0, 0)
    if pos != len(data):
        raise ValueError('trailing bytes after MessagePack value')
    return value


_FIXED = {0xCC: ('>B', 1), 0xCD: ('>H', 2), 0xCE: ('>I', 4), 0xCF: ('>Q', 8),
          0xD0: ('>b', 1), 0xD1: ('>h', 2), 0xD2: ('>i', 4), 0xD3: ('>q', 8),
          0xCA: ('>f', 4), 0xCB: ('>d', 8)}


def _unpack(b, i, depth):
    if depth > 64:
        raise ValueError('MessagePack value nested too deeply')
    c = b[i]
    i += 1
    if c < 0x80:
        return c, i
    if c >= 0xE0:
        return c - 0x100, i
    if 0xA0 <= c <= 0xBF:
        n = c & 0x1F
        return _str(b, i, n), i + n
    if 0x90 <= c <= 0x9F:
        return _array(b, i, c & 0x0F, depth)
    if 0x80 <= c <= 0x8F:
        return _map(b, i, c & 0x0F, depth)
    if c == 0xC0:
        return None, i
    if c == 0xC2:
        return False, i
    if c == 0xC3:
        return True, i
    if c in _FIXED:
        fmt, n = _FIXED[c]
        return struct.unpack_from(fmt, b, i)[0], i + n
    if c in (0xD9, 0xDA, 0xDB, 0xC4, 0xC5, 0xC6):
        w = {0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC4: 1, 0xC5: 2, 0xC6: 4}[c]
        n = int.from_bytes(b[i:i + w], 'big')
        i += w
        if i + n > len(b):
            raise ValueError('truncated MessagePack string')
        if c >= 0xD9:
            return _str(b, i, n), i + n
        return bytes(b[i:i + n]), i + n
    if c in (0xDC, 0xDD):
        w = 2 if c == 0xDC else 4
        return _array(b, i + w, int.from_bytes(b[i:i + w], 'big'), depth)
    if c in (0xDE, 0xDF):
        w = 2 if c == 0xDE else 4
        return _map(b, i + w, int.from_bytes(b[i:i + w], 'big'), depth)
    if c in (0xD4, 0xD5, 0xD6, 0xD7, 0xD8, 0xC7, 0xC8, 0xC9):
        if c >= 0xD4:
            n = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}[c]
        else:
            w = {0xC7: 1, 0xC8: 2, 0xC9: 4}[c]
            n = int.from_bytes(b[i:i + w], 'big')
            i += w
        ext_type = struct.unpack_from('>b', b, i)[0]
        if c == 0xD4 and ext_type == 0:  # msgpackr's `undefined`
            return None, i + 1 + n
        raise ValueError('unsupported MessagePack extension type %d' % ext_type)
    raise ValueError('invalid MessagePack byte 0x%02x' % c)


def _str(b, i, n):
    if i + n > len(b):
        raise ValueError('truncated MessagePack string')
    return bytes(b[i:i + n]).decode('utf-8', 'surrogatepass')


def _array(b, i, n, depth):
    out = []
    for _ in range(n):
        v, i = _unpack(b, i, depth + 1)
        out.append(v)
    return out, i


def _map(b, i, n, depth):
    out = {}
    for _ in range(n):
        k, i = _unpack(b, i, depth + 1)
        v, i = _unpack(b, i, depth + 1)
        if isinstance(k, list):
            k = tuple(k)
        out[k] = v
    return out, i


# ----------------------------------------------------------------------------------------------
# Frames

def frame(payload):
    return struct.pack('>I', len(payload)) + payload


def write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class FrameReader:
    """Buffers bytes from a descriptor and splits them into length-prefixed frames."""

    def __init__(self, fd):
        self.fd = fd
        self.buf = bytearray()
        self.eof = False

    def fill(self):
        """One read (call when select says readable, or to block for more). False at end of file."""
        try:
            data = os.read(self.fd, 1 << 20)
        except BlockingIOError:
            return True
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def next(self):
        """The next complete frame's payload, or None. Raises ValueError on an oversized frame."""
        if len(self.buf) < 4:
            return None
        n = struct.unpack_from('>I', self.buf, 0)[0]
        if n > MAX_FRAME:
            raise ValueError('frame of %d bytes exceeds the %d-byte limit' % (n, MAX_FRAME))
        if len(self.buf) < 4 + n:
            return None
        payload = bytes(self.buf[4:4 + n])
        del self.buf[:4 + n]
        return payload

    def read_blocking(self):
        while True:
            p = self.next()
            if p is not None:
                return p
            if not self.fill():
                return None


# ----------------------------------------------------------------------------------------------
# seccomp (classic BPF assembled here; installed in the child through ctypes)

ARCHES = {
    # machine: (AUDIT_ARCH, x32 bit check, syscall numbers)
    'x86_64': (0xC000003E, True, dict(
        socket=41, fork=57, vfork=58, clone=56, clone3=435, execve=59, execveat=322, kill=62,
        tkill=200, tgkill=234, ptrace=101, process_vm_readv=310, process_vm_writev=311,
        pidfd_send_signal=424, pidfd_open=434, pidfd_getfd=438, setrlimit=160, prlimit64=302,
        mount=165, umount2=166, unshare=272, setns=308, chroot=161, pivot_root=155, reboot=169,
        kexec_load=246, init_module=175, finit_module=313, delete_module=176, bpf=321,
        perf_event_open=298, userfaultfd=323, keyctl=250, add_key=248, request_key=249,
        io_uring_setup=425, io_uring_enter=426, io_uring_register=427, swapon=167, swapoff=168)),
    'aarch64': (0xC00000B7, False, dict(
        socket=198, clone=220, clone3=435, execve=221, execveat=281, kill=129, tkill=130,
        tgkill=131, ptrace=117, process_vm_readv=270, process_vm_writev=271,
        pidfd_send_signal=424, pidfd_open=434, pidfd_getfd=438, setrlimit=164, prlimit64=261,
        mount=40, umount2=39, unshare=97, setns=268, chroot=51, pivot_root=41, reboot=142,
        kexec_load=104, init_module=105, finit_module=273, delete_module=106, bpf=280,
        perf_event_open=241, userfaultfd=282, keyctl=219, add_key=217, request_key=218,
        io_uring_setup=425, io_uring_enter=426, io_uring_register=427, swapon=224, swapoff=225)),
}
SPECIAL = ('clone', 'clone3', 'kill', 'tkill', 'tgkill', 'prlimit64')
CLONE_THREAD = 0x00010000
RET_ALLOW, RET_EPERM, RET_ENOSYS = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
LD_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06


def seccomp_filter(own_pid):
    """The filter program (bytes of struct sock_filter[]) for this machine, or None if unsupported."""
    t = seccomp_template()
    if t is None:
        return None
    code, pid_offset = t
    buf = bytearray(code)
    struct.pack_into('=I', buf, pid_offset, own_pid & 0xFFFFFFFF)
    return bytes(buf)


_template = None


def seccomp_template():
    """(filter with pid 0, byte offset of the pid constant); built once, in the zygote."""
    global _template
    if _template is not None:
        return _template or None
    arch = ARCHES.get(os.uname().machine)
    if arch is None:
        _template = False
        return None
    audit_arch, x32, nr = arch
    prog = []  # (code, jt_label, jf_label, k); labels are names or None (= next instruction)

    def ins(code, k, jt=None, jf=None):
        prog.append((code, jt, jf, k))

    ins(LD_ABS, 4)                                   # seccomp_data.arch
    ins(JEQ, audit_arch, None, 'deny')
    ins(LD_ABS, 0)                                   # seccomp_data.nr
    if x32:
        ins(JGE, 0x40000000, 'deny', None)
    for name, n in nr.items():
        if name not in SPECIAL:
            ins(JEQ, n, 'deny', None)
    ins(JEQ, nr['clone3'], 'enosys', None)           # glibc then falls back to clone()
    ins(JEQ, nr['clone'], 'clone', None)
    for name in ('kill', 'tkill', 'tgkill'):
        ins(JEQ, nr[name], 'own_pid', None)
    ins(JEQ, nr['prlimit64'], 'prlimit', None)
    ins(RET, RET_ALLOW)
    labels = {}
    labels['clone'] = len(prog)
    ins(LD_ABS, 16)                                  # args[0], low 32 bits: clone flags
    ins(JSET, CLONE_THREAD, 'allow', 'deny')
    labels['own_pid'] = len(prog)
    ins(LD_ABS, 16)                                  # args[0]: target pid (tgid for tgkill)
    pid_index = len(prog)
    ins(JEQ, 0, 'allow', 'deny')                     # k = the child's pid, patched in per child
    labels['prlimit'] = len(prog)
    ins(LD_ABS, 32)                                  # args[2] (new limit pointer) must be NULL
    ins(JEQ, 0, None, 'deny')
    ins(LD_ABS, 36)
    ins(JEQ, 0, 'allow', 'deny')
    labels['allow'] = len(prog)
    ins(RET, RET_ALLOW)
    labels['deny'] = len(prog)
    ins(RET, RET_EPERM)
    labels['enosys'] = len(prog)
    ins(RET, RET_ENOSYS)

    out = bytearray()
    for pc, (code, jt, jf, k) in enumerate(prog):
        def rel(label):
            if label is None:
                return 0
            d = labels[label] - pc - 1
            assert 0 <= d < 256, 'seccomp jump out of range'
            return d
        out += struct.pack('=HBBI', code, rel(jt), rel(jf), k & 0xFFFFFFFF)
    _template = (bytes(out), pid_index * 8 + 4)
    return _template


_libc = None


def load_libc():
    """ctypes' view of libc, or None where ctypes is missing (then no seccomp, no pdeathsig)."""
    global _libc
    if _libc is None:
        try:
            import ctypes
            _libc = (ctypes, ctypes.CDLL(None, use_errno=True))
        except Exception:
            _libc = False
    return _libc or None


def prctl(option, arg2, arg3=0):
    lib = load_libc()
    if lib is None:
        raise OSError(errno.ENOSYS, 'ctypes is unavailable')
    ctypes, libc = lib
    r = libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(arg3),
                   ctypes.c_ulong(0), ctypes.c_ulong(0))
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, 'prctl(%d): %s' % (option, os.strerror(e)))


_fprog_class = None


def prepare_seccomp():
    """Builds what install_seccomp() needs once, in the zygote, so each child only patches a pid."""
    global _fprog_class
    lib = load_libc()
    if lib is None or seccomp_template() is None:
        return False
    ctypes, _ = lib
    if _fprog_class is None:
        class SockFprog(ctypes.Structure):
            _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_void_p)]
        _fprog_class = SockFprog
    return True


def install_seccomp():
    if not prepare_seccomp():
        raise OSError(errno.ENOSYS, 'seccomp needs ctypes on x86_64 or aarch64')
    ctypes, _ = load_libc()
    code = seccomp_filter(os.getpid())
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = _fprog_class(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    prctl(38, 1)  # PR_SET_NO_NEW_PRIVS
    prctl(22, 2, ctypes.addressof(fprog))  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


# ----------------------------------------------------------------------------------------------
# The child: lock down, run one program, exit

class CpuLimitExceeded(TimeoutError):
    pass


class FinalAnswer(BaseException):
    """Raised by final_answer() to end the program (BaseException: `except Exception` does not catch it)."""


class Capture:
    """sys.stdout/sys.stderr for the program: UTF-8 into the shared block, capped in characters."""

    def __init__(self, shm, cap):
        import _thread
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
                take = s[:self.cap - self.chars]
                self.truncated = True
            b = take.encode('utf-8', 'replace')
            self.shm[HEADER + self.pos:HEADER + self.pos + len(b)] = b
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


def child_main(cfg, shm, c2z_w, z2c_r):
    """Runs in the forked child (prepared ahead of time, then handed one program). Never returns."""
    status = 70
    try:
        reader = FrameReader(z2c_r)
        setup_error = None
        try:
            prepare_child(cfg, c2z_w, z2c_r)
        except BaseException as e:
            setup_error = e
        warm_up(shm)
        payload = reader.read_blocking()  # the program; end of file: the zygote does not need us
        if payload is None:
            os._exit(0)
        msg = unpack(payload)
        if setup_error is None:
            try:
                lock_down(cfg, msg)
            except BaseException as e:
                setup_error = e
        if setup_error is not None:  # fail closed: never run a program half-contained
            err = 'SandboxError: could not contain the program (%s); nothing was run' % setup_error
            write_all(c2z_w, frame(pack({'t': 'done', 'error': err, 'setup_failed': True})))
        else:
            err, cpu, out, final = run_program(msg, shm, c2z_w, reader)
            out.seal()
            done = {'t': 'done', 'error': err, 'cpu_limit': cpu}
            if final is not None:
                done['final_answer'] = final[:int(msg.get('max_output') or 10000)]
            write_all(c2z_w, frame(pack(done)))
            status = 0
    finally:
        os._exit(status)


def warm_up(shm):
    """Touch, while idle, the memory a run will write to: after fork() each first write to a page
    copies it, and doing that here instead of during the program saves ~0.5 ms per program."""
    try:
        unpack(pack({'t': 'run', 'id': 1, 'code': 'print(1)', 'timeout_ms': 1, 'cpu_s': 1, 'memory_mb': 1,
                     'max_output': 1}))
        Capture(shm, 10).write('')
        exec(compile('def f():\n    return 1\nf()', '<warm-up>', 'exec'), {'__builtins__': builtins})
        resource.getrusage(resource.RUSAGE_SELF)
        seccomp_filter(os.getpid())
        try:
            raise NameError('warm-up')
        except NameError as e:
            error_line(e)
    except Exception:
        pass


def prepare_child(cfg, c2z_w, z2c_r):
    """Everything that does not depend on the program: done while the worker is idle."""
    os.setpgid(0, 0)  # own process group, killed by the zygote after the program
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    # Close everything inherited except our two pipes (the host channel in particular).
    lo, hi = sorted((c2z_w, z2c_r))
    os.closerange(3, lo)
    os.closerange(lo + 1, hi)
    os.closerange(hi + 1, 1 << 16)

    os.environ.clear()
    os.environ.update({'PATH': '/usr/bin:/bin', 'LANG': 'C.UTF-8', 'HOME': cfg['workdir']})
    os.chdir(cfg['workdir'])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with EFBIG instead

    if cfg['drop_uid']:
        resource.setrlimit(resource.RLIMIT_NPROC, (128, 128))
        os.setgroups([])
        os.setresgid(cfg['gid'], cfg['gid'], cfg['gid'])
        os.setresuid(cfg['uid'], cfg['uid'], cfg['uid'])
        if os.geteuid() == 0 or os.getegid() == 0:
            raise OSError('still root after setresuid')
    if cfg['pdeathsig']:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (after the uid change, which clears it)
        if os.getppid() != cfg['zygote_pid']:
            os._exit(71)  # the zygote died before we could notice


def lock_down(cfg, msg):
    """The program's own limits, then seccomp (which forbids changing limits afterwards)."""
    mem = int(msg.get('memory_mb') or 512) * 1024 * 1024
    cpu = max(1, int(msg.get('cpu_s') or 10))
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu_base = int(used.ru_utime + used.ru_stime)  # the idle wait costs next to nothing
    setr = resource.setrlimit
    setr(resource.RLIMIT_AS, (mem, mem))
    setr(resource.RLIMIT_CPU, (cpu_base + cpu, cpu_base + cpu + 1))
    setr(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
    setr(resource.RLIMIT_NOFILE, (128, 128))
    setr(resource.RLIMIT_CORE, (0, 0))
    if cfg['seccomp']:
        install_seccomp()

    def on_cpu_limit(signum, frame_):
        raise CpuLimitExceeded('CPU time limit of %d s exceeded' % cpu)
    signal.signal(signal.SIGXCPU, on_cpu_limit)


def run_program(msg, shm, c2z_w, reader):
    """Returns (error line or None, whether the CPU limit ended it, the output capture, the text
    given to final_answer() or None)."""
    import _thread
    cap = int(msg.get('max_output') or 10000)
    out = Capture(shm, cap)
    sys.stdout = sys.stderr = sys.__stdout__ = sys.__stderr__ = out
    sys.stdin = None

    lock = _thread.allocate_lock()
    counter = [0]

    def call(name, arg, param):
        if not isinstance(arg, str):
            raise TypeError('%s(%s) expects a str, got %s' % (name, param, type(arg).__name__))
        return call_args(name, [arg])

    def call_args(name, args):
        with lock:
            counter[0] += 1
            seq = counter[0]
            write_all(c2z_w, frame(pack({'t': 'call', 'seq': seq, 'name': name, 'args': args})))
            while True:
                payload = reader.read_blocking()
                if payload is None:
                    raise RuntimeError('the connection to the search tools was closed')
                reply = unpack(payload)
                if reply.get('seq') == seq:
                    break
        if reply.get('ok'):
            return reply.get('value')
        etype = {'TypeError': TypeError, 'KeyError': KeyError, 'TimeoutError': TimeoutError,
                 'RuntimeError': RuntimeError}.get(reply.get('etype'), ValueError)
        raise etype(reply.get('error') or 'the search tool failed')

    def search_pages(query):
        return call('search_pages', query, 'query')

    def view_sections(page_id):
        return call('view_sections', page_id, 'page_id')

    def read_section(section_id):
        return call('read_section', section_id, 'section_id')

    def exit(code=None):
        raise SystemExit(code)

    ns = {
        '__name__': '__main__', '__builtins__': builtins,
        're': re, 'json': json, 'string': string, 'math': math, 'itertools': itertools,
        'collections': collections, 'Counter': Counter, 'defaultdict': defaultdict,
        'search_pages': search_pages, 'view_sections': view_sections, 'read_section': read_section,
        'exit': exit, 'quit': exit,
    }
    # Extra tools (sandbox.tools_module): the host runs them; any JSON arguments, positional.
    for tool_name in msg.get('extra_tools') or ():
        if isinstance(tool_name, str) and tool_name.isidentifier():
            def extra_tool(*args, _name=tool_name):
                return call_args(_name, list(args))
            extra_tool.__name__ = tool_name
            ns[tool_name] = extra_tool
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


# ----------------------------------------------------------------------------------------------
# The zygote

def signal_name(n):
    try:
        return signal.Signals(n).name
    except ValueError:
        return 'signal %d' % n


class Zygote:
    def __init__(self, cfg):
        self.cfg = cfg
        # Private copies of the host channel; 0/1 become /dev/null so stray writes go nowhere.
        self.host_in = os.dup(0)
        self.host_out = os.dup(1)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.close(devnull)
        self.reader = FrameReader(self.host_in)
        self.pidfd_ok = hasattr(os, 'pidfd_open')
        self.prepared = None

    def send(self, obj):
        write_all(self.host_out, frame(pack(obj)))

    def serve(self):
        self.prepare(DEFAULT_CAP)
        try:
            self._serve()
        finally:
            self.discard_prepared()

    def _serve(self):
        while True:
            payload = self.reader.read_blocking()
            if payload is None:
                return  # host went away
            msg = unpack(payload)
            t = msg.get('t')
            if t == 'run':
                self.run(msg)
            elif t == 'exit':
                return
            # anything else here is a late answer to a finished program: drop it

    def prepare(self, cap):
        """Forks the child for the next program; it locks itself down as far as it can and waits."""
        shm = mmap.mmap(-1, HEADER + 4 * cap + 8)
        c2z_r, c2z_w = os.pipe()
        z2c_r, z2c_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(c2z_r)
                os.close(z2c_w)
                child_main(self.cfg, shm, c2z_w, z2c_r)
            finally:
                os._exit(70)
        os.close(c2z_w)
        os.close(z2c_r)
        self.prepared = (pid, shm, c2z_r, z2c_w, cap)

    def discard_prepared(self):
        if self.prepared is not None:
            pid, shm, c2z_r, z2c_w, _ = self.prepared
            self.prepared = None
            kill_group(pid)
            self.wait(pid)
            os.close(c2z_r)
            os.close(z2c_w)
            shm.close()

    def run(self, msg):
        """Hands one program to the prepared child and sends its result; then cleans up after it."""
        cap = int(msg.get('max_output') or 10000)
        if self.prepared is not None:
            pid = self.prepared[0]
            stale = self.prepared[4] < cap
            try:
                stale = stale or os.waitpid(pid, os.WNOHANG)[0] == pid
            except ChildProcessError:
                stale = True
            if stale:
                self.discard_prepared()
        if self.prepared is None:
            self.prepare(max(cap, DEFAULT_CAP))
        pid, shm, c2z_r, z2c_w, _ = self.prepared
        self.prepared = None
        timeout = max(0.001, float(msg.get('timeout_ms') or 10000) / 1000.0)
        deadline = time.monotonic() + timeout
        result = {'t': 'done', 'id': msg.get('id'), 'timed_out': False, 'error': None}
        status = None
        try:
            try:
                write_all(z2c_w, frame(pack(msg)))  # a pipe's 64 KiB buffer takes most programs at once
            except BrokenPipeError:
                pass  # the child died meanwhile; supervise() reports it
            status = self.supervise(pid, msg, c2z_r, z2c_w, deadline, result)
            # The child sealed its output before sending `done` (or is dead): the block is final.
            used, trunc = struct.unpack_from('<II', shm, 0)
            used = min(used, len(shm) - HEADER)
            result['stdout'] = shm[HEADER:HEADER + used].decode('utf-8', 'replace')
            result['truncated'] = bool(trunc)
            self.send(result)  # report first; the child's exit and the cleanup are off the critical path
        finally:
            kill_group(pid)
            if status is None:
                self.wait(pid)
            for fd in (c2z_r, z2c_w):
                try:
                    os.close(fd)
                except OSError:
                    pass
            shm.close()
        self.after_program()
        self.prepare(DEFAULT_CAP)

    def supervise(self, pid, msg, c2z_r, z2c_w, deadline, result):
        """Relays calls until the child reports `done`, dies, or runs out of time; fills `result`.
        Returns the child's wait status when it has been collected, else None."""
        os.set_blocking(c2z_r, False)
        os.set_blocking(z2c_w, False)
        child = FrameReader(c2z_r)
        pidfd = os.pidfd_open(pid) if self.pidfd_ok else None
        pending = bytearray()
        done = None
        exited = False
        violation = None
        early = None
        try:
            while done is None and not exited and violation is None:
                now = time.monotonic()
                if now >= deadline:
                    result['timed_out'] = True
                    break
                rl = [self.host_in]
                if not child.eof:
                    rl.append(c2z_r)
                if pidfd is not None:
                    rl.append(pidfd)
                wl = [z2c_w] if pending else []
                wait = deadline - now if pidfd is not None else min(deadline - now, 0.02)
                r, w, _ = select.select(rl, wl, [], wait)
                if c2z_r in r:
                    child.fill()
                    try:
                        done = self.relay(child)
                    except Exception as e:
                        violation = 'SandboxError: the program wrote garbage to the tool channel (%s)' % e
                if self.host_in in r:
                    self.from_host(pid, msg, pending)
                if z2c_w in w and pending:
                    try:
                        n = os.write(z2c_w, pending)
                        del pending[:n]
                    except BlockingIOError:
                        pass
                    except BrokenPipeError:
                        pending.clear()
                if pidfd is not None:
                    exited = pidfd in r
                else:  # kernels before 5.3: poll
                    early = os.wait4(pid, os.WNOHANG)
                    exited = early[0] == pid
        finally:
            if pidfd is not None:
                os.close(pidfd)

        status = ru = None
        if done is None:
            # No report from the child: it is dead, timed out, or misbehaved. Collect its status.
            kill_group(pid)
            if early is not None and early[0] == pid:
                status, ru = early[1], early[2]
            else:
                status, ru = self.wait(pid)
            if not result['timed_out'] and violation is None:
                try:  # its last frame may have arrived together with its exit
                    child.fill()
                    done = self.relay(child)
                except Exception:
                    pass
        cpu_s = max(1, int(msg.get('cpu_s') or 10))
        if result['timed_out']:
            result['error'] = 'TimeoutError: the program exceeded the time limit of %g s' % (
                float(msg.get('timeout_ms') or 10000) / 1000.0)
        elif violation is not None:
            result['error'] = violation
        elif done is not None:
            e = done.get('error')
            result['error'] = e[:MAX_ERROR_CHARS + 3] if isinstance(e, str) else None
            if done.get('cpu_limit'):
                result['timed_out'] = True
            fa = done.get('final_answer')
            # Capped again here: the child runs the model's code and could write its own frame.
            if isinstance(fa, str):
                result['final_answer'] = fa[:int(msg.get('max_output') or 10000)]
        elif status is not None and os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            cpu_used = ru.ru_utime + ru.ru_stime if ru is not None else 0.0
            if sig in (signal.SIGKILL, signal.SIGXCPU) and cpu_used >= cpu_s - 0.05:
                result['error'] = 'TimeoutError: CPU time limit of %d s exceeded' % cpu_s
                result['timed_out'] = True
            else:
                hint = ' (often a C stack overflow from deep recursion)' if sig == signal.SIGSEGV else ''
                result['error'] = "SandboxError: the program's process was killed by %s%s" % (
                    signal_name(sig), hint)
        else:
            code = os.WEXITSTATUS(status) if status is not None else -1
            result['error'] = ('SystemExit: %d (the program ended its process itself, '
                               'e.g. with os._exit())' % code)
        return status if done is None else None

    def relay(self, child):
        """Forwards the child's complete call frames to the host; returns its `done` frame if seen."""
        while True:
            p = child.next()
            if p is None:
                return None
            m = unpack(p)
            if not isinstance(m, dict):
                raise ValueError('not a map')
            if m.get('t') == 'call':
                self.send(m)
            elif m.get('t') == 'done':
                return m
            else:
                raise ValueError('unknown frame type')

    def from_host(self, pid, msg, pending):
        if not self.reader.fill():
            kill_group(pid)
            raise SystemExit(0)  # the host went away
        while True:
            p = self.reader.next()
            if p is None:
                return
            m = unpack(p)
            if m.get('t') == 'ret' and m.get('id') == msg.get('id'):
                pending += frame(p)
            elif m.get('t') == 'exit':
                kill_group(pid)
                raise SystemExit(0)
            # else: a late answer for an earlier program

    def wait(self, pid):
        try:
            _, status, ru = os.wait4(pid, 0)
            return status, ru
        except ChildProcessError:
            return None, None

    def after_program(self):
        # Reap anything reparented to us (we are PID 1 in a PID namespace) and empty the work dir.
        while True:
            try:
                p, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if p == 0:
                break
        empty_dir(self.cfg['workdir'])


def kill_group(pid):
    """SIGKILL the child and whatever is left in its process group."""
    for target in (-pid, pid):
        try:
            os.kill(target, signal.SIGKILL)
        except OSError:
            pass


def empty_dir(path):
    with os.scandir(path) as it:
        entries = list(it)
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            import shutil
            shutil.rmtree(e.path)
        else:
            os.unlink(e.path)


def stdlib_readable_by_others():
    """Whether an unprivileged uid could import the rest of the standard library."""
    import stat
    paths = [os.path.dirname(os.__file__)]
    dyn = [p for p in sys.path if p.endswith('lib-dynload')]
    paths += dyn
    for p in paths:
        p = os.path.realpath(p)
        parts = p.split('/')
        for i in range(2, len(parts) + 1):
            d = '/'.join(parts[:i]) or '/'
            try:
                mode = os.stat(d).st_mode
            except OSError:
                return False
            if not mode & stat.S_IXOTH:
                return False
        if not os.stat(p).st_mode & stat.S_IROTH:
            return False
    return True


def needed_paths():
    """What this interpreter reads to run the runner and the programs (the host's bubblewrap mode
    binds exactly these, read-only, and nothing else of the machine): the standard library
    directories (lib-dynload included), the installed-packages directories inside them (hidden
    there: programs run with -S and never import from them), and every file mapped into this
    process now that the runner's modules and ctypes are loaded (the executable, libpython, shared
    libraries). Real paths throughout."""
    import sysconfig
    dirs, site, files = set(), set(), set()
    for key in ('stdlib', 'platstdlib'):
        p = sysconfig.get_path(key)
        if p and os.path.isdir(p):
            dirs.add(os.path.realpath(p))
    dirs.add(os.path.dirname(os.path.realpath(os.__file__)))
    for p in sys.path:
        if p.endswith('lib-dynload') and os.path.isdir(p):
            dirs.add(os.path.realpath(p))
    for key in ('purelib', 'platlib'):
        p = sysconfig.get_path(key)
        if p and os.path.isdir(p):
            site.add(os.path.realpath(p))
    files.add(os.path.realpath(sys.executable))
    try:
        with open('/proc/self/maps') as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith('/') and not parts[5].rstrip().endswith('(deleted)'):
                    p = os.path.realpath(parts[5].rstrip('\n'))
                    if os.path.isfile(p):
                        files.add(p)
    except OSError:
        pass
    return {'dirs': sorted(dirs), 'site': sorted(site), 'files': sorted(files)}


def capabilities(want_uid):
    """What this machine lets the child do; each check forks a throw-away child."""
    caps = {'executable': sys.executable, 'base_prefix': sys.base_prefix,
            'version': '%d.%d.%d' % sys.version_info[:3], 'machine': os.uname().machine}
    caps['root'] = os.geteuid() == 0
    caps['stdlib_readable'] = stdlib_readable_by_others()
    caps['drop_uid'] = caps['root'] and caps['stdlib_readable'] and want_uid is not None
    caps['ctypes'] = load_libc() is not None
    caps['seccomp'] = False
    caps['seccomp_error'] = None
    if caps['ctypes'] and not prepare_seccomp():
        caps['seccomp_error'] = 'no seccomp filter for machine %s' % caps['machine']
    elif caps['ctypes']:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(r)
                install_seccomp()
                checks = []
                try:
                    os.fork()
                    checks.append('fork allowed')
                except PermissionError:
                    pass
                import _socket
                try:
                    _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
                    checks.append('socket allowed')
                except PermissionError:
                    pass
                try:
                    os.kill(os.getppid(), 0)
                    checks.append('kill allowed')
                except PermissionError:
                    pass
                os.write(w, ('; '.join(checks) or 'ok').encode())
                code = 0
            except BaseException as e:
                os.write(w, ('%s: %s' % (type(e).__name__, e)).encode()[:500])
            finally:
                os._exit(code)
        os.close(w)
        text = b''
        while True:
            b = os.read(r, 4096)
            if not b:
                break
            text += b
        os.close(r)
        os.waitpid(pid, 0)
        text = text.decode('utf-8', 'replace')
        caps['seccomp'] = text == 'ok'
        caps['seccomp_error'] = None if text == 'ok' else text
    else:
        caps['seccomp_error'] = 'ctypes is unavailable'
    return caps


def main(argv):
    if len(argv) >= 2 and argv[1] == '--probe':
        caps = capabilities(65534)
        caps['paths'] = needed_paths()
        sys.stdout.write(json.dumps(caps) + '\n')
        return 0
    if len(argv) < 3 or argv[1] != '--config':
        sys.stderr.write('usage: sandbox_runner.py --config JSON [--tag TAG] | --probe\n')
        return 2
    opts = json.loads(argv[2])
    caps = capabilities(opts.get('uid', 65534))
    if opts.get('require_seccomp') and not caps['seccomp']:
        sys.stderr.write('seccomp was required but cannot be installed: %s\n' % caps['seccomp_error'])
        return 3
    workdir = opts['workdir']
    os.makedirs(workdir, exist_ok=True)
    uid = int(opts.get('uid', 65534))
    gid = int(opts.get('gid', uid))
    cfg = {
        'workdir': workdir, 'uid': uid, 'gid': gid, 'drop_uid': caps['drop_uid'],
        'seccomp': caps['seccomp'], 'pdeathsig': caps['ctypes'], 'zygote_pid': os.getpid(),
    }
    if cfg['drop_uid']:
        os.chown(workdir, uid, gid)
        os.chmod(workdir, 0o700)
    os.chdir(workdir)
    empty_dir(workdir)
    if caps['ctypes'] and os.getpid() != 1:
        try:
            prctl(1, signal.SIGKILL)  # die with the host (bubblewrap does this with --die-with-parent)
        except OSError:
            pass
    import gc
    gc.collect()
    gc.freeze()  # forked children then leave the zygote's objects alone: far fewer copy-on-write faults
    z = Zygote(cfg)
    ready = dict(caps)
    ready.update({'t': 'ready', 'pid': os.getpid(), 'drop_uid': cfg['drop_uid'], 'uid': uid if cfg['drop_uid'] else os.geteuid()})
    z.send(ready)
    try:
        z.serve()
    except (BrokenPipeError, SystemExit):
        pass
    try:
        empty_dir(workdir)
    except OSError:
        pass
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))

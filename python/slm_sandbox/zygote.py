"""The zygote: the worker process the host talks to. It never runs a program itself; it keeps one
child prepared, hands it each program, relays its tool calls, enforces the wall-clock deadline,
reports the result, and cleans up after it.
"""

import os
import select
import signal
import struct
import time
import mmap

from .protocol import DEFAULT_CAP, HEADER, MAX_ERROR_CHARS, FrameReader, frame, pack, unpack, write_all
from .child import child_main


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
        try:
            self._serve()
        finally:
            self.discard_prepared()

    def _serve(self):
        while True:
            if self.prepared is None:
                # Forked from this frame, which holds nothing of any program: a program walking
                # sys._getframe() up (or the heap) finds no earlier program's code, globals or output.
                self.prepare(DEFAULT_CAP)
            if not self.handle_next():
                return

    def handle_next(self):
        """Reads and handles one message from the host; False when the zygote should end."""
        payload = self.reader.read_blocking()
        if payload is None:
            return False  # host went away
        msg = unpack(payload)
        t = msg.get('t')
        if t == 'run':
            self.run(msg)
        elif t == 'exit':
            return False
        # anything else here is a late answer to a finished program: drop it
        return True

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
        # First the receipt (when the host asks for one): a worker that dies before the host has it
        # never ran the program, and the host runs it on another worker instead of reporting a crash
        # the program did not meet.
        if msg.get('ack'):
            self.send({'t': 'started', 'id': msg.get('id')})
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
            result['stdout'] = shm[HEADER : HEADER + used].decode('utf-8', 'replace')
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
            result['error'] = 'TimeoutError: the program exceeded the time limit of %g s' % (float(msg.get('timeout_ms') or 10000) / 1000.0)
        elif violation is not None:
            result['error'] = violation
        elif done is not None:
            e = done.get('error')
            result['error'] = e[: MAX_ERROR_CHARS + 3] if isinstance(e, str) else None
            if done.get('cpu_limit'):
                result['timed_out'] = True
            fa = done.get('final_answer')
            # Capped again here: the child runs the model's code and could write its own frame.
            if isinstance(fa, str):
                result['final_answer'] = fa[: int(msg.get('max_output') or 10000)]
        elif status is not None and os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            cpu_used = ru.ru_utime + ru.ru_stime if ru is not None else 0.0
            if sig in (signal.SIGKILL, signal.SIGXCPU) and cpu_used >= cpu_s - 0.05:
                result['error'] = 'TimeoutError: CPU time limit of %d s exceeded' % cpu_s
                result['timed_out'] = True
            else:
                hint = ' (often a C stack overflow from deep recursion)' if sig == signal.SIGSEGV else ''
                result['error'] = "SandboxError: the program's process was killed by %s%s" % (signal_name(sig), hint)
        else:
            code = os.WEXITSTATUS(status) if status is not None else -1
            result['error'] = 'SystemExit: %d (the program ended its process itself, ' 'e.g. with os._exit())' % code
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

"""The child: forked by the zygote ahead of time, it locks itself down as far as it can without the
program (descriptors, environment, working directory, user), waits for the program, applies the
program's limits and the seccomp filter, runs it, reports to the zygote, and exits.
"""

import os
import signal
import resource
import builtins

from .protocol import FrameReader, frame, pack, unpack, write_all
from .seccomp import install_seccomp, prctl, seccomp_filter
from .program import Capture, CpuLimitExceeded, error_line, run_program


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
                done['final_answer'] = final[: int(msg.get('max_output') or 10000)]
            write_all(c2z_w, frame(pack(done)))
            status = 0
    finally:
        os._exit(status)


def warm_up(shm):
    """Touch, while idle, the memory a run will write to: after fork() each first write to a page
    copies it, and doing that here instead of during the program saves ~0.5 ms per program."""
    try:
        unpack(pack({'t': 'run', 'id': 1, 'code': 'print(1)', 'timeout_ms': 1, 'cpu_s': 1, 'memory_mb': 1, 'max_output': 1}))
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

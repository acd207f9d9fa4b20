"""slm-train Python sandbox worker. Standard library only; started by lib/sandbox/python-worker.ts.

Shape: this process is a *zygote*. It never runs untrusted code itself. While idle it forks the child
for the next program; the child does the lock-down that does not depend on the program (descriptors,
environment, working directory, user) and waits on its pipe. When a program arrives the zygote hands
it over; the child applies the program's limits and the seccomp filter, runs the program in a fresh
namespace, reports, and exits. So nothing a program does (monkeypatching `json`, redefining
`search_pages`, leaving threads behind, leaking memory) can reach the next program, and a program
that dies or times out costs a fork, not a new worker.

Channels. The host talks to the zygote over stdin/stdout with frames: a 4-byte big-endian length,
then a MessagePack map (slm_sandbox/protocol.py: nil, bool, int, float, str, bin, array, map; the
host uses msgpackr, plain maps). The child never sees those descriptors: it talks to the zygote over
two private pipes, and the zygote relays whole, checked frames to the host, so a child killed
half-way through a write cannot desynchronise the host channel. The program's printed output goes
into a shared memory block, sealed by the child before it reports and read by the zygote, so output
survives exceptions, `os._exit`, crashes and timeouts.

    host -> zygote: {t:'run', id, code, timeout_ms, cpu_s, memory_mb, max_output[, globals, final_answer, ack]}
                    (passed to the child; globals: variables for the program; final_answer: define final_answer())
                    {t:'ret', id, seq, ok, value | error, etype}        (answer to a call)
                    {t:'exit'}
    zygote -> host: {t:'ready', ...capabilities}
                    {t:'started', id}                                    (with ack: the run frame arrived; sent before the child gets it)
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
  setrlimit/prlimit with a new limit, no mount/namespace/module/reboot/bpf/keyring/io_uring calls,
  no memfd_create/memfd_secret/shmget (memory held by a file descriptor or a SysV segment is outside
  RLIMIT_AS: 120 memfds of 16 MiB held 1,920 MiB past memory_mb). Threads stay allowed (clone with CLONE_THREAD). x86_64 and aarch64 only.
- fresh namespace per program with re, json, string, math, itertools, collections, Counter,
  defaultdict and the three search primitives; stdin is /dev/null; the environment is scrubbed.
- the working directory (empty, private to this worker) is emptied after every program.
Not covered here (the host's wrapper covers them where the machine allows, see isolation.ts):
network and filesystem isolation, and containment of processes a program could create where seccomp
is unavailable (they stay in the child's process group, which is killed after every program, and are
bounded by RLIMIT_NPROC after the uid drop; a process that calls setsid() escapes that group kill).
A program can forge frames on its own pipe to the zygote: that can only misreport its own result.

Layout. This file only loads the modules of python/slm_sandbox/ (see its __init__.py for which holds
what) and calls runner.main(). They are all imported here, in the zygote, before any child is forked,
so a child never reads a module file (nor needs to: after the uid drop it may not be allowed to).
"""

import os
import sys

# -I keeps the script's folder off sys.path: put it there just long enough to import the runner's
# modules (all of them: runner imports the rest), then restore sys.path, so that programs see the
# interpreter's own path as before.
_saved_path = list(sys.path)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    from slm_sandbox import child, probe, program, protocol, runner, seccomp, tools, zygote  # noqa: F401
finally:
    sys.path[:] = _saved_path
del _saved_path

if __name__ == '__main__':
    sys.exit(runner.main(sys.argv))

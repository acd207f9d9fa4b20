"""The seccomp filter: classic BPF assembled here (once, in the zygote) and installed in the child
through ctypes (no fork/exec/sockets, signals only to itself, no new limits; see sandbox_runner.py).
Also libc's prctl(), which the child uses for PR_SET_PDEATHSIG.
"""

import os
import struct
import errno


ARCHES = {
    # machine: (AUDIT_ARCH, x32 bit check, syscall numbers)
    'x86_64': (
        0xC000003E,
        True,
        dict(
            socket=41,
            fork=57,
            vfork=58,
            clone=56,
            clone3=435,
            execve=59,
            execveat=322,
            kill=62,
            tkill=200,
            tgkill=234,
            ptrace=101,
            process_vm_readv=310,
            process_vm_writev=311,
            pidfd_send_signal=424,
            pidfd_open=434,
            pidfd_getfd=438,
            setrlimit=160,
            prlimit64=302,
            mount=165,
            umount2=166,
            unshare=272,
            setns=308,
            chroot=161,
            pivot_root=155,
            reboot=169,
            kexec_load=246,
            init_module=175,
            finit_module=313,
            delete_module=176,
            bpf=321,
            perf_event_open=298,
            userfaultfd=323,
            keyctl=250,
            add_key=248,
            request_key=249,
            io_uring_setup=425,
            io_uring_enter=426,
            io_uring_register=427,
            swapon=167,
            swapoff=168,
            memfd_create=319,
            memfd_secret=447,
            shmget=29,
        ),
    ),
    'aarch64': (
        0xC00000B7,
        False,
        dict(
            socket=198,
            clone=220,
            clone3=435,
            execve=221,
            execveat=281,
            kill=129,
            tkill=130,
            tgkill=131,
            ptrace=117,
            process_vm_readv=270,
            process_vm_writev=271,
            pidfd_send_signal=424,
            pidfd_open=434,
            pidfd_getfd=438,
            setrlimit=164,
            prlimit64=261,
            mount=40,
            umount2=39,
            unshare=97,
            setns=268,
            chroot=51,
            pivot_root=41,
            reboot=142,
            kexec_load=104,
            init_module=105,
            finit_module=273,
            delete_module=106,
            bpf=280,
            perf_event_open=241,
            userfaultfd=282,
            keyctl=219,
            add_key=217,
            request_key=218,
            io_uring_setup=425,
            io_uring_enter=426,
            io_uring_register=427,
            swapon=224,
            swapoff=225,
            memfd_create=279,
            memfd_secret=447,
            shmget=194,
        ),
    ),
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

    ins(LD_ABS, 4)  # seccomp_data.arch
    ins(JEQ, audit_arch, None, 'deny')
    ins(LD_ABS, 0)  # seccomp_data.nr
    if x32:
        ins(JGE, 0x40000000, 'deny', None)
    for name, n in nr.items():
        if name not in SPECIAL:
            ins(JEQ, n, 'deny', None)
    ins(JEQ, nr['clone3'], 'enosys', None)  # glibc then falls back to clone()
    ins(JEQ, nr['clone'], 'clone', None)
    for name in ('kill', 'tkill', 'tgkill'):
        ins(JEQ, nr[name], 'own_pid', None)
    ins(JEQ, nr['prlimit64'], 'prlimit', None)
    ins(RET, RET_ALLOW)
    labels = {}
    labels['clone'] = len(prog)
    ins(LD_ABS, 16)  # args[0], low 32 bits: clone flags
    ins(JSET, CLONE_THREAD, 'allow', 'deny')
    labels['own_pid'] = len(prog)
    ins(LD_ABS, 16)  # args[0]: target pid (tgid for tgkill)
    pid_index = len(prog)
    ins(JEQ, 0, 'allow', 'deny')  # k = the child's pid, patched in per child
    labels['prlimit'] = len(prog)
    ins(LD_ABS, 32)  # args[2] (new limit pointer) must be NULL
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
    r = libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(arg3), ctypes.c_ulong(0), ctypes.c_ulong(0))
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

"""What this machine lets the child do (the capabilities the zygote reports in `ready` and with
--probe), and what the interpreter reads to run (the host's bubblewrap allow-list).
"""

import os
import sys

from .seccomp import install_seccomp, load_libc, prepare_seccomp


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
    caps = {
        'executable': sys.executable,
        'base_prefix': sys.base_prefix,
        'version': '%d.%d.%d' % sys.version_info[:3],
        'machine': os.uname().machine,
    }
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

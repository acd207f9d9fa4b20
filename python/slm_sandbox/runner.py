"""The worker's entry point (sandbox_runner.py calls main()): --probe, or start the zygote."""

import os
import sys
import json
import signal

from .seccomp import prctl
from .probe import capabilities, needed_paths
from .zygote import Zygote, empty_dir


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
        'workdir': workdir,
        'uid': uid,
        'gid': gid,
        'drop_uid': caps['drop_uid'],
        'seccomp': caps['seccomp'],
        'pdeathsig': caps['ctypes'],
        'zygote_pid': os.getpid(),
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

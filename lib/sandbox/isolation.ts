/**
 * Which isolation this machine allows for the Python workers, and the command line that applies it.
 *
 * Levels, best first (each is tried by actually starting the runner under it, so a level is only
 * reported when it works here):
 * - `bwrap` (bubblewrap): own network, PID, IPC and UTS namespaces; the root filesystem read-only;
 *   /root, /home, /run, /tmp and /var/tmp replaced by empty read-only directories (the Python
 *   installation and the runner are bound back in where they live there); a private size-limited
 *   tmpfs as the working directory; dies with its parent.
 * - `unshare` (util-linux): own network, PID (with its own /proc), IPC, UTS and mount namespaces; the
 *   filesystem stays writable and visible (a host temp directory is the working directory).
 * - `rlimits-only`: no wrapper; the worker runs in its own process group.
 * Inside every level the runner adds its own layer (python/sandbox_runner.py): resource limits, an
 * unprivileged uid when it starts as root and the standard library is readable by that uid, and a
 * seccomp filter where ctypes is available. `network` is true when either a network namespace or
 * the seccomp filter (which denies socket()) is in force.
 */
import { execFile } from 'node:child_process';
import { accessSync, constants, existsSync, realpathSync, statSync } from 'node:fs';
import { dirname, join, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { SlmError } from '../errors.js';
import type { IsolationLevel, IsolationReport } from './types.js';

/** Working directory of a program inside bubblewrap (a tmpfs). */
export const BWRAP_WORKDIR = '/tmp/work';
/** Directories replaced by empty read-only ones inside bubblewrap (secrets, sockets, other people's temp files). */
const HIDDEN_DIRS = ['/root', '/home', '/run', '/var/tmp', '/tmp'];
/** The environment every worker (and probe) starts with: nothing from the host. */
export const WORKER_ENV: Record<string, string> = { PATH: '/usr/local/bin:/usr/bin:/bin', LANG: 'C.UTF-8', MALLOC_ARENA_MAX: '2' };

/** Capabilities the runner reports (`sandbox_runner.py --probe`). */
export interface RunnerCaps {
  executable: string;
  base_prefix: string;
  version: string;
  machine: string;
  root: boolean;
  stdlib_readable: boolean;
  drop_uid: boolean;
  ctypes: boolean;
  seccomp: boolean;
  seccomp_error: string | null;
}

const pythonFiles = new Map<string, string>();
/** Absolute path of python/NAME in the slm-train package (works from lib/ and from dist/lib/). */
export function pythonFile(name: string, code = 'SANDBOX_UNAVAILABLE'): string {
  const hit = pythonFiles.get(name);
  if (hit) return hit;
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 6; i++) {
    const p = join(dir, 'python', name);
    if (existsSync(p)) {
      pythonFiles.set(name, realpathSync(p));
      return pythonFiles.get(name)!;
    }
    dir = dirname(dir);
  }
  throw new SlmError(code, `Expected python/${name} in the slm-train package but did not find it; reinstall the package.`);
}

/** Absolute path of python/sandbox_runner.py. */
export function runnerPath(): string {
  return pythonFile('sandbox_runner.py');
}

function run(cmd: string, args: string[], timeoutMs = 15_000, env: NodeJS.ProcessEnv = WORKER_ENV): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((res) => {
    execFile(cmd, args, { timeout: timeoutMs, env, maxBuffer: 1 << 20, killSignal: 'SIGKILL' }, (err, stdout, stderr) => {
      const code = err ? (typeof (err as { code?: unknown }).code === 'number' ? ((err as { code: number }).code) : null) : 0;
      res({ code, stdout: String(stdout), stderr: String(stderr || (err && !stdout ? err.message : '')) });
    });
  });
}

const pythonCache = new Map<string, Promise<string>>();
/**
 * The real Python executable: `explicit`, else $SLM_SANDBOX_PYTHON, else what `python3` on PATH
 * reports as sys.executable (PATH's python3 may be a slow pyenv shim), else /usr/bin/python3.
 */
export function resolvePython(explicit?: string): Promise<string> {
  const key = explicit ?? process.env.SLM_SANDBOX_PYTHON ?? '';
  let p = pythonCache.get(key);
  if (!p) {
    p = findPython(key);
    pythonCache.set(key, p);
  }
  return p;
}

async function findPython(explicit: string): Promise<string> {
  const tried: string[] = [];
  const candidates: string[] = [];
  if (explicit) candidates.push(explicit);
  else {
    // The shim needs the user's environment (PYENV_ROOT, HOME) to find its interpreter.
    const r = await run('python3', ['-c', 'import sys; print(sys.executable)'], 15_000, process.env);
    if (r.code === 0 && r.stdout.trim()) candidates.push(r.stdout.trim());
    else tried.push(`python3 on PATH: ${r.stderr.trim() || 'exit ' + r.code}`);
    candidates.push('/usr/bin/python3');
  }
  for (const c of candidates) {
    let exe: string;
    try {
      exe = realpathSync(c);
      accessSync(exe, constants.X_OK);
    } catch {
      tried.push(`${c}: not an executable file`);
      continue;
    }
    const r = await run(exe, ['-I', '-S', '-c', 'import sys; assert sys.version_info >= (3, 9); print(sys.version)']);
    if (r.code === 0) return exe;
    tried.push(`${exe}: ${r.stderr.trim().split('\n').pop() || 'exit ' + r.code} (Python 3.9 or later is needed)`);
  }
  throw new SlmError('SANDBOX_UNAVAILABLE', `Expected a Python 3.9+ interpreter for the sandbox but found none. Tried: ${tried.join('; ')}. Install python3 or set SLM_SANDBOX_PYTHON.`);
}

/** bubblewrap's arguments (everything before the Python command line). */
export function bwrapArgs(python: string, pythonPrefix: string, runner: string, workdirMb: number): string[] {
  const hidden = HIDDEN_DIRS.filter((d) => isDir(d));
  const a = ['--ro-bind', '/', '/', '--dev', '/dev', '--proc', '/proc'];
  for (const h of hidden) a.push('--tmpfs', h);
  // Bring back what the workers need from under a hidden directory (pyenv lives in /root here).
  const exposed = new Set<string>();
  for (const p of [pythonPrefix, dirname(python), dirname(runner)]) {
    const real = safeRealpath(p);
    const h = hidden.find((d) => real === d || real.startsWith(d + sep));
    if (!h || [...exposed].some((e) => real === e || real.startsWith(e + sep))) continue;
    const rel = real.slice(h.length + 1).split(sep);
    for (let i = 1; i < rel.length; i++) a.push('--perms', '0755', '--dir', join(h, ...rel.slice(0, i)));
    a.push('--ro-bind', real, real);
    exposed.add(real);
  }
  a.push('--size', String(Math.max(1, workdirMb) * 1024 * 1024), '--tmpfs', BWRAP_WORKDIR);
  for (const h of hidden) a.push('--remount-ro', h);
  a.push('--unshare-net', '--unshare-pid', '--unshare-ipc', '--unshare-uts', '--unshare-cgroup-try');
  a.push('--die-with-parent', '--new-session', '--chdir', BWRAP_WORKDIR, '--');
  return a;
}

/** util-linux unshare's arguments (everything before the Python command line). */
export function unshareArgs(): string[] {
  return ['--net', '--pid', '--ipc', '--uts', '--mount', '--fork', '--kill-child', '--mount-proc', '--'];
}

/** The program and arguments that start the runner with `runnerArgs` at `level`. */
export function wrapperCommand(level: IsolationLevel, python: string, caps: Pick<RunnerCaps, 'base_prefix'>, runnerArgs: string[], workdirMb = 64): { file: string; args: string[] } {
  const runner = runnerPath();
  const py = [python, '-I', '-S', '-B', runner, ...runnerArgs];
  if (level === 'bwrap') return { file: 'bwrap', args: [...bwrapArgs(python, caps.base_prefix, runner, workdirMb), ...py] };
  if (level === 'unshare') return { file: 'unshare', args: [...unshareArgs(), ...py] };
  return { file: python, args: py.slice(1) };
}

function isDir(p: string): boolean {
  try {
    return statSync(p).isDirectory();
  } catch {
    return false;
  }
}
function safeRealpath(p: string): string {
  try {
    return realpathSync(p);
  } catch {
    return resolve(p);
  }
}

async function probe(level: IsolationLevel, python: string, prefix: string): Promise<{ caps?: RunnerCaps; why?: string }> {
  const { file, args } = wrapperCommand(level, python, { base_prefix: prefix }, ['--probe'], 1);
  const r = await run(file, args);
  if (r.code !== 0) return { why: `${file}: ${r.stderr.trim().split('\n').slice(-2).join(' ') || 'exit ' + r.code}` };
  try {
    return { caps: JSON.parse(r.stdout.trim().split('\n').pop() ?? '') as RunnerCaps };
  } catch {
    return { why: `${file}: unexpected probe output ${JSON.stringify(r.stdout.slice(0, 200))}` };
  }
}

const detectCache = new Map<string, Promise<IsolationReport & { caps: RunnerCaps }>>();
const LEVELS: IsolationLevel[] = ['bwrap', 'unshare', 'rlimits-only'];

export interface DetectOptions {
  /** Python executable (default: resolvePython()). */
  python?: string;
  /** The best level to consider (e.g. 'unshare' skips bubblewrap). */
  maxLevel?: IsolationLevel;
  /** Probe again instead of using the memoized answer. */
  refresh?: boolean;
}

/**
 * Finds the best isolation level that works on this machine (memoized per interpreter and maxLevel).
 * A level that does not work here is not an error: the next one down is used and `details` says why.
 */
export async function detectIsolation(opts: DetectOptions = {}): Promise<IsolationReport> {
  const { caps: _caps, ...report } = await detectIsolationWithCaps(opts);
  return report;
}

/** @internal detectIsolation() plus what the runner reported about itself (for starting workers). */
export function detectIsolationWithCaps(opts: DetectOptions = {}): Promise<IsolationReport & { caps: RunnerCaps }> {
  const key = `${opts.python ?? ''}|${opts.maxLevel ?? 'bwrap'}`;
  let p = opts.refresh ? undefined : detectCache.get(key);
  if (!p) {
    p = detect(opts.python, opts.maxLevel ?? 'bwrap');
    detectCache.set(key, p);
    p.catch(() => detectCache.delete(key));
  }
  return p;
}

async function detect(pythonOpt: string | undefined, maxLevel: IsolationLevel): Promise<IsolationReport & { caps: RunnerCaps }> {
  const python = await resolvePython(pythonOpt);
  const bare = await probe('rlimits-only', python, '');
  if (!bare.caps) throw new SlmError('SANDBOX_UNAVAILABLE', `Expected the sandbox runner to start under ${python} but it failed: ${bare.why}`);
  const prefix = bare.caps.base_prefix;
  const notes: string[] = [];
  for (const level of LEVELS.slice(LEVELS.indexOf(maxLevel))) {
    const r = level === 'rlimits-only' ? bare : await probe(level, python, prefix);
    if (!r.caps) {
      notes.push(`${level} unavailable (${r.why})`);
      continue;
    }
    return { ...describeLevel(level, r.caps, python, notes), caps: r.caps };
  }
  /* c8 ignore next */
  throw new Error('unreachable');
}

function describeLevel(level: IsolationLevel, caps: RunnerCaps, python: string, notes: string[]): IsolationReport {
  const network = level !== 'rlimits-only' || caps.seccomp;
  const readonlyFs = level === 'bwrap';
  const parts: string[] = [];
  if (level === 'bwrap') parts.push('bubblewrap: own network/PID/IPC/UTS namespaces, read-only filesystem, /root /home /run /tmp hidden, private tmpfs work dir');
  else if (level === 'unshare') parts.push('unshare: own network/PID/IPC/UTS/mount namespaces; filesystem writable');
  else parts.push('no namespaces: resource limits and process groups only');
  parts.push(caps.seccomp ? 'seccomp: no fork/exec/sockets, signals only to itself' : `no seccomp (${caps.seccomp_error ?? 'unavailable'})`);
  parts.push(caps.drop_uid ? 'programs run as uid 65534' : caps.root ? 'programs run as root (the standard library is not readable by an unprivileged uid here)' : 'programs run as the current user');
  parts.push(`python ${caps.version} at ${python}`);
  if (notes.length) parts.push(notes.join('; '));
  return { level, network, readonlyFs, seccomp: caps.seccomp, uidDrop: caps.drop_uid, python, pythonVersion: caps.version, details: parts.join('; ') };
}

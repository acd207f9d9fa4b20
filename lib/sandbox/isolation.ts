/**
 * Which isolation this machine allows for the Python workers, and the command line that applies it.
 *
 * Levels, best first (each is tried by actually starting the runner under it, so a level is only
 * reported when it works here):
 * - `bwrap` (bubblewrap): own network, PID, IPC and UTS namespaces; the filesystem is an allow-list:
 *   an empty read-only root into which only what the interpreter needs is bound, read-only (its
 *   executable, standard library and the files it maps, as the runner itself reports them with
 *   `--probe`; the system libraries /usr/lib, /usr/lib64, /lib, /lib64; /etc/ld.so.cache; the runner
 *   at SANDBOX_RUNNER and its modules at SANDBOX_PACKAGE), plus its own /proc and /dev and a
 *   private size-limited tmpfs as the working directory. Nothing else of the host is readable or listable: not the folder slm-train runs from,
 *   the run folder, the corpus or questions files, the project, /home, /root, /srv, /opt, /mnt, /etc.
 *   Dies with its parent.
 * - `unshare` (util-linux): own network, PID (with its own /proc), IPC, UTS and mount namespaces; the
 *   filesystem stays writable and visible (a host temp directory is the working directory): a
 *   program reads what its uid can (`IsolationReport.readable` says which).
 * - `rlimits-only`: no wrapper; the worker runs in its own process group; the filesystem as above.
 * `sandbox.require_isolation` / `requireIsolation` makes a run refuse to start below a chosen level.
 * Inside every level the runner adds its own layer (python/sandbox_runner.py and its modules in
 * python/slm_sandbox/): resource limits, an unprivileged uid when it starts as root and the standard library is readable by that uid, and a
 * seccomp filter where ctypes is available. `network` is true when either a network namespace or
 * the seccomp filter (which denies socket()) is in force.
 */
import { execFile } from 'node:child_process';
import { accessSync, constants, existsSync, lstatSync, readlinkSync, realpathSync } from 'node:fs';
import { userInfo } from 'node:os';
import { dirname, join, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { SlmError } from '../errors.js';
import type { IsolationLevel, IsolationReport } from './types.js';

/** Working directory of a program inside bubblewrap (a tmpfs). */
export const BWRAP_WORKDIR = '/tmp/work';
/** Where the runner is bound inside bubblewrap (nothing of the slm-train package's location shows). */
export const SANDBOX_RUNNER = '/slm-train/sandbox_runner.py';
/** Where the runner's modules (python/slm_sandbox/) are bound inside bubblewrap: next to the runner, which imports them from its own folder. */
export const SANDBOX_PACKAGE = '/slm-train/slm_sandbox';
/** Shared-library directories bound read-only inside bubblewrap (a symlink is recreated as one). */
const SYSTEM_LIB_DIRS = ['/usr/lib', '/usr/lib64', '/lib', '/lib64'];
/** Host files the dynamic loader reads, bound read-only where they exist. */
const SYSTEM_FILES = ['/etc/ld.so.cache'];
/** Isolation levels, weakest first (require_isolation compares positions). */
export const ISOLATION_ORDER: readonly IsolationLevel[] = ['rlimits-only', 'unshare', 'bwrap'];
/** The environment every worker (and probe) starts with: nothing from the host. */
export const WORKER_ENV: Record<string, string> = { PATH: '/usr/local/bin:/usr/bin:/bin', LANG: 'C.UTF-8', MALLOC_ARENA_MAX: '2' };

/** What the interpreter reads to run (`sandbox_runner.py --probe`, real paths). */
export interface InterpreterPaths {
  /** Standard-library directories (lib-dynload included). */
  dirs: string[];
  /** Installed-packages directories (site-packages); hidden inside bubblewrap when they lie in a bound directory. */
  site: string[];
  /** Files mapped into the runner (executable, libpython, shared libraries). */
  files: string[];
}

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
  /** Only from `--probe`. */
  paths?: InterpreterPaths;
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
function runnerPath(): string {
  return pythonFile('sandbox_runner.py');
}

/** Absolute path of python/slm_sandbox, the runner's modules (it imports them from its own folder). */
export function runnerPackagePath(): string {
  return pythonFile('slm_sandbox');
}

function run(
  cmd: string,
  args: string[],
  timeoutMs = 15_000,
  env: NodeJS.ProcessEnv = WORKER_ENV,
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((res) => {
    execFile(cmd, args, { timeout: timeoutMs, env, maxBuffer: 1 << 20, killSignal: 'SIGKILL' }, (err, stdout, stderr) => {
      const code = err ? (typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : null) : 0;
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
  throw new SlmError(
    'SANDBOX_UNAVAILABLE',
    `Expected a Python 3.9+ interpreter for the sandbox but found none. Tried: ${tried.join('; ')}. Install python3 or set SLM_SANDBOX_PYTHON.`,
  );
}

/** What bubblewrap makes visible (read-only) to a program, from what the interpreter reported it needs. */
export interface BwrapView {
  /** Directories bound read-only at the same path. */
  dirs: string[];
  /** Symbolic links recreated as they are on the host: [target, path] (e.g. ['usr/lib', '/lib']). */
  symlinks: Array<[string, string]>;
  /** Single files bound read-only at the same path. */
  files: string[];
  /** Directories inside bound ones replaced by empty read-only ones (site-packages). */
  hidden: string[];
}

const under = (p: string, d: string) => p === d || p.startsWith(d.endsWith(sep) ? d : d + sep);

/** The allow-list bubblewrap binds: the system library directories, the interpreter's own paths, /etc/ld.so.cache. */
export function bwrapView(python: string, paths: InterpreterPaths): BwrapView {
  const dirs: string[] = [];
  const symlinks: Array<[string, string]> = [];
  for (const d of SYSTEM_LIB_DIRS) {
    try {
      const st = lstatSync(d);
      if (st.isSymbolicLink()) symlinks.push([readlinkSync(d), d]);
      else if (st.isDirectory()) dirs.push(d);
    } catch {
      /* not on this machine */
    }
  }
  const covered = (p: string) => dirs.some((d) => under(p, d));
  const stdlib = [...new Set(paths.dirs.map(safeRealpath))].filter((d) => !covered(d)).sort();
  for (const d of stdlib) if (!stdlib.some((o) => o !== d && under(d, o))) dirs.push(d);
  const files: string[] = [];
  for (const f of [safeRealpath(python), ...SYSTEM_FILES.filter((f) => existsSync(f)), ...paths.files]) {
    if (!covered(f) && !files.includes(f)) files.push(f);
  }
  const hidden = [...new Set(paths.site.map(safeRealpath))]
    .filter((h) => covered(h) && !dirs.includes(h) && !dirs.some((d) => under(d, h)))
    .sort();
  return { dirs, symlinks, files, hidden };
}

/** bubblewrap's arguments (everything before the Python command line): see bwrapView() and the file comment. */
function bwrapArgs(python: string, paths: InterpreterPaths, runner: string, runnerPackage: string, workdirMb: number): string[] {
  const v = bwrapView(python, paths);
  const a: string[] = [];
  // bubblewrap creates the folders leading to a mount point with mode 0700: make them 0755 first, so
  // that the unprivileged uid the runner drops programs to can reach the standard library.
  const parents = new Set<string>();
  for (const p of [...v.dirs, ...v.files, ...v.symlinks.map((s) => s[1]), SANDBOX_RUNNER, BWRAP_WORKDIR]) {
    for (let d = dirname(p); d !== '/' && d !== '.'; d = dirname(d)) if (!v.dirs.some((b) => under(d, b))) parents.add(d);
  }
  for (const d of [...parents].sort((x, y) => x.split(sep).length - y.split(sep).length || x.localeCompare(y)))
    a.push('--perms', '0755', '--dir', d);
  for (const d of v.dirs) a.push('--ro-bind', d, d);
  for (const [target, path] of v.symlinks) a.push('--symlink', target, path);
  for (const f of v.files) a.push('--ro-bind', f, f);
  a.push('--ro-bind', runner, SANDBOX_RUNNER);
  a.push('--ro-bind', runnerPackage, SANDBOX_PACKAGE);
  a.push('--dev', '/dev', '--proc', '/proc');
  for (const h of v.hidden) a.push('--tmpfs', h);
  a.push('--size', String(Math.max(1, workdirMb) * 1024 * 1024), '--tmpfs', BWRAP_WORKDIR);
  for (const h of v.hidden) a.push('--remount-ro', h);
  a.push('--remount-ro', '/');
  a.push('--unshare-net', '--unshare-pid', '--unshare-ipc', '--unshare-uts', '--unshare-cgroup-try');
  a.push('--die-with-parent', '--new-session', '--chdir', BWRAP_WORKDIR, '--');
  return a;
}

/** util-linux unshare's arguments (everything before the Python command line). */
function unshareArgs(): string[] {
  return ['--net', '--pid', '--ipc', '--uts', '--mount', '--fork', '--kill-child', '--mount-proc', '--'];
}

/** The program and arguments that start the runner with `runnerArgs` at `level` (bwrap needs `paths`). */
export function wrapperCommand(
  level: IsolationLevel,
  python: string,
  caps: Pick<RunnerCaps, 'paths'>,
  runnerArgs: string[],
  workdirMb = 64,
): { file: string; args: string[] } {
  const runner = runnerPath();
  const py = [python, '-I', '-S', '-B', runner, ...runnerArgs];
  if (level === 'bwrap') {
    if (!caps.paths)
      throw new SlmError(
        'SANDBOX_UNAVAILABLE',
        "Expected the interpreter's paths (from the runner's --probe) to start bubblewrap but found none.",
      );
    return {
      file: 'bwrap',
      args: [
        ...bwrapArgs(python, caps.paths, runner, runnerPackagePath(), workdirMb),
        python,
        '-I',
        '-S',
        '-B',
        SANDBOX_RUNNER,
        ...runnerArgs,
      ],
    };
  }
  if (level === 'unshare') return { file: 'unshare', args: [...unshareArgs(), ...py] };
  return { file: python, args: py.slice(1) };
}

function safeRealpath(p: string): string {
  try {
    return realpathSync(p);
  } catch {
    return resolve(p);
  }
}

async function probe(level: IsolationLevel, python: string, paths?: InterpreterPaths): Promise<{ caps?: RunnerCaps; why?: string }> {
  const { file, args } = wrapperCommand(level, python, { paths }, ['--probe'], 1);
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

/**
 * $SLM_SANDBOX_ISOLATION caps the level every sandbox of this process uses (bwrap, unshare or
 * rlimits-only): to see what a program can do at a weaker level, or to try a run's
 * sandbox.require_isolation.
 */
function envMaxLevel(): IsolationLevel | undefined {
  const v = process.env.SLM_SANDBOX_ISOLATION;
  if (v === undefined || v === '') return undefined;
  if (!(ISOLATION_ORDER as readonly string[]).includes(v)) {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected SLM_SANDBOX_ISOLATION to be one of ${ISOLATION_ORDER.join(', ')} but found ${JSON.stringify(v)}; unset it to use the best level this machine offers.`,
    );
  }
  return v as IsolationLevel;
}

const weaker = (a: IsolationLevel, b: IsolationLevel): IsolationLevel => (ISOLATION_ORDER.indexOf(a) <= ISOLATION_ORDER.indexOf(b) ? a : b);

export interface DetectOptions {
  /** Python executable (default: resolvePython()). */
  python?: string;
  /** The best level to consider (e.g. 'unshare' skips bubblewrap); $SLM_SANDBOX_ISOLATION lowers it further. */
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
  let maxLevel: IsolationLevel;
  try {
    maxLevel = weaker(opts.maxLevel ?? 'bwrap', envMaxLevel() ?? 'bwrap');
  } catch (e) {
    return Promise.reject(e);
  }
  const key = `${opts.python ?? ''}|${maxLevel}`;
  let p = opts.refresh ? undefined : detectCache.get(key);
  if (!p) {
    p = detect(opts.python, maxLevel);
    detectCache.set(key, p);
    p.catch(() => detectCache.delete(key));
  }
  return p;
}

async function detect(pythonOpt: string | undefined, maxLevel: IsolationLevel): Promise<IsolationReport & { caps: RunnerCaps }> {
  const python = await resolvePython(pythonOpt);
  const bare = await probe('rlimits-only', python);
  if (!bare.caps)
    throw new SlmError('SANDBOX_UNAVAILABLE', `Expected the sandbox runner to start under ${python} but it failed: ${bare.why}`);
  const paths = bare.caps.paths ?? { dirs: [], site: [], files: [] };
  const notes: string[] = [];
  for (const level of LEVELS.slice(LEVELS.indexOf(maxLevel))) {
    const r = level === 'rlimits-only' ? bare : await probe(level, python, paths);
    if (!r.caps) {
      notes.push(`${level} unavailable (${r.why})`);
      continue;
    }
    const caps = { ...r.caps, paths };
    return { ...describeLevel(level, caps, python, notes), caps };
  }
  /* c8 ignore next */
  throw new Error('unreachable');
}

/** Exactly what a program can read at `level` (the words after "a program can read"). */
function readableAt(level: IsolationLevel, caps: Pick<RunnerCaps, 'paths' | 'drop_uid' | 'root'>, python: string): string {
  if (level === 'bwrap') {
    const v = bwrapView(python, caps.paths ?? { dirs: [], site: [], files: [] });
    const notes = [...v.symlinks.map(([target, path]) => `${path} -> ${target}`), ...v.hidden.map((h) => `${h} emptied`)];
    const shown = v.files.slice(0, 8).join(', ') + (v.files.length > 8 ? ` and ${v.files.length - 8} more files` : '');
    return (
      `only what the interpreter needs, read-only: ${v.dirs.join(', ')}${notes.length ? ` (${notes.join('; ')})` : ''}` +
      `${v.files.length ? `; the files ${shown}` : ''}; the sandbox runner; ` +
      'its own /proc and /dev, and its private working directory. Nothing else of this machine: not the folder slm-train runs from, the run folder, ' +
      'the corpus or questions files, the project, /home, /srv, /opt, /mnt, nor anything else under /etc, /root or /usr'
    );
  }
  if (caps.drop_uid) {
    return (
      'every file and folder of this machine that any user may read (programs run as an unprivileged uid, 65534 by default): ' +
      'with the usual permissions (files 0644, folders 0755) that includes the folder slm-train runs from, the run folder, the corpus and questions files ' +
      'with their gold answers and the project; only files and folders closed to "others" are out of reach'
    );
  }
  let who: string;
  try {
    const u = userInfo();
    who = `${u.username} (uid ${u.uid})`;
  } catch {
    who = `uid ${process.getuid?.() ?? '?'}`;
  }
  return caps.root
    ? `every file of this machine: programs run as ${who}, the user slm-train runs as, which is root (the folder slm-train runs from, the run folder, the corpus and questions files with their gold answers, the project, /root, keys)`
    : `every file the slm-train user can: programs run as ${who}, the user slm-train runs as (the folder slm-train runs from, the run folder, the corpus and questions files with their gold answers, the project, the home folder and any keys in it)`;
}

/** One line for logs: "<level>: a program can read <readable>". */
export function filesystemLine(iso: Pick<IsolationReport, 'level' | 'readable'>): string {
  return `${iso.level}: a program can read ${iso.readable}`;
}

/**
 * Refuses to go on (SANDBOX_ISOLATION_INSUFFICIENT) when `iso` is below `required`
 * (`sandbox.require_isolation` in a config, `requireIsolation` for createSandbox, `--require-isolation` for exec).
 */
export function checkRequiredIsolation(
  iso: IsolationReport,
  required: IsolationLevel | null | undefined,
  setting = 'sandbox.require_isolation',
): void {
  if (required === null || required === undefined) return;
  if (!ISOLATION_ORDER.includes(required)) {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected ${setting} to be one of ${ISOLATION_ORDER.join(', ')} (or null) but received ${JSON.stringify(required)}.`,
    );
  }
  if (ISOLATION_ORDER.indexOf(iso.level) >= ISOLATION_ORDER.indexOf(required)) return;
  const why = iso.details
    .split('; ')
    .filter((p) => / unavailable \(/.test(p))
    .join('; ');
  throw new SlmError(
    'SANDBOX_ISOLATION_INSUFFICIENT',
    `Expected sandbox isolation ${required} or better (${setting}) but this machine gives ${iso.level}${why ? ` (${why})` : ''}; at ${iso.level} a program can read ${iso.readable}. ` +
      (required === 'bwrap'
        ? 'Install bubblewrap (apt-get install bubblewrap) and allow it to create namespaces (as root, or with unprivileged user namespaces enabled: sysctl kernel.unprivileged_userns_clone=1), '
        : 'Install util-linux unshare and run slm-train as root, or install bubblewrap, ') +
      `lower ${setting}, or use sandbox kind quickjs (no filesystem at all). Nothing was started.`,
    { required, level: iso.level },
  );
}

function describeLevel(level: IsolationLevel, caps: RunnerCaps, python: string, notes: string[]): IsolationReport {
  const network = level !== 'rlimits-only' || caps.seccomp;
  const readonlyFs = level === 'bwrap';
  const readable = readableAt(level, caps, python);
  const parts: string[] = [];
  if (level === 'bwrap')
    parts.push(
      'bubblewrap: own network/PID/IPC/UTS namespaces, filesystem an allow-list (the interpreter and system libraries read-only, a private tmpfs work dir)',
    );
  else if (level === 'unshare') parts.push('unshare: own network/PID/IPC/UTS/mount namespaces; filesystem writable and visible');
  else parts.push('no namespaces: resource limits and process groups only; filesystem writable and visible');
  parts.push(
    caps.seccomp
      ? 'seccomp: no fork/exec/sockets, no memfd or SysV shared memory (memory outside memory_mb), signals only to itself'
      : `no seccomp (${caps.seccomp_error ?? 'unavailable'})`,
  );
  parts.push(
    caps.drop_uid
      ? 'programs run as uid 65534'
      : caps.root
        ? 'programs run as root (the standard library is not readable by an unprivileged uid here)'
        : 'programs run as the current user',
  );
  parts.push(`python ${caps.version} at ${python}`);
  if (notes.length) parts.push(notes.join('; '));
  return {
    level,
    network,
    readonlyFs,
    hostFilesHidden: level === 'bwrap',
    readable,
    seccomp: caps.seccomp,
    uidDrop: caps.drop_uid,
    python,
    pythonVersion: caps.version,
    details: parts.join('; '),
  };
}

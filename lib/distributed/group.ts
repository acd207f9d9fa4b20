/**
 * A torch.distributed process group for one rank, through a sidecar (python/dist_sidecar.py run by
 * the python that has torch, Debian's /usr/bin/python3 with python3-torch by default).
 *
 * Debian's libtorch-dev has no c10d headers, so the addon cannot link ProcessGroupGloo/NCCL itself;
 * the sidecar uses the same libtorch build through torch.distributed: a c10d TCPStore rendezvous
 * (env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, as torchrun sets them), Gloo on CPU, NCCL on
 * CUDA, and the group's timeout on every collective. Tensors cross through one float32 file in
 * /dev/shm per rank (the sidecar maps it with torch.from_file(shared=True) and reduces in place), a
 * command line on the sidecar's stdin says what to do, and its reply line says when it is done.
 *
 * A failure anywhere (a rank that died, a collective past the timeout, the sidecar gone) rejects with
 * DISTRIBUTED_FAILED and closes the group: a broken group is never used again.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, ftruncateSync, openSync, readSync, rmSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { SlmError, describe } from '../errors.js';
import { pythonFile } from '../sandbox/isolation.js';

/** Where this process sits in the job: the torchrun variables. */
export interface DistEnv {
  rank: number;
  world: number;
  localRank: number;
  masterAddr: string;
  masterPort: number;
}

const intVar = (env: NodeJS.ProcessEnv, k: string): number | undefined => {
  const v = env[k];
  if (v === undefined || v === '') return undefined;
  if (!/^\d+$/.test(v))
    throw new SlmError('CONFIG_INVALID', `environment variable ${k} must be a non-negative integer, found ${JSON.stringify(v)}.`);
  return Number(v);
};

/**
 * The rank's place from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (torchrun's names);
 * null when WORLD_SIZE is unset or 1 (a single process).
 */
export function distEnvFrom(env: NodeJS.ProcessEnv = process.env): DistEnv | null {
  const world = intVar(env, 'WORLD_SIZE');
  if (world === undefined || world <= 1) return null;
  const rank = intVar(env, 'RANK');
  if (rank === undefined || rank >= world)
    throw new SlmError(
      'CONFIG_INVALID',
      `WORLD_SIZE is ${world} but RANK is ${env.RANK === undefined ? 'unset' : JSON.stringify(env.RANK)}; every process needs RANK in [0, ${world}) (torchrun sets it).`,
    );
  const port = intVar(env, 'MASTER_PORT');
  if (!env.MASTER_ADDR || port === undefined)
    throw new SlmError(
      'CONFIG_INVALID',
      `WORLD_SIZE is ${world} but MASTER_ADDR/MASTER_PORT are not both set; every rank needs the address of rank 0's TCPStore (torchrun sets them).`,
    );
  return { rank, world, localRank: intVar(env, 'LOCAL_RANK') ?? rank, masterAddr: env.MASTER_ADDR, masterPort: port };
}

export interface GroupOptions {
  backend: 'gloo' | 'nccl';
  /** Seconds for the rendezvous and for every collective. */
  timeoutS: number;
  /** The python with torch.distributed (distributed.python). */
  python: string;
  /** cpu, or cuda:N for NCCL. */
  device?: string;
  log?: (line: string) => void;
}

interface Reply {
  ok: boolean;
  error?: string;
  ms?: number;
  values?: unknown[];
  [k: string]: unknown;
}

export class ProcessGroup {
  private lines: AsyncIterator<string>;
  private chain: Promise<unknown> = Promise.resolve();
  private shm: string;
  private shmFd: number | null = null;
  private shmBytes = 0;
  private dead: string | null = null;
  private stderr = '';

  private constructor(
    readonly env: DistEnv,
    readonly opts: GroupOptions,
    private proc: ChildProcess,
  ) {
    const dir = existsSync('/dev/shm') ? '/dev/shm' : tmpdir();
    this.shm = join(dir, `slm-train-dist-${process.pid}-rank${env.rank}.f32`);
    this.lines = createInterface({ input: proc.stdout! })[Symbol.asyncIterator]();
    proc.stderr!.on('data', (d: Buffer) => {
      this.stderr = (this.stderr + d.toString()).slice(-4000);
    });
    proc.on('exit', (code, sig) => {
      this.dead ??= `the torch.distributed sidecar of rank ${env.rank} exited (${sig ?? `code ${code}`})`;
    });
  }

  get rank(): number {
    return this.env.rank;
  }
  get world(): number {
    return this.env.world;
  }

  /** Starts the sidecar and waits until every rank has joined (or the timeout passes). */
  static async join(env: DistEnv, opts: GroupOptions): Promise<ProcessGroup> {
    const python = opts.python;
    if (!existsSync(python))
      throw new SlmError(
        'DISTRIBUTED_UNAVAILABLE',
        `distributed training needs a python with torch.distributed; ${python} does not exist. Install Debian's python3-torch (apt-get install python3-torch) or set distributed.python.`,
      );
    const script = pythonFile('dist_sidecar.py', 'DISTRIBUTED_UNAVAILABLE');
    const proc = spawn(python, [script, '--backend', opts.backend, '--timeout', String(opts.timeoutS), '--device', opts.device ?? 'cpu'], {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: {
        ...process.env,
        RANK: String(env.rank),
        WORLD_SIZE: String(env.world),
        LOCAL_RANK: String(env.localRank),
        MASTER_ADDR: env.masterAddr,
        MASTER_PORT: String(env.masterPort),
      },
    });
    const g = new ProcessGroup(env, opts, proc);
    let first: Reply;
    try {
      first = await g.read(`joining the process group at ${env.masterAddr}:${env.masterPort}`, opts.timeoutS + 60);
    } catch (e) {
      g.kill();
      throw e;
    }
    if (!first.ok) {
      g.kill();
      throw new SlmError(
        /cannot import/.test(first.error ?? '') ? 'DISTRIBUTED_UNAVAILABLE' : 'DISTRIBUTED_FAILED',
        `${first.error}${g.stderrTail()}`,
      );
    }
    opts.log?.(
      `distributed: rank ${env.rank}/${env.world} joined (${opts.backend}, ${env.masterAddr}:${env.masterPort}) in ${Number(first.ms ?? 0).toFixed(0)} ms`,
    );
    return g;
  }

  /** Sums `a` over every rank, in place; returns `a`. */
  allReduce(a: Float32Array): Promise<Float32Array> {
    return this.withFile(a, 'all_reduce', {}).then(() => a);
  }

  /** Rank `src`'s `a` on every rank, in place; returns `a`. */
  broadcast(a: Float32Array, src = 0): Promise<Float32Array> {
    return this.withFile(a, 'broadcast', { src }).then(() => a);
  }

  /** Element-wise float64 sums of a few numbers over every rank. */
  async allReduceValues(values: number[]): Promise<number[]> {
    const r = await this.call({ op: 'all_reduce_values', values }, 'all_reduce_values');
    return r.values as number[];
  }

  /** Every rank's JSON value, in rank order. */
  async allGather<T>(value: T): Promise<T[]> {
    const r = await this.call({ op: 'all_gather', value }, 'all_gather');
    return r.values as T[];
  }

  async barrier(): Promise<void> {
    await this.call({ op: 'barrier' }, 'barrier');
  }

  /** Leaves the group (every rank should call it at the end) and removes the shared file. */
  async close(): Promise<void> {
    try {
      if (!this.dead) await this.call({ op: 'close' }, 'close');
    } catch {
      /* the group is going away anyway */
    } finally {
      this.kill();
    }
  }

  private kill(): void {
    this.dead ??= 'the process group was closed';
    if (this.shmFd !== null) closeSync(this.shmFd);
    this.shmFd = null;
    rmSync(this.shm, { force: true });
    if (this.proc.exitCode === null) this.proc.kill('SIGKILL');
  }

  private stderrTail(): string {
    const t = this.stderr.trim().split('\n').slice(-5).join('\n');
    return t ? `\nsidecar stderr:\n${t}` : '';
  }

  private async withFile(values: Float32Array, op: string, extra: Record<string, unknown>): Promise<number> {
    return this.serial(async () => {
      if (this.shmFd === null) this.shmFd = openSync(this.shm, 'w+');
      if (this.shmBytes !== values.byteLength) {
        ftruncateSync(this.shmFd, values.byteLength);
        this.shmBytes = values.byteLength;
      }
      const bytes = new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
      writeSync(this.shmFd, bytes, 0, bytes.length, 0);
      const r = await this.request({ op, file: this.shm, n: values.length, ...extra }, op);
      readSync(this.shmFd, bytes, 0, bytes.length, 0);
      return Number(r.ms ?? 0);
    });
  }

  private call(msg: Record<string, unknown>, what: string): Promise<Reply> {
    return this.serial(() => this.request(msg, what));
  }

  private serial<T>(f: () => Promise<T>): Promise<T> {
    const p = this.chain.then(f);
    this.chain = p.catch(() => {});
    return p;
  }

  private async request(msg: Record<string, unknown>, what: string): Promise<Reply> {
    if (this.dead) throw new SlmError('DISTRIBUTED_FAILED', `rank ${this.rank}: cannot run ${what}: ${this.dead}.${this.stderrTail()}`);
    this.proc.stdin!.write(JSON.stringify(msg) + '\n');
    // The sidecar's own timeout fires first; this one catches a sidecar that hangs outright.
    const r = await this.read(what, this.opts.timeoutS + 30);
    if (!r.ok) {
      this.kill();
      throw new SlmError(
        'DISTRIBUTED_FAILED',
        `${r.error} (another rank failed or stopped answering within distributed.timeout_s = ${this.opts.timeoutS} s; see its log).${this.stderrTail()}`,
      );
    }
    return r;
  }

  private async read(what: string, timeoutS: number): Promise<Reply> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, rej) => {
      timer = setTimeout(() => {
        this.kill();
        rej(
          new SlmError(
            'DISTRIBUTED_FAILED',
            `rank ${this.rank}: ${what} did not finish within ${timeoutS} s; a rank is stuck or gone (distributed.timeout_s).${this.stderrTail()}`,
          ),
        );
      }, timeoutS * 1000);
      timer.unref();
    });
    try {
      const next = await Promise.race([this.lines.next(), timeout]);
      if (next.done)
        throw new SlmError(
          'DISTRIBUTED_FAILED',
          `rank ${this.rank}: ${what}: ${this.dead ?? 'the torch.distributed sidecar closed its output'}.${this.stderrTail()}`,
        );
      try {
        return JSON.parse(next.value) as Reply;
      } catch {
        this.kill();
        throw new SlmError(
          'DISTRIBUTED_FAILED',
          `rank ${this.rank}: ${what}: the torch.distributed sidecar wrote ${describe(next.value.slice(0, 200))} on its protocol channel (stdout) instead of a JSON reply; something in it prints to stdout (e.g. a library's logging). Send that output to stderr.${this.stderrTail()}`,
        );
      }
    } finally {
      clearTimeout(timer);
    }
  }
}

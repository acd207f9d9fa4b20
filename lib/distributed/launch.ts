/**
 * `slm-train train --config F --nproc N`: this process becomes a launcher that starts N workers (the
 * same command line without --nproc) with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
 * MASTER_ADDR, MASTER_PORT), prefixes their stderr with the rank, and waits. When a worker fails the
 * others are stopped and the launcher reports which rank failed and why (DISTRIBUTED_FAILED), so a
 * dead rank never leaves the rest hanging. A process that already has WORLD_SIZE (started by torchrun
 * or by this launcher) is a worker and runs the stage itself.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';
import type { DistributedConfig } from '../config/types.js';
import { SlmError } from '../errors.js';
import { distEnvFrom } from './group.js';

export function freePort(host = '127.0.0.1'): Promise<number> {
  return new Promise((res, rej) => {
    const s = createServer();
    s.on('error', rej);
    s.listen(0, host, () => {
      const p = (s.address() as { port: number }).port;
      s.close(() => res(p));
    });
  });
}

/** argv without `--nproc N` / `--nproc=N` (the workers must not launch again). */
export function workerArgs(argv: readonly string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--nproc') i++;
    else if (!argv[i].startsWith('--nproc=')) out.push(argv[i]);
  }
  return out;
}

export interface LaunchOptions {
  /** --nproc from the command line (wins over distributed.nproc). */
  nproc?: number;
  log: (line: string) => void;
  /** The command line to give the workers (default: this process's, without --nproc). */
  argv?: readonly string[];
}

/**
 * Starts this node's workers when the job has more than one process and this process is not a worker
 * already; resolves true once every worker has finished (false: run the stage in this process).
 */
export async function launchWorkers(distributedConfig: DistributedConfig, opts: LaunchOptions): Promise<boolean> {
  if (distEnvFrom(process.env)) return false;
  const nproc = opts.nproc ?? distributedConfig.nproc;
  if (!Number.isInteger(nproc) || nproc < 1) throw new SlmError('ARGUMENT_INVALID', `--nproc must be a positive integer, found ${nproc}.`);
  const world = nproc * distributedConfig.nnodes;
  if (world <= 1) return false;
  if (distributedConfig.node_rank >= distributedConfig.nnodes)
    throw new SlmError(
      'CONFIG_INVALID',
      `distributed.node_rank ${distributedConfig.node_rank} must be below distributed.nnodes ${distributedConfig.nnodes}.`,
      { path: 'distributed.node_rank' },
    );
  const addr = process.env.MASTER_ADDR || distributedConfig.master_addr;
  let port = Number(process.env.MASTER_PORT || distributedConfig.master_port);
  if (!port) {
    if (distributedConfig.nnodes > 1)
      throw new SlmError(
        'CONFIG_INVALID',
        'several nodes need a fixed rendezvous port: set MASTER_PORT (or distributed.master_port) to the same value on every node.',
        { path: 'distributed.master_port' },
      );
    port = await freePort();
  }
  const argv = opts.argv ?? workerArgs(process.argv.slice(1));
  const first = distributedConfig.node_rank * nproc;
  opts.log(`distributed: starting ranks ${first}..${first + nproc - 1} of ${world} on this node (rendezvous ${addr}:${port})`);
  const procs: ChildProcess[] = [];
  let failure: string | null = null;
  const stopAll = (except?: ChildProcess) => {
    for (const p of procs) if (p !== except && p.exitCode === null && p.signalCode === null) p.kill('SIGTERM');
    const t = setTimeout(() => procs.forEach((p) => p.exitCode === null && p.signalCode === null && p.kill('SIGKILL')), 10_000);
    t.unref();
  };
  const exits = Array.from({ length: nproc }, (_, local) => {
    const rank = first + local;
    const p = spawn(process.execPath, argv, {
      env: {
        ...process.env,
        RANK: String(rank),
        WORLD_SIZE: String(world),
        LOCAL_RANK: String(local),
        LOCAL_WORLD_SIZE: String(nproc),
        MASTER_ADDR: addr,
        MASTER_PORT: String(port),
      },
      stdio: ['ignore', rank === 0 ? 'inherit' : 'ignore', 'pipe'],
    });
    procs.push(p);
    let tail = '';
    let partial = '';
    p.stderr!.setEncoding('utf8'); // whole characters, even when a chunk ends inside one
    p.stderr!.on('data', (d: string) => {
      const lines = (partial + d).split('\n');
      partial = lines.pop() ?? '';
      for (const l of lines) process.stderr.write(`[rank ${rank}] ${l}\n`);
      tail = (tail + d).slice(-2000);
    });
    return new Promise<void>((res) =>
      p.on('exit', (code, sig) => {
        if (partial) process.stderr.write(`[rank ${rank}] ${partial}\n`);
        if ((code !== 0 || sig) && !failure) {
          const why =
            tail
              .trim()
              .split('\n')
              .filter((l) => /error|Error/.test(l))
              .slice(-1)[0] ??
            tail.trim().split('\n').slice(-1)[0] ??
            '';
          failure = `rank ${rank} exited with ${sig ?? `code ${code}`}${why ? `: ${why.trim()}` : ''}`;
          stopAll(p);
        }
        res();
      }),
    );
  });
  const onSignal = () => stopAll();
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    await Promise.all(exits);
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
  if (failure) throw new SlmError('DISTRIBUTED_FAILED', `${failure}; the other ranks were stopped. See the [rank N] lines above.`);
  return true;
}

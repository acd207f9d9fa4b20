import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { repoRoot } from './shared.js';

/** Runs the built CLI (`npm test` compiles it first through pretest). */
export function runCli(args: string[], opts: { input?: string; env?: Record<string, string>; timeout?: number } = {}) {
  const r = spawnSync(process.execPath, [join(repoRoot, 'bin', 'slm-train.js'), ...args], {
    encoding: 'utf8',
    input: opts.input,
    env: { ...process.env, ...opts.env },
    timeout: opts.timeout ?? 120_000,
    maxBuffer: 256 << 20,
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

import { spawn, spawnSync } from 'node:child_process';
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

/** Like runCli, but without blocking the event loop (for tests that serve something the CLI calls). */
export function runCliAsync(
  args: string[],
  opts: { env?: Record<string, string>; timeout?: number; cwd?: string } = {},
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolvePromise) => {
    const p = spawn(process.execPath, [join(repoRoot, 'bin', 'slm-train.js'), ...args], {
      env: { ...process.env, ...opts.env },
      cwd: opts.cwd,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (c) => (stdout += c));
    p.stderr.on('data', (c) => (stderr += c));
    const timer = setTimeout(() => p.kill('SIGKILL'), opts.timeout ?? 300_000);
    p.on('close', (code) => {
      clearTimeout(timer);
      resolvePromise({ code, stdout, stderr });
    });
  });
}

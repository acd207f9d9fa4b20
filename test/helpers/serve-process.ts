import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { repoRoot } from './shared.js';

/** Resolves once `ok()` holds (polled every 10 ms); throws after `ms`. */
export async function until(ok: () => boolean, what: string, ms = 120_000): Promise<void> {
  const end = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** A memory figure of /proc/<pid>/status (VmRSS, VmHWM...) in MiB. */
export function procMiB(pid: number, field: 'VmRSS' | 'VmHWM'): number {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!m) throw new Error(`no ${field} in /proc/${pid}/status`);
  return Number(m[1]) / 1024;
}

/**
 * `slm-train serve --port 0 ...args` in a child process (the built CLI: dist/, which `npm test`'s
 * pretest compiles), listening on 127.0.0.1; SIGKILLed at the end of the test if still alive.
 */
export async function serveProcess(t: { teardown(f: () => unknown): void }, args: string[]) {
  const p = spawn(process.execPath, [join(repoRoot, 'bin', 'slm-train.js'), 'serve', '--port', '0', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  p.stdout.on('data', (d) => (out += d));
  p.stderr.on('data', (d) => (err = (err + d).slice(-20_000)));
  const exited = new Promise<{ code: number | null; signal: string | null }>((r) => p.on('exit', (code, signal) => r({ code, signal })));
  t.teardown(() => {
    if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  });
  const listening = /on http:\/\/127\.0\.0\.1:(\d+)\/v1/;
  await until(() => listening.test(out) || p.exitCode !== null, 'the server to listen', 60_000);
  if (!listening.test(out)) throw new Error(`serve exited ${p.exitCode}: ${err.slice(-2000)}`);
  return { p, pid: p.pid as number, port: Number(listening.exec(out)![1]), exited, stderr: () => err, stdout: () => out };
}

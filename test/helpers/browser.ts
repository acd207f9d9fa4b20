// A headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe: the
// browser reads NUL-terminated JSON commands on fd 3 and writes replies and events on fd 4), so no
// websocket client is needed. Used to open the HTML run report and check what its script did.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Readable, Writable } from 'node:stream';

/** Debian's chromium (what CI installs), or another Chrome on PATH; undefined when there is none. */
export function findChromium(): string | undefined {
  for (const c of ['/usr/bin/chromium', '/usr/bin/chromium-browser', '/usr/bin/google-chrome', 'chromium', 'google-chrome']) {
    if (c.startsWith('/') ? existsSync(c) : spawnSync('which', [c]).status === 0) return c;
  }
  return undefined;
}

type Msg = {
  id?: number;
  method?: string;
  params?: Record<string, unknown>;
  result?: Record<string, unknown>;
  error?: { message: string };
  sessionId?: string;
};

/** An open page: evaluate expressions in it, screenshot it. */
export interface Page {
  /** Value of `expression` (awaited when it is a promise); throws on an exception in it. */
  evaluate(expression: string): Promise<unknown>;
  /** Resizes the viewport to the whole document (at the current width), so one screenshot shows everything. */
  fitToContent(): Promise<{ width: number; height: number }>;
  /** PNG of the viewport, at 1 device pixel per CSS pixel. */
  screenshot(): Promise<Buffer>;
  /** console.error/warn calls, uncaught exceptions and browser log errors so far. */
  errors: string[];
}

/** Opens `url` in a fresh headless Chromium (viewport `width` x `height`, default 1280 x 900), waits for its load event, runs `fn`. */
export async function withPage<T>(
  binary: string,
  url: string,
  fn: (page: Page) => Promise<T>,
  o: { timeoutMs?: number; width?: number; height?: number } = {},
): Promise<T> {
  const timeoutMs = o.timeoutMs ?? 60_000;
  const width = o.width ?? 1280;
  const profile = mkdtempSync(join(tmpdir(), 'slm-chromium-'));
  const args = [
    '--headless=new',
    '--remote-debugging-pipe',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-dev-shm-usage',
    '--no-first-run',
    '--no-default-browser-check',
    '--disable-extensions',
    `--user-data-dir=${profile}`,
    'about:blank',
  ];
  // Its own process group, so that cleaning up ends its helper processes (zygote, crash handler) too.
  const proc: ChildProcess = spawn(binary, args, { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'], detached: true });
  let stderr = '';
  proc.stderr!.on('data', (c) => (stderr += c));
  const toBrowser = proc.stdio[3] as Writable;
  const fromBrowser = proc.stdio[4] as Readable;
  const pending = new Map<number, { resolve: (m: Msg) => void; reject: (e: Error) => void }>();
  const listeners: Array<(m: Msg) => void> = [];
  let buf = '';
  let nextId = 1;
  let failed: Error | undefined;
  const fail = (e: Error) => {
    failed ??= e;
    for (const p of pending.values()) p.reject(e);
    pending.clear();
  };
  fromBrowser.on('data', (chunk: Buffer) => {
    buf += chunk.toString('utf8');
    let i: number;
    while ((i = buf.indexOf('\0')) >= 0) {
      const m = JSON.parse(buf.slice(0, i)) as Msg;
      buf = buf.slice(i + 1);
      if (m.id !== undefined && pending.has(m.id)) {
        const p = pending.get(m.id)!;
        pending.delete(m.id);
        if (m.error) p.reject(new Error(m.error.message));
        else p.resolve(m);
      } else for (const l of listeners) l(m);
    }
  });
  proc.on('exit', (code) => fail(new Error(`chromium exited (${code}) before the check finished: ${stderr.slice(-2000)}`)));
  proc.on('error', (e) => fail(e));
  const send = (method: string, params: Record<string, unknown> = {}, sessionId?: string): Promise<Record<string, unknown>> =>
    new Promise((resolve, reject) => {
      if (failed) return reject(failed);
      const id = nextId++;
      pending.set(id, { resolve: (m) => resolve(m.result ?? {}), reject });
      toBrowser.write(JSON.stringify({ id, method, params, ...(sessionId ? { sessionId } : {}) }) + '\0');
    });
  const timer = setTimeout(() => fail(new Error(`chromium: no result within ${timeoutMs} ms; stderr: ${stderr.slice(-2000)}`)), timeoutMs);
  try {
    const { targetId } = await send('Target.createTarget', { url: 'about:blank' });
    const { sessionId } = (await send('Target.attachToTarget', { targetId, flatten: true })) as { sessionId: string };
    const errors: string[] = [];
    let loaded: () => void = () => {};
    const load = new Promise<void>((r) => (loaded = r));
    listeners.push((m) => {
      if (m.sessionId !== sessionId || !m.params) return;
      const p = m.params as Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any
      if (m.method === 'Page.loadEventFired') loaded();
      if (m.method === 'Runtime.consoleAPICalled' && (p.type === 'error' || p.type === 'warning' || p.type === 'assert'))
        errors.push(
          `console.${p.type}: ${(p.args ?? []).map((a: { value?: unknown; description?: string }) => a.value ?? a.description).join(' ')}`,
        );
      if (m.method === 'Runtime.exceptionThrown')
        errors.push(`exception: ${p.exceptionDetails?.exception?.description ?? p.exceptionDetails?.text}`);
      if (m.method === 'Log.entryAdded' && (p.entry?.level === 'error' || p.entry?.level === 'warning'))
        errors.push(`log ${p.entry.level}: ${p.entry.text}`);
    });
    await send('Runtime.enable', {}, sessionId);
    await send('Log.enable', {}, sessionId);
    await send('Page.enable', {}, sessionId);
    await send('Emulation.setDeviceMetricsOverride', { width, height: o.height ?? 900, deviceScaleFactor: 1, mobile: false }, sessionId);
    await send('Page.navigate', { url }, sessionId);
    await Promise.race([load, new Promise((_, reject) => proc.on('exit', () => reject(failed)))]);
    await new Promise((r) => setTimeout(r, 300)); // late console messages
    const evaluate = async (expression: string): Promise<unknown> => {
      const r = (await send('Runtime.evaluate', { expression, returnByValue: true, awaitPromise: true }, sessionId)) as {
        result?: { value?: unknown };
        exceptionDetails?: { text: string; exception?: { description?: string } };
      };
      if (r.exceptionDetails)
        throw new Error(`evaluating in the page failed: ${r.exceptionDetails.exception?.description ?? r.exceptionDetails.text}`);
      return r.result?.value;
    };
    const page: Page = {
      evaluate,
      errors,
      async fitToContent() {
        const h = Math.ceil(Number(await evaluate('Math.max(document.documentElement.scrollHeight, document.body.scrollHeight)')));
        await send('Emulation.setDeviceMetricsOverride', { width, height: h, deviceScaleFactor: 1, mobile: false }, sessionId);
        await evaluate('new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(() => setTimeout(r, 200))))');
        return { width, height: h };
      },
      async screenshot() {
        const r = (await send('Page.captureScreenshot', { format: 'png' }, sessionId)) as { data: string };
        return Buffer.from(r.data, 'base64');
      },
    };
    const value = await fn(page);
    await send('Browser.close').catch(() => {});
    return value;
  } finally {
    clearTimeout(timer);
    const exited = new Promise((r) => (proc.exitCode !== null || proc.signalCode !== null ? r(null) : proc.once('exit', r)));
    try {
      process.kill(-proc.pid!, 'SIGKILL'); // the whole group, even after the main process closed
    } catch {
      /* already gone */
    }
    await exited;
    // A helper may still be writing into the profile for a moment (seen in CI: ENOTEMPTY on rmdir).
    rmSync(profile, { recursive: true, force: true, maxRetries: 20, retryDelay: 50 });
  }
}

/**
 * Load test of `slm-train serve-retriever` (part of `slm-train bench retrieval`): the server runs in
 * its own process over a saved index, and C concurrent clients (C = 1, 8, 64) each send one-query
 * POST /retrieve requests back to back for a fixed time, over kept-alive connections (node:http with a
 * keep-alive agent, one socket per client, as a trainer's pooled client holds them; lighter on the
 * shared CPU than fetch). Reported per level: requests/s and latency
 * p50/p99 — next to the in-process search rate of the same index measured in the same run (the
 * ceiling a one-threaded server can reach), so the cost of HTTP and JSON is visible.
 */
import { spawn } from 'node:child_process';
import { Agent, request } from 'node:http';
import { join } from 'node:path';
import { packageRoot } from '../lib/binding/index.js';
import { SlmError } from '../lib/errors.js';
import { summarize, type Latency } from './sandbox.js';

export interface LoadLevel extends Latency {
  clients: number;
  requests_per_s: number;
  errors: number;
}

/** Starts `slm-train serve-retriever --index DIR --port 0` and resolves with its URL and a stop function. */
async function startServer(indexDir: string): Promise<{ url: string; stop: () => Promise<void> }> {
  const p = spawn(
    process.execPath,
    [join(packageRoot(), 'bin', 'slm-train.js'), 'serve-retriever', '--index', indexDir, '--port', '0', '--topk', '3'],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let err = '';
  p.stderr.on('data', (c) => (err += c));
  const url = await new Promise<string>((resolve, reject) => {
    let out = '';
    p.stdout.on('data', (c) => {
      out += c;
      const m = /on (http:\/\/\S+\/retrieve)/.exec(out);
      if (m) resolve(m[1]);
    });
    p.on('error', (e) => reject(new SlmError('RETRIEVER_UNAVAILABLE', `bench: could not start slm-train serve-retriever: ${e.message}`)));
    p.on('exit', (code) =>
      reject(
        new SlmError(
          'RETRIEVER_UNAVAILABLE',
          `bench: slm-train serve-retriever exited with code ${code} before serving: ${err.slice(-500)}`,
        ),
      ),
    );
  });
  const stop = () =>
    new Promise<void>((r) => {
      if (p.exitCode !== null || p.signalCode !== null) return r();
      p.once('exit', () => r());
      p.kill('SIGTERM');
    });
  return { url, stop };
}

export async function loadTest(
  indexDir: string,
  queries: string[],
  o: { levels: number[]; seconds: number; log?: (s: string) => void },
): Promise<LoadLevel[]> {
  const server = await startServer(indexDir);
  const out: LoadLevel[] = [];
  const agent = new Agent({ keepAlive: true, maxSockets: Math.max(...o.levels) });
  try {
    let next = 0;
    const post = (body: string) =>
      new Promise<{ status: number; text: string }>((resolve, reject) => {
        const req = request(
          server.url,
          { method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } },
          (res) => {
            const parts: Buffer[] = [];
            res.on('data', (c: Buffer) => parts.push(c));
            res.on('end', () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(parts).toString('utf8') }));
            res.on('error', reject);
          },
        );
        req.on('error', reject);
        req.end(body);
      });
    const ask = async () => {
      const q = queries[next++ % queries.length];
      const r = await post(JSON.stringify({ queries: [q], topk: 3, return_scores: true }));
      const body = JSON.parse(r.text) as { result?: unknown[] };
      if (r.status !== 200 || !Array.isArray(body.result) || body.result.length !== 1) throw new Error(`HTTP ${r.status}`);
    };
    for (let i = 0; i < 20; i++) await ask(); // warm-up
    for (const clients of o.levels) {
      const ms: number[] = [];
      let errors = 0;
      const t0 = performance.now();
      const end = t0 + o.seconds * 1000;
      await Promise.all(
        Array.from({ length: clients }, async () => {
          while (performance.now() < end) {
            const s = performance.now();
            try {
              await ask();
              ms.push(performance.now() - s);
            } catch {
              errors++;
            }
          }
        }),
      );
      const wall = (performance.now() - t0) / 1e3;
      const level = { clients, ...summarize(ms), requests_per_s: +(ms.length / wall).toFixed(1), errors };
      out.push(level);
      o.log?.(`retrieval: serve-retriever, ${clients} clients: ${level.requests_per_s} requests/s, p99 ${level.p99_ms} ms`);
    }
  } finally {
    agent.destroy();
    await server.stop();
  }
  return out;
}

/**
 * `slm-train bench serve` (issue 30 item 6): `slm-train serve`'s OpenAI server under concurrent
 * streaming clients, beside the engine's batched decode rate measured in the same run.
 *
 * - The server: OpenAIServer over the `small` preset (random init, as `bench engine` builds it; or
 *   --model), float32 and the default thread count as `bench engine`, in a process of its own
 *   (bench/serve-child.ts) on 127.0.0.1, port 0, so that the clients' event loop does not share the
 *   server's thread (the machine's cores it does share).
 * - The limit: the engine's decode rate at batch 16 (and 1), Model.generate in the server's process
 *   with no request running — 16 rows of 32-token prompts, the decode time per step after the first,
 *   median over repetitions: the figure `bench engine` gives as "decode float32 batch 16" — measured
 *   before and again after the clients, the better of the two kept (a limit taken in a dip of a
 *   shared machine would flatter the fraction beside it).
 * - The clients (bench/serve-load.ts): 1 and 16 concurrent clients, each sending R streaming
 *   `/v1/completions` requests back to back (32-token token-id prompts distinct per request,
 *   max_tokens N, ignore_eos, temperature 1 with a seed); then 16 clients whose first requests are
 *   staggered over about one request's duration (seeded random delays), so that rows arrive while
 *   others decode. Per level: generated tokens / wall time, its fraction of the engine's decode rate
 *   at the batch it offers (1 or 16; the issue's target: ≥ 0.8 at 16 clients), TTFT and ITL p50/p99,
 *   and the server's decode-session counters over the level (rows that joined a running decode, the
 *   most rows in one step, the mean rows per step).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { serverAllocatorEnv } from '../lib/engine/runtime.js';
import type { SessionStats } from '../lib/engine/session.js';
import { SlmError } from '../lib/errors.js';
import { hashUniform } from '../lib/util/hash.js';
import { benchModelDir } from './engine.js';
import { levelFigures, runLevel, type LevelFigures } from './serve-load.js';
import { median } from './stats.js';
import type { BenchOptions, BenchReport } from './types.js';

export interface ServeBenchOptions {
  /** The model folder the server serves. */
  dir: string;
  /** Concurrent clients per level; a level with stagger: true starts its clients at random delays. */
  levels: Array<{ clients: number; stagger?: boolean }>;
  requestsPerClient: number;
  maxTokens: number;
  promptTokens?: number;
  /** The limit's decode steps and repetitions (Model.generate at batch 1 and 16). */
  limitSteps: number;
  limitReps: number;
  /** Alternated rounds at 16 clients after the levels (16 clients, then the batch-16 decode; 0: none). */
  rounds?: number;
  log?: (line: string) => void;
}

export interface EngineRate {
  batch: number;
  step_ms: number;
  tokens_per_s: number;
}

export interface ServeLevel extends LevelFigures {
  clients: number;
  /** The longest random delay before a client's first request (0: all at once). */
  stagger_ms: number;
  errors: number;
  /** The engine decode rate this level is set beside: the measured batch nearest below its clients. */
  limit_batch: number;
  limit_tokens_per_s: number;
  fraction_of_limit: number;
  /** The server's decode sessions that ended during the level, summed. */
  server: {
    sessions: number;
    rows: number;
    joined: number;
    max_batch: number;
    steps: number;
    mean_rows_per_step: number;
    prefill_tokens: number;
    prefill_s: number;
    decode_s: number;
  };
}

/** One alternated round: 16 clients, set beside the batch-16 decode measured just before and just after them. */
export interface ServeRound {
  tokens: number;
  tokens_per_s: number;
  errors: number;
  /** The batch-16 decode rate measured before and after the clients (tok/s). */
  limit_tokens_per_s: [number, number];
  /** tokens_per_s over the better of the two. */
  fraction_of_limit: number;
  ttft_p50_ms: number;
  itl_p50_ms: number;
}

/**
 * A round's figures: its clients' rate over the better of the decode rates measured around it (the
 * main figure's rule: a limit caught in a dip would flatter the fraction).
 */
export function serveRound(fig: LevelFigures, errors: number, before: number, after: number): ServeRound {
  const lim = Math.max(before, after);
  return {
    tokens: fig.tokens,
    tokens_per_s: fig.tokens_per_s,
    errors,
    limit_tokens_per_s: [+before.toFixed(1), +after.toFixed(1)],
    fraction_of_limit: +(fig.tokens_per_s / lim).toFixed(3),
    ttft_p50_ms: fig.ttft_ms.p50_ms,
    itl_p50_ms: fig.itl_ms.p50_ms,
  };
}

export interface ServeBenchResults {
  model: { dir: string; dtype: string; threads: number; parameters: number; cpuCache: string };
  server_process: 'own process';
  prompt_tokens: number;
  max_tokens: number;
  requests_per_client: number;
  engine_decode: EngineRate[];
  levels: ServeLevel[];
  /** Alternated rounds at 16 clients (their fractions' median: the target's rounds_median). */
  rounds: ServeRound[];
  target: {
    clients: number;
    fraction_of_batch_16_decode: number;
    measured: number | null;
    met: boolean | null;
    /** The median of the rounds' fractions (null: no rounds). */
    rounds_median: number | null;
  };
  errors_sample: string[];
}

interface Ready {
  port: number;
  threads: number;
  dtype: string;
  parameters: number;
  /** The server process's CPU tensor allocator (version().cpuCache). */
  cpuCache: string;
}

/** bench/serve-child.ts as a child with an IPC channel: compiled beside this file, or from source under this process's TypeScript loader. */
function startChild(dir: string, maxBatch: number): { p: ChildProcess; ready: Promise<Ready>; stderr: () => string } {
  const js = fileURLToPath(new URL('./serve-child.js', import.meta.url));
  const args = existsSync(js)
    ? [js]
    : [...process.execArgv.filter((a) => a.startsWith('--import')), fileURLToPath(new URL('./serve-child.ts', import.meta.url))];
  const env = serverAllocatorEnv({ ...process.env }); // the allocator `slm-train serve` uses
  const p = spawn(process.execPath, [...args, JSON.stringify({ dir, maxBatch })], { stdio: ['ignore', 'ignore', 'pipe', 'ipc'], env });
  let err = '';
  p.stderr?.on('data', (c) => (err = (err + c).slice(-4000)));
  const ready = new Promise<Ready>((resolve, reject) => {
    p.on('message', (m: { ready?: Ready }) => m.ready && resolve(m.ready));
    p.on('error', (e) => reject(new SlmError('NATIVE_ERROR', `bench serve: could not start the server process: ${e.message}`)));
    p.on('exit', (code, signal) =>
      reject(
        new SlmError('NATIVE_ERROR', `bench serve: the server process exited (${code ?? signal}) before serving: ${err.slice(-1500)}`),
      ),
    );
  });
  return { p, ready, stderr: () => err };
}

/** One request to the server process over IPC, answered by its id. */
function ask<T>(p: ChildProcess, id: number, q: Record<string, unknown>, stderr: () => string): Promise<T> {
  return new Promise((resolve, reject) => {
    const onMessage = (m: { id?: number; error?: string }) => {
      if (m.id !== id) return;
      p.off('message', onMessage);
      p.off('exit', onExit);
      if (m.error) reject(new SlmError('NATIVE_ERROR', `bench serve: the server process failed on ${q.cmd}: ${m.error}`));
      else resolve(m as T);
    };
    const onExit = (code: number | null) => {
      p.off('message', onMessage);
      reject(new SlmError('NATIVE_ERROR', `bench serve: the server process exited (${code}) during ${q.cmd}: ${stderr().slice(-1500)}`));
    };
    if (!p.connected) return onExit(p.exitCode);
    p.on('message', onMessage);
    p.once('exit', onExit);
    p.send({ id, ...q }, (e) => e && onExit(p.exitCode));
  });
}

/** The sessions' counters summed (max_batch: the most). */
export function sessionTotals(ss: SessionStats[], tokens: number): ServeLevel['server'] {
  const sum = (f: (s: SessionStats) => number) => ss.reduce((a, s) => a + f(s), 0);
  const steps = sum((s) => s.steps);
  return {
    sessions: ss.length,
    rows: sum((s) => s.rows),
    joined: sum((s) => s.joined),
    max_batch: ss.reduce((a, s) => Math.max(a, s.maxBatch), 0),
    steps,
    mean_rows_per_step: steps ? +(tokens / steps).toFixed(2) : 0,
    prefill_tokens: sum((s) => s.prefillTokens),
    prefill_s: +sum((s) => s.prefillSeconds).toFixed(3),
    decode_s: +sum((s) => s.decodeSeconds).toFixed(3),
  };
}

const clientsText = (n: number) => `${n} client${n === 1 ? '' : 's'}`;

export async function serveBench(o: ServeBenchOptions): Promise<ServeBenchResults> {
  const log = o.log ?? (() => {});
  const T = o.promptTokens ?? 32;
  const maxClients = Math.max(...o.levels.map((l) => l.clients));
  const child = startChild(o.dir, Math.max(32, maxClients));
  let id = 0;
  const call = <R>(q: Record<string, unknown>) => ask<R>(child.p, ++id, q, child.stderr);
  try {
    const ready = await child.ready;
    const url = `http://127.0.0.1:${ready.port}/v1/completions`;
    const batches = [1, 16];
    const limit = async () =>
      (await call<{ rates: EngineRate[] }>({ cmd: 'limit', batches, steps: o.limitSteps, reps: o.limitReps, promptTokens: T })).rates;
    log(`serve: engine decode at batch ${batches.join(' and ')} in the server's process (${ready.threads} threads, ${ready.dtype})`);
    const before = await limit();
    // Warm-up: one short request through the server (not counted).
    await runLevel(url, {
      clients: 1,
      staggerMs: 0,
      requestsPerClient: 1,
      maxTokens: 4,
      promptTokens: T,
      level: 0,
      model: 'bench',
      delay: () => 0,
    });
    const raw: Array<{
      spec: (typeof o.levels)[number];
      staggerMs: number;
      run: Awaited<ReturnType<typeof runLevel>>;
      ss: SessionStats[];
    }> = [];
    for (const [i, spec] of o.levels.entries()) {
      // Staggered: over about one request's duration at batch 16, so that rows arrive while others decode.
      const step16 = before.find((r) => r.batch === 16)?.step_ms ?? 0;
      const staggerMs = spec.stagger ? Math.round(o.maxTokens * step16) : 0;
      const { count } = await call<{ count: number }>({ cmd: 'stats', since: Number.MAX_SAFE_INTEGER });
      log(
        `serve: ${clientsText(spec.clients)}${staggerMs ? `, staggered over ${staggerMs} ms` : ''}, ${o.requestsPerClient} requests each`,
      );
      const run = await runLevel(url, {
        clients: spec.clients,
        staggerMs,
        requestsPerClient: o.requestsPerClient,
        maxTokens: o.maxTokens,
        promptTokens: T,
        level: i + 1,
        model: 'bench',
        delay: (c) => hashUniform(i + 1, c),
      });
      const { sessions } = await call<{ sessions: SessionStats[] }>({ cmd: 'stats', since: count });
      raw.push({ spec, staggerMs, run, ss: sessions });
    }
    log('serve: engine decode again (each rate: the better of the two measurements)');
    const after = await limit();
    const rates = before.map((b) => {
      const a = after.find((x) => x.batch === b.batch);
      return a && a.tokens_per_s > b.tokens_per_s ? a : b;
    });
    const levels: ServeLevel[] = raw.map(({ spec, staggerMs, run, ss }) => {
      const fig = levelFigures(run.timings, run.wallS);
      const lim = [...rates].reverse().find((r) => r.batch <= spec.clients) ?? rates[0];
      return {
        clients: spec.clients,
        stagger_ms: staggerMs,
        ...fig,
        errors: run.errors.length,
        limit_batch: lim.batch,
        limit_tokens_per_s: +lim.tokens_per_s.toFixed(1),
        fraction_of_limit: +(fig.tokens_per_s / lim.tokens_per_s).toFixed(3),
        server: sessionTotals(ss, fig.tokens),
      };
    });
    // Alternated rounds at the target's 16 clients: on a shared machine the decode rate moves within
    // a run, and a level set beside limits measured a minute away can catch a dip on either side;
    // each round's clients are set beside the batch-16 decode measured just before and just after
    // them (the better of the two), and the median of the rounds' fractions is reported beside the
    // main figure.
    const rounds: ServeRound[] = [];
    const roundErrors: string[] = [];
    let prev = after.find((r) => r.batch === 16)?.tokens_per_s;
    for (let k = 0; k < (o.rounds ?? 0) && prev !== undefined; k++) {
      log(`serve: round ${k + 1} of ${o.rounds}: 16 clients, then the batch-16 decode`);
      const run = await runLevel(url, {
        clients: 16,
        staggerMs: 0,
        requestsPerClient: o.requestsPerClient,
        maxTokens: o.maxTokens,
        promptTokens: T,
        level: o.levels.length + 1 + k,
        model: 'bench',
        delay: () => 0,
      });
      const next = (
        await call<{ rates: EngineRate[] }>({ cmd: 'limit', batches: [16], steps: o.limitSteps, reps: o.limitReps, promptTokens: T })
      ).rates[0].tokens_per_s;
      rounds.push(serveRound(levelFigures(run.timings, run.wallS), run.errors.length, prev, next));
      roundErrors.push(...run.errors);
      prev = next;
    }
    const roundsMedian = rounds.length ? +median(rounds.map((r) => r.fraction_of_limit)).toFixed(3) : null;
    if (roundsMedian !== null)
      log(`serve: rounds at 16 clients: ${rounds.map((r) => r.fraction_of_limit).join(', ')} (median ${roundsMedian})`);
    for (const l of levels)
      log(
        `serve: ${clientsText(l.clients)}${l.stagger_ms ? ' staggered' : ''}: ${l.tokens_per_s} tok/s (${l.fraction_of_limit} of decode batch ${l.limit_batch}), TTFT p50 ${l.ttft_ms.p50_ms} ms, ITL p50 ${l.itl_ms.p50_ms} ms`,
      );
    const at16 = levels.find((l) => l.clients === 16 && !l.stagger_ms);
    return {
      model: { dir: o.dir, dtype: ready.dtype, threads: ready.threads, parameters: ready.parameters, cpuCache: ready.cpuCache },
      server_process: 'own process',
      prompt_tokens: T,
      max_tokens: o.maxTokens,
      requests_per_client: o.requestsPerClient,
      engine_decode: rates.map((r) => ({ batch: r.batch, step_ms: +r.step_ms.toFixed(2), tokens_per_s: +r.tokens_per_s.toFixed(1) })),
      levels,
      rounds,
      target: {
        clients: 16,
        fraction_of_batch_16_decode: 0.8,
        measured: at16 ? at16.fraction_of_limit : null,
        met: at16 ? at16.fraction_of_limit >= 0.8 : null,
        rounds_median: roundsMedian,
      },
      errors_sample: [...raw.flatMap((r) => r.run.errors), ...roundErrors].slice(0, 5),
    };
  } finally {
    if (child.p.exitCode === null && child.p.signalCode === null) {
      const exited = new Promise<void>((r) => child.p.once('exit', () => r()));
      const quit = call({ cmd: 'quit' }).catch(() => {});
      const killed = setTimeout(() => child.p.kill('SIGKILL'), 30_000);
      await Promise.race([quit.then(() => exited), exited]);
      clearTimeout(killed);
    }
  }
}

const f2 = (x: number) => (Number.isFinite(x) ? x.toFixed(2) : '–');

/** The markdown table of a run. */
export function serveTable(r: ServeBenchResults, dirName: string): string {
  const rate = (B: number) => r.engine_decode.find((e) => e.batch === B);
  return [
    `Serving: \`slm-train serve\`'s OpenAI server (its own process, 127.0.0.1) on ${dirName}, ${r.model.dtype}, ${r.model.threads} threads; streaming /v1/completions, ${r.prompt_tokens}-token prompts, max_tokens ${r.max_tokens}, ignore_eos, temperature 1, ${r.requests_per_client} requests per client back to back on kept-alive connections; the limit: the engine's decode (Model.generate in the server's process, ${r.prompt_tokens}-token prompts) in the same run, the better of before and after the clients. tokens/s: every request's tokens over the level's wall time (staggered: its delays included); ITL: the gaps between stream reads that brought tokens, each split over its tokens; the clients share the machine's cores with the server. Target (issue 30): 16 clients ≥ ${r.target.fraction_of_batch_16_decode} of the batch-16 decode${r.target.measured === null ? '' : ` (measured ${r.target.measured})`}.`,
    '',
    '| clients | tokens/s | engine decode (same run) | fraction | TTFT p50 / p99 ms | ITL p50 / p99 ms | server: rows joined running / most rows in a step / mean rows per step | errors |',
    '|---|---:|---:|---:|---:|---:|---:|---:|',
    ...r.levels.map(
      (l) =>
        `| ${l.clients}${l.stagger_ms ? `, staggered over ${(l.stagger_ms / 1e3).toFixed(1)} s` : ''} | ${l.tokens_per_s} | batch ${l.limit_batch}: ${l.limit_tokens_per_s} tok/s (${rate(l.limit_batch)?.step_ms} ms/step) | ${l.fraction_of_limit} | ${f2(l.ttft_ms.p50_ms)} / ${f2(l.ttft_ms.p99_ms)} | ${f2(l.itl_ms.p50_ms)} / ${f2(l.itl_ms.p99_ms)} | ${l.server.joined} of ${l.server.rows} / ${l.server.max_batch} / ${l.server.mean_rows_per_step} | ${l.errors} |`,
    ),
    ...(r.rounds.length
      ? [
          '',
          `Alternated rounds at 16 clients (each beside the better of the batch-16 decodes measured just before and just after it): ${r.rounds
            .map((x) => `${x.fraction_of_limit} (${x.tokens_per_s} tok/s against ${x.limit_tokens_per_s.join(' / ')})`)
            .join(', ')}; median ${r.target.rounds_median}.`,
        ]
      : []),
  ].join('\n');
}

export async function runBench(opts: BenchOptions = {}): Promise<BenchReport> {
  const quick = !!opts.quick;
  const dir = opts.model ?? (await benchModelDir('small', opts.log));
  const results = await serveBench({
    dir,
    levels: [{ clients: 1 }, { clients: 16 }, { clients: 16, stagger: true }],
    requestsPerClient: quick ? 2 : 3,
    maxTokens: quick ? 32 : 128,
    limitSteps: quick ? 16 : 48,
    limitReps: quick ? 2 : 3,
    rounds: opts.rounds ?? (quick ? 1 : 3),
    log: opts.log,
  });
  return {
    kind: 'serve',
    results: results as unknown as Record<string, unknown>,
    table: serveTable(results, opts.model ? dir : 'the small preset'),
  };
}

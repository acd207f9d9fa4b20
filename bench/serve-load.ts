/**
 * The clients of `slm-train bench serve` and what they measure. Each client holds one kept-alive
 * connection (node:http with a keep-alive agent, as retriever-server's load test) and sends streaming
 * `/v1/completions` requests back to back; per request it records when it was sent and when each
 * read of the stream brought tokens, and how many (the chunks carry `usage` with
 * `stream_options.continuous_usage_stats`, so a chunk whose text held back a token — an incomplete
 * UTF-8 sequence, a token with no text — is counted when its tokens arrive, not as a token each).
 *
 * - time to first token (TTFT): from the request's send to the first read that brought a token;
 * - inter-token latency (ITL): the gap between two reads that brought tokens, split evenly over the
 *   tokens of the later one (k tokens in one read: k gaps of gap / k, as sglang's bench_serving
 *   counts them); tokens that came with the first token add no gap (they are in its TTFT), so a
 *   request of N tokens in one read each gives N - 1 gaps, which sum to its last token's time minus
 *   its first's.
 */
import { Agent, request } from 'node:http';
import { summarize, type Latency } from './sandbox.js';

/** A read of a response stream that brought tokens: when (performance.now(), ms) and how many. */
export interface Arrival {
  t: number;
  tokens: number;
}

export interface RequestTiming {
  ttft_ms: number;
  /** From the send to the stream's end. */
  total_ms: number;
  tokens: number;
  itl_ms: number[];
}

/** One request's TTFT, ITL gaps and tokens from its send time, its arrivals (in order) and its end. */
export function requestTiming(sentAt: number, arrivals: Arrival[], endAt: number): RequestTiming {
  const got = arrivals.filter((a) => a.tokens > 0);
  const itl: number[] = [];
  for (let i = 1; i < got.length; i++) {
    const gap = (got[i].t - got[i - 1].t) / got[i].tokens;
    for (let k = 0; k < got[i].tokens; k++) itl.push(gap);
  }
  return {
    ttft_ms: got.length ? got[0].t - sentAt : Number.NaN,
    total_ms: endAt - sentAt,
    tokens: got.reduce((a, x) => a + x.tokens, 0),
    itl_ms: itl,
  };
}

export interface LevelFigures {
  requests: number;
  tokens: number;
  wall_s: number;
  /** Tokens generated, every request's, over the level's wall time. */
  tokens_per_s: number;
  ttft_ms: Latency;
  itl_ms: Latency;
  request_ms: Latency;
}

const r3 = (x: number) => Math.round(x * 1000) / 1000;

/** A level's figures from its requests and its wall time: p50/p99 of TTFT, of every ITL gap, and of request time. */
export function levelFigures(reqs: RequestTiming[], wallS: number): LevelFigures {
  const tokens = reqs.reduce((a, r) => a + r.tokens, 0);
  const lat = (xs: number[]): Latency =>
    xs.length ? summarize(xs) : { n: 0, p50_ms: Number.NaN, p99_ms: Number.NaN, mean_ms: Number.NaN };
  return {
    requests: reqs.length,
    tokens,
    wall_s: r3(wallS),
    tokens_per_s: +(tokens / wallS).toFixed(1),
    ttft_ms: lat(reqs.map((r) => r.ttft_ms).filter((x) => Number.isFinite(x))),
    itl_ms: lat(reqs.flatMap((r) => r.itl_ms)),
    request_ms: lat(reqs.map((r) => r.total_ms)),
  };
}

export interface StreamResult {
  sentAt: number;
  endAt: number;
  arrivals: Arrival[];
  status: number;
  /** An error the server sent (HTTP status, an error event) or the connection's; absent when none. */
  error?: string;
}

/**
 * Splits a Server-Sent Events buffer into its complete events' data payloads; returns them and the
 * incomplete rest.
 */
export function sseEvents(buffer: string): { data: string[]; rest: string } {
  const parts = buffer.split('\n\n');
  const rest = parts.pop() ?? '';
  const data = parts.flatMap((ev) =>
    ev
      .split('\n')
      .filter((l) => l.startsWith('data:'))
      .map((l) => l.slice(5).trimStart()),
  );
  return { data, rest };
}

/**
 * POSTs a streaming completion and records, per read of the stream, the tokens it brought (the
 * growth of the chunks' `usage.completion_tokens`).
 */
export function streamCompletion(url: string, agent: Agent, body: Record<string, unknown>): Promise<StreamResult> {
  const text = JSON.stringify(body);
  return new Promise((resolve) => {
    const arrivals: Arrival[] = [];
    let sentAt = 0;
    let seen = 0;
    let error: string | undefined;
    let settled = false;
    const done = (status: number, e?: string) => {
      if (settled) return;
      settled = true;
      resolve({ sentAt, endAt: performance.now(), arrivals, status, ...((e ?? error) ? { error: e ?? error } : {}) });
    };
    const req = request(
      url,
      { method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) } },
      (res) => {
        const status = res.statusCode ?? 0;
        let buf = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => {
          const t = performance.now();
          buf += c;
          if (status !== 200) return;
          const { data, rest } = sseEvents(buf);
          buf = rest;
          let tokens = 0;
          for (const d of data) {
            if (d === '[DONE]') continue;
            let ev: { usage?: { completion_tokens?: number } | null; error?: { message?: string } };
            try {
              ev = JSON.parse(d);
            } catch {
              error ??= `a stream event that is not JSON: ${d.slice(0, 200)}`;
              continue;
            }
            if (ev.error) error ??= ev.error.message ?? JSON.stringify(ev.error);
            const n = ev.usage?.completion_tokens;
            if (typeof n === 'number' && n > seen) {
              tokens += n - seen;
              seen = n;
            }
          }
          if (tokens > 0) arrivals.push({ t, tokens });
        });
        res.on('end', () => done(status, status === 200 ? undefined : `HTTP ${status}: ${buf.slice(0, 300)}`));
        res.on('error', (e) => done(status, e.message));
      },
    );
    req.on('error', (e) => done(0, e.message));
    // A server that stops sending ends the request with an error instead of hanging the bench.
    req.setTimeout(300_000, () => req.destroy(new Error('no data from the server for 300 s')));
    sentAt = performance.now();
    req.end(text);
  });
}

export interface LoadLevelSpec {
  clients: number;
  /** Each client's first request waits a seeded random delay in [0, staggerMs) (0: all start at once). */
  staggerMs: number;
  requestsPerClient: number;
  maxTokens: number;
  promptTokens: number;
  /** Distinguishes the prompts and seeds of this level from the others'. */
  level: number;
}

/** A request's 32 (promptTokens) token ids: distinct per (level, client, request). */
export function benchPrompt(level: number, client: number, r: number, T: number): number[] {
  const k = (level * 64 + client) * 16 + r;
  return Array.from({ length: T }, (_, i) => (((k * 131 + i) * 7919) % 100000) + 100);
}

/**
 * Runs one level: `clients` clients, each on its own kept-alive connection, sending
 * requestsPerClient streaming requests back to back. Returns each request's timing (with whether it
 * got maxTokens tokens and no error) and the wall time from the level's start to its last reply's end.
 */
export async function runLevel(
  url: string,
  o: LoadLevelSpec & { model: string; delay: (client: number) => number },
): Promise<{ timings: RequestTiming[]; errors: string[]; wallS: number }> {
  const agent = new Agent({ keepAlive: true, maxSockets: o.clients });
  const timings: RequestTiming[] = [];
  const errors: string[] = [];
  const t0 = performance.now();
  try {
    await Promise.all(
      Array.from({ length: o.clients }, async (_, c) => {
        const wait = o.staggerMs > 0 ? o.delay(c) * o.staggerMs : 0;
        if (wait > 0) await new Promise((r) => setTimeout(r, wait));
        for (let r = 0; r < o.requestsPerClient; r++) {
          const s = await streamCompletion(url, agent, {
            model: o.model,
            prompt: benchPrompt(o.level, c, r, o.promptTokens),
            max_tokens: o.maxTokens,
            temperature: 1,
            seed: (o.level * 64 + c) * 16 + r,
            ignore_eos: true,
            stream: true,
            stream_options: { include_usage: true, continuous_usage_stats: true },
          });
          const timing = requestTiming(s.sentAt, s.arrivals, s.endAt);
          timings.push(timing);
          if (s.error) errors.push(s.error);
          else if (timing.tokens !== o.maxTokens) errors.push(`a request got ${timing.tokens} tokens, not max_tokens ${o.maxTokens}`);
        }
      }),
    );
  } finally {
    agent.destroy();
  }
  return { timings, errors, wallS: (performance.now() - t0) / 1e3 };
}

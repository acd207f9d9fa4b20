// `slm-train bench serve` (issue 30 item 6): the TTFT / ITL arithmetic on synthetic timings, the
// stream client's token counting against a scripted SSE server, the clients against the real server
// (every request gets max_tokens tokens, TTFT within the request's time), the whole bench on the tiny
// preset (its structure, and that rows joined running decodes at 16 clients), and the CLI reaching it
// with --quick, --json and --model. No timing is asserted.
import { Agent, createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { levelFigures, requestTiming, runLevel, sseEvents, streamCompletion } from '../bench/serve-load.js';
import { serveBench, serveRound, serveTable, sessionTotals } from '../bench/serve.js';
import { Model } from '../lib/engine/model.js';
import { ChatFormatter } from '../lib/model/chat.js';
import { initModel } from '../lib/model/init.js';
import { loadTokenizer } from '../lib/model/tokenizer.js';
import { OpenAIServer } from '../lib/serve/server.js';
import { runCliAsync } from './helpers/cli.js';

const dir = join(t.testdir(), 'tiny');
initModel({ preset: 'tiny', out: dir, seed: 0 });

t.test('requestTiming: TTFT to the first read with a token, a read of k tokens gives k gaps of gap / k', async (t) => {
  const r = requestTiming(
    100,
    [
      { t: 150, tokens: 1 },
      { t: 160, tokens: 1 },
      { t: 180, tokens: 2 }, // 2 tokens in one read: two gaps of 10
      { t: 181, tokens: 0 }, // a read with no token (the finish chunk) adds nothing
      { t: 200, tokens: 1 },
    ],
    210,
  );
  t.same(r, { ttft_ms: 50, total_ms: 110, tokens: 5, itl_ms: [10, 10, 10, 20] });
  // Tokens that came with the first add no gap: N tokens, N - (first read's) gaps summing to last - first.
  const s = requestTiming(
    0,
    [
      { t: 40, tokens: 3 },
      { t: 46, tokens: 3 },
    ],
    50,
  );
  t.same(s, { ttft_ms: 40, total_ms: 50, tokens: 6, itl_ms: [2, 2, 2] });
  t.ok(Number.isNaN(requestTiming(0, [], 5).ttft_ms), 'no token: no TTFT');
});

t.test('levelFigures: p50 / p99 over requests (TTFT) and over every gap (ITL), tokens over wall time', async (t) => {
  // 100 requests: TTFT 1..100 ms, each with 2 gaps of (its index + 1) ms and 3 tokens.
  const reqs = Array.from({ length: 100 }, (_, i) => ({ ttft_ms: i + 1, total_ms: 1000 + i, tokens: 3, itl_ms: [i + 1, i + 1] }));
  const f = levelFigures(reqs, 2);
  t.equal(f.requests, 100);
  t.equal(f.tokens, 300);
  t.equal(f.tokens_per_s, 150);
  t.match(f.ttft_ms, { n: 100, p50_ms: 50, p99_ms: 99, mean_ms: 50.5 });
  t.match(f.itl_ms, { n: 200, p50_ms: 50, p99_ms: 99 });
  t.match(f.request_ms, { n: 100, p50_ms: 1049, p99_ms: 1098 });
  // A skewed ITL: one slow gap in 100 shows at p99, not at p50.
  const g = levelFigures([{ ttft_ms: 5, total_ms: 10, tokens: 101, itl_ms: [...Array(99).fill(1), 500] }], 1);
  t.match(g.itl_ms, { p50_ms: 1, p99_ms: 1 });
  const h = levelFigures([{ ttft_ms: 5, total_ms: 10, tokens: 101, itl_ms: [...Array(98).fill(1), 500, 500] }], 1);
  t.match(h.itl_ms, { p50_ms: 1, p99_ms: 500 });
});

t.test('sseEvents and sessionTotals', async (t) => {
  t.same(sseEvents('data: {"a":1}\n\ndata: [DONE]\n\ndata: {"b"'), { data: ['{"a":1}', '[DONE]'], rest: 'data: {"b"' });
  const s = (o: Partial<Record<string, number>>) => ({
    steps: 0,
    rows: 0,
    joined: 0,
    maxBatch: 0,
    prefillTokens: 0,
    rebuilds: 0,
    prefillSeconds: 0,
    decodeSeconds: 0,
    ...o,
  });
  t.same(
    sessionTotals(
      [
        s({ steps: 10, rows: 4, joined: 3, maxBatch: 4, prefillTokens: 128 }),
        s({ steps: 30, rows: 2, joined: 1, maxBatch: 2, decodeSeconds: 1.5 }),
      ],
      80,
    ),
    { sessions: 2, rows: 6, joined: 4, max_batch: 4, steps: 40, mean_rows_per_step: 2, prefill_tokens: 128, prefill_s: 0, decode_s: 1.5 },
  );
});

t.test('streamCompletion counts the tokens each read brings from usage, not one per chunk', async (t) => {
  // A scripted stream: 1 token, then a chunk carrying 2 (a held-back token), then two chunks in one
  // write (one read), then the finish chunk and the usage chunk (no new token).
  const ev = (n: number) => `data: ${JSON.stringify({ choices: [{ index: 0, text: 'x' }], usage: { completion_tokens: n } })}\n\n`;
  const server = createServer((req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const steps = [ev(1), ev(3), ev(4) + ev(5), ev(5) + 'data: [DONE]\n\n'];
    let i = 0;
    const next = () => {
      if (i === steps.length) return void res.end();
      res.write(steps[i++]);
      setTimeout(next, 30);
    };
    next();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => server.close());
  const agent = new Agent({ keepAlive: true });
  t.teardown(() => agent.destroy());
  const r = await streamCompletion(`http://127.0.0.1:${(server.address() as AddressInfo).port}/`, agent, { stream: true });
  t.equal(r.status, 200);
  t.notOk(r.error);
  t.same(
    r.arrivals.map((a) => a.tokens),
    [1, 2, 2],
  );
  const timing = requestTiming(r.sentAt, r.arrivals, r.endAt);
  t.equal(timing.tokens, 5);
  t.equal(timing.itl_ms.length, 4);
  t.ok(timing.ttft_ms <= timing.total_ms);
});

t.test('the clients against the real server: every request gets max_tokens tokens, TTFT within its time', async (t) => {
  const model = await Model.load(dir);
  const tok = loadTokenizer(dir);
  model.setVocab(tok.tokenBytes());
  const server = new OpenAIServer({ model, tokenizer: tok, formatter: ChatFormatter.forModel(dir), name: 'bench', port: 0 });
  const port = await server.listen();
  t.teardown(async () => {
    await server.close();
    model.dispose();
  });
  const run = await runLevel(`http://127.0.0.1:${port}/v1/completions`, {
    clients: 4,
    staggerMs: 0,
    requestsPerClient: 2,
    maxTokens: 6,
    promptTokens: 32,
    level: 1,
    model: 'bench',
    delay: () => 0,
  });
  t.same(run.errors, []);
  t.equal(run.timings.length, 8);
  for (const r of run.timings) {
    t.equal(r.tokens, 6);
    t.ok(r.ttft_ms > 0 && r.ttft_ms <= r.total_ms, `TTFT ${r.ttft_ms} ms within ${r.total_ms} ms`);
    // 6 tokens: 5 gaps, fewer when a read brought the first token with others.
    t.ok(r.itl_ms.length <= 5 && r.itl_ms.every((g) => g >= 0), `${r.itl_ms.length} gaps`);
  }
  t.ok(server.sessions.count >= 1, 'the requests ran in decode sessions');
  t.ok(server.batches.since(0).reduce((a, b) => a + b, 0) >= 8, 'every row was submitted');
});

t.test('serveRound: the clients over the better of the decode rates measured before and after them', async (t) => {
  const fig = levelFigures([{ ttft_ms: 100, total_ms: 1000, tokens: 300, itl_ms: [10, 20, 30] }], 1);
  t.match(serveRound(fig, 0, 400, 375), {
    tokens: 300,
    tokens_per_s: 300,
    limit_tokens_per_s: [400, 375],
    fraction_of_limit: 0.75,
    ttft_p50_ms: 100,
    itl_p50_ms: 20,
  });
  t.equal(serveRound(fig, 2, 350, 420).fraction_of_limit, 0.714, 'the after rate when it is the better');
  t.equal(serveRound(fig, 2, 350, 420).errors, 2);
});

t.test('serveBench on the tiny preset: the structure, and rows joined running decodes at 16 clients', async (t) => {
  const r = await serveBench({
    dir,
    levels: [{ clients: 1 }, { clients: 16 }, { clients: 16, stagger: true }],
    requestsPerClient: 2,
    maxTokens: 8,
    limitSteps: 4,
    limitReps: 1,
    rounds: 2,
  });
  t.same(
    r.engine_decode.map((e) => e.batch),
    [1, 16],
  );
  for (const e of r.engine_decode) t.ok(e.tokens_per_s > 0 && e.step_ms > 0, `engine decode batch ${e.batch}: ${e.tokens_per_s} tok/s`);
  t.match(r.model, { dir, dtype: 'float32', threads: Number });
  t.equal(r.model.cpuCache, "SLM_TRAIN_CPU_CACHE=0: ATen's CPU allocator", 'the server runs with the allocator slm-train serve uses');
  t.same(
    r.levels.map((l) => [l.clients, l.stagger_ms > 0, l.limit_batch]),
    [
      [1, false, 1],
      [16, false, 16],
      [16, true, 16],
    ],
  );
  for (const l of r.levels) {
    t.equal(l.errors, 0, `${l.clients} clients: no error`);
    t.equal(l.requests, l.clients * 2);
    t.equal(l.tokens, l.requests * 8, 'every request got max_tokens tokens');
    t.ok(Number.isFinite(l.fraction_of_limit) && l.fraction_of_limit > 0, `fraction ${l.fraction_of_limit}`);
    t.ok(l.ttft_ms.n === l.requests && l.ttft_ms.mean_ms <= l.request_ms.mean_ms, 'TTFT within the request time');
    t.ok(l.itl_ms.n > 0 && l.itl_ms.p50_ms <= l.itl_ms.p99_ms);
    t.equal(l.server.rows, l.requests, "the server's sessions took every request's row");
  }
  const at16 = r.levels[1];
  t.ok(
    at16.server.joined > 0 || at16.server.max_batch > 1,
    `16 clients: ${at16.server.joined} rows joined, most ${at16.server.max_batch} in a step`,
  );
  t.equal(r.target.measured, at16.fraction_of_limit);
  t.equal(typeof r.target.met, 'boolean');
  t.same(r.errors_sample, []);
  t.equal(r.rounds.length, 2, 'rounds reached the bench');
  for (const x of r.rounds) {
    t.equal(x.errors, 0);
    t.equal(x.tokens, 16 * 2 * 8, 'a round: 16 clients, every request max_tokens tokens');
    t.ok(
      Math.abs(x.fraction_of_limit - x.tokens_per_s / Math.max(...x.limit_tokens_per_s)) < 0.002,
      `round fraction ${x.fraction_of_limit}`,
    );
  }
  t.equal(r.rounds[1].limit_tokens_per_s[0], r.rounds[0].limit_tokens_per_s[1], "a round's limit before is the last round's after");
  t.equal(r.target.rounds_median, +((r.rounds[0].fraction_of_limit + r.rounds[1].fraction_of_limit) / 2).toFixed(3));
  const table = serveTable(r, 'tiny');
  t.match(table, new RegExp(`Alternated rounds at 16 clients .*; median ${r.target.rounds_median}\\.`));
  t.match(table, /\| clients \| tokens\/s \| engine decode \(same run\) \| fraction \| TTFT p50 \/ p99 ms \| ITL p50 \/ p99 ms \|/);
  t.equal(table.split('\n').filter((l) => /^\| 16/.test(l)).length, 2);
});

t.test('slm-train bench serve --rounds N reaches the rounds (0: none)', async (t) => {
  const r = await runCliAsync(['bench', 'serve', '--quick', '--json', '--rounds', '0', '--model', dir], { timeout: 600_000 });
  t.equal(r.code, 0, r.stderr.slice(-2000));
  const s = JSON.parse(r.stdout).reports.serve;
  t.same(s.rounds, [], '--rounds 0: no round');
  t.equal(s.target.rounds_median, null);
  t.notMatch(r.stderr, /serve: round 1/);
});

t.test('slm-train bench serve --quick --json --model DIR reaches the bench with the quick sizes', async (t) => {
  const r = await runCliAsync(['bench', 'serve', '--quick', '--json', '--model', dir], { timeout: 600_000 });
  t.equal(r.code, 0, r.stderr.slice(-2000));
  const doc = JSON.parse(r.stdout);
  t.match(doc, { quick: true, seconds: { serve: Number, total: Number } });
  const s = doc.reports.serve;
  t.equal(s.model.dir, dir, '--model reached it');
  t.match(s, { max_tokens: 32, requests_per_client: 2, prompt_tokens: 32 }, '--quick sizes');
  t.same(
    s.levels.map((l: { clients: number }) => l.clients),
    [1, 16, 16],
  );
  for (const l of s.levels) t.equal(l.tokens, l.requests * 32);
  t.equal(s.rounds.length, 1, '--quick: one round');
  t.equal(s.rounds[0].tokens, 16 * 2 * 32);
  t.equal(s.target.rounds_median, s.rounds[0].fraction_of_limit);
  t.match(r.stderr, /\[bench\] serve: 16 clients/);
});

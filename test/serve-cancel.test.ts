// `slm-train serve` while a long request runs (issue 33 row 1): /health and /v1/models answer while
// its prefill and decoding run (the native loop runs on a worker thread, not the event loop); a
// second request joins the running decode session at once (it does not wait for the long one to end),
// a client that disconnects before or during its prefill is never computed or stops between two
// chunks, and during decoding at the next step; a short request is answered while the long one still runs; SIGTERM ends the process
// within a bound: at once while it decodes or prefills in chunks, and with --prefill-chunk 0 (one
// forward, which nothing interrupts) after the 5 s grace by SIGTERM's default action.
// The tiny preset, real engine; the SIGTERM cases run the CLI (dist/, built by `npm test`'s pretest).
import { join } from 'node:path';
import t from 'tap';
import { Model } from '../lib/engine/model.js';
import { ChatFormatter } from '../lib/model/chat.js';
import { initModel } from '../lib/model/init.js';
import { loadTokenizer } from '../lib/model/tokenizer.js';
import type { ServeOptions } from '../lib/serve/options.js';
import { OpenAIServer } from '../lib/serve/server.js';
import { serveProcess as serveProcessOf, until } from './helpers/serve-process.js';

const dir = join(t.testdir(), 'model');
initModel({ preset: 'tiny', out: dir, seed: 6 });
/** A prompt of `n` token ids (completions takes token ids), long enough that its prefill takes a while. */
const ids = (n: number, k = 0) => Array.from({ length: n }, (_, i) => 10 + ((i * 7 + k) % 200));
/** A request that would run for minutes: a long prompt, 4,096 new tokens (the most a request may ask), no stop token. */
const long = (k = 0) => ({
  model: 'tiny',
  prompt: ids(4000, k),
  max_tokens: 4096,
  ignore_eos: true,
  temperature: 1,
  seed: 1,
  stream: true,
});

/** The server in this process on the tiny model (its options beside the model's), closed at the end of the test. */
async function inProcess(t: { teardown(f: () => unknown): void }, o: Partial<ServeOptions> = {}) {
  const model = await Model.load(dir);
  const tok = loadTokenizer(dir);
  model.setVocab(tok.tokenBytes());
  const server = new OpenAIServer({ model, tokenizer: tok, formatter: ChatFormatter.forModel(dir), name: 'tiny', port: 0, ...o });
  const port = await server.listen();
  t.teardown(async () => {
    await server.close();
    await server.idle();
    model.dispose();
  });
  return { server, base: `http://127.0.0.1:${port}` };
}

t.test('health and models answer during a long generation; a client that leaves cancels its rows', async (t) => {
  const { server, base } = await inProcess(t);

  // A: the long request, streamed. Its first chunk comes after its prefill.
  const a = new AbortController();
  let chunks = 0;
  let aDone = false;
  const aRes = fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(long()),
    signal: a.signal,
  }).then(async (r) => {
    t.equal(r.status, 200, 'the long request is accepted');
    try {
      for await (const _ of r.body!) chunks++;
    } catch {
      // aborted by the client below
    }
    aDone = true;
  });
  await until(() => server.batches.count === 1, 'the long call to start');
  // During its prefill (no chunk yet: 4,000 tokens take seconds here, a /health round trip milliseconds).
  const h = await fetch(`${base}/health`);
  t.equal(h.status, 200, '/health answers while the long call runs');
  t.same(await h.json(), { status: 'ok' });
  const m = await fetch(`${base}/v1/models`);
  t.equal(m.status, 200, '/v1/models answers too');
  t.match(await m.json(), { data: [{ id: 'tiny' }] });
  t.equal(chunks, 0, 'both answered during the prefill: no token streamed yet');
  t.notOk(aDone, 'and before the generation finished');

  // B: a second long request while A runs: it joins A's session at once; its client leaves before
  // B's prefill ends (B's prompt waits for A's prefill, then is computed a chunk at a time), and B ends
  // without a token (A is not affected).
  const b = new AbortController();
  const bRes = fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...long(1), stream: false }),
    signal: b.signal,
  }).catch((e: Error) => e);
  await until(() => server.batches.count === 2, "B's rows to join A's session");
  await new Promise((r) => setTimeout(r, 100));
  b.abort();
  t.match(await bRes, { name: 'AbortError' }, "B's client gave up");
  await until(() => server.calls.count >= 1, "B's call to end");
  const bCall = server.calls.since(0)[0];
  t.same([bCall.rows, bCall.steps, bCall.finish], [1, 0, ['cancelled']], "B's call ended first, cancelled before any token");
  t.ok(bCall.prefillTokens < 4000, `its prefill stopped after ${bCall.prefillTokens} of its 4,000 prompt tokens`);
  t.notOk(aDone, 'A still runs');

  // A keeps decoding; /health still answers between its decode steps, and a short request gets its
  // whole reply while A runs (it joins A's decode, not queued behind it).
  await until(() => chunks >= 5, "A's first tokens");
  t.equal((await fetch(`${base}/health`)).status, 200, '/health answers during decoding');
  const short = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'tiny', prompt: [5, 6, 7], max_tokens: 4, ignore_eos: true, temperature: 0 }),
  });
  t.equal(short.status, 200, 'a short request is answered');
  t.match(await short.json(), { choices: [{ finish_reason: 'length' }], usage: { completion_tokens: 4 } });
  t.notOk(aDone, 'while A is still running');
  a.abort();
  await aRes;
  const t0 = Date.now();
  await server.idle();
  t.ok(Date.now() - t0 < 30_000, `the server is idle ${Date.now() - t0} ms after A's client left`);
  const calls = server.calls.since(0);
  t.equal(server.batches.count, 3, 'three submissions: A, B and the short one');
  t.same(
    calls.map((c) => c.finish[0]),
    ['cancelled', 'length', 'cancelled'],
    'B ended, then the short request, then A',
  );
  t.ok(calls[2].steps < 4096, `A stopped after ${calls[2].steps} of its 4,096 decode steps`);
  t.equal(calls[2].prefillTokens, 4000, "A's prefill ran whole (its client stayed through it)");
});

t.test('a request whose client leaves while it waits behind another prefill is never prefilled', async (t) => {
  const { server, base } = await inProcess(t, { maxConcurrentCalls: 1 });
  const a = new AbortController();
  const aRes = fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(long()),
    signal: a.signal,
  })
    .then(async (r) => {
      for await (const _ of r.body!);
    })
    .catch(() => {}); // aborted below (before or after its first chunk)
  await until(() => server.batches.count === 1, 'the long call to start');
  const b = new AbortController();
  const bRes = fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...long(1), stream: false }),
    signal: b.signal,
  }).catch((e: Error) => e);
  await new Promise((r) => setTimeout(r, 200));
  b.abort();
  t.match(await bRes, { name: 'AbortError' });
  a.abort();
  await aRes;
  await server.idle();
  const computed = server.sessions.since(0).reduce((n, x) => n + x.prefillTokens, 0);
  t.ok(
    computed <= 4000,
    `${computed} prompt tokens computed, at most A's 4,000: B's rows, waiting behind A's prefill, were dropped before any of theirs`,
  );
  // B's client left first, so B's record ended first: one row, no token, nothing of its prompt prefilled.
  const bRecord = server.calls.since(0)[0];
  t.same(
    [bRecord.rows, bRecord.steps, bRecord.finish, bRecord.prefillTokens],
    [1, 0, ['cancelled'], 0],
    'B ended first, cancelled without a token',
  );
});

/** `slm-train serve` on the tiny model in a child process (test/helpers/serve-process.ts). */
const serveProcess = (t: { teardown(f: () => unknown): void }, extra: string[] = []) =>
  serveProcessOf(t, ['--model', dir, '--name', 'tiny', ...extra]);

t.test('SIGTERM during a long generation ends the server within a bound', async (t) => {
  const { p, port, exited, stderr } = await serveProcess(t);
  // A streamed request whose client stays connected; SIGTERM once it streams.
  let chunks = 0;
  void fetch(`http://127.0.0.1:${port}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(long()),
  })
    .then(async (r) => {
      for await (const _ of r.body!) chunks++;
    })
    .catch(() => {});
  await until(() => chunks >= 3, 'tokens to stream', 60_000);
  const t0 = Date.now();
  p.kill('SIGTERM');
  const end = await Promise.race([exited, new Promise<null>((r) => setTimeout(r, 30_000, null))]);
  t.ok(end, `the server exited ${Date.now() - t0} ms after SIGTERM (a running generation stops at its next decode step)`);
  t.same(end, { code: 0, signal: null }, `exit 0; stderr: ${stderr().slice(-500)}`);
});

for (const chunked of [true, false]) {
  const what = chunked
    ? 'SIGTERM during a chunked prefill ends the server at the next chunk, exit 0'
    : 'SIGTERM during a one-forward prefill (--prefill-chunk 0) ends the server after the grace period';
  t.test(what, async (t) => {
    const { p, port, exited, stderr } = await serveProcess(t, chunked ? [] : ['--prefill-chunk', '0']);
    // 30,000 prompt tokens: a prefill of minutes on a CPU.
    let chunks = 0;
    void fetch(`http://127.0.0.1:${port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ...long(), prompt: ids(30000) }),
    })
      .then(async (r) => {
        for await (const _ of r.body!) chunks++;
      })
      .catch(() => {});
    // Let the request reach the engine (its body parsed, the call started).
    await new Promise((r) => setTimeout(r, 1500));
    t.equal(chunks, 0, 'still in its prefill');
    const t0 = Date.now();
    p.kill('SIGTERM');
    const end = await Promise.race([exited, new Promise<null>((r) => setTimeout(r, 30_000, null))]);
    const ms = Date.now() - t0;
    t.ok(end, `the server exited ${ms} ms after SIGTERM, its prefill unfinished`);
    if (chunked) {
      t.same(end, { code: 0, signal: null }, `exit 0: the prefill stopped between two chunks; stderr: ${stderr().slice(-500)}`);
      t.notMatch(stderr(), /was still running/);
    } else {
      t.same(end, { code: null, signal: 'SIGTERM' }, "ended by SIGTERM's default action (process.exit would wait for the native call)");
      t.match(
        stderr(),
        /a generate call \(a prefill in one forward, which cannot be interrupted\) was still running 5 s after the signal; exiting without waiting for it/,
      );
    }
  });
}

// The server's batching queue with a stand-in model whose generate calls end when the test says:
// rows that arrive while a call runs wait for it up to concurrentAfterMs, then start a call of their
// own beside it (at most maxConcurrentCalls); arrivals within the wait share one call; a call with
// another adapter waits until none runs; a call pads its prompts to the longest, so a long prompt is
// not batched with short ones; the prefill chunk reaches the engine.
import t from 'tap';
import type { Model } from '../lib/engine/model.js';
import { Batcher } from '../lib/serve/batcher.js';
import { Job } from '../lib/serve/job.js';
import type { ServeOptions } from '../lib/serve/options.js';

interface Call {
  rows: number;
  prefillChunk?: number;
  at: number;
  end: () => void;
}

function stand(o: Partial<ServeOptions>) {
  const calls: Call[] = [];
  const adapters: string[] = [];
  let running = 0;
  let most = 0;
  const model = {
    generateStream: (req: { prompts: unknown[]; prefillChunk?: number }) =>
      new Promise((resolve) => {
        running++;
        most = Math.max(most, running);
        calls.push({
          rows: req.prompts.length,
          prefillChunk: req.prefillChunk,
          at: performance.now(),
          end: () => {
            running--;
            resolve({
              tokens: [],
              logprobs: [],
              finishReasons: req.prompts.map(() => 'length'),
              steps: 1,
              prefillTokens: 1,
              prefillTokensRequested: 1,
              cacheReusedTokens: 0,
            });
          },
        });
      }),
    loadAdapter: async (dir: string) => void adapters.push(dir),
    detachLora: () => void adapters.push('none'),
  } as unknown as Model;
  const b = new Batcher({ model, ...o } as ServeOptions, new Map([['other', '/adapters/other']]));
  return { b, calls, adapters, most: () => most };
}
const job = (adapter: string | null = null, promptTokens = 2) =>
  new Job(
    new Int32Array(promptTokens).fill(1),
    { topK: 0, stop: [], stopTokenIds: [], adapter, maxTokens: 4, temperature: 0, topP: 1, topN: 0, keepStop: false } as never,
    1,
    () => '',
  );
const until = async (ok: () => boolean) => {
  for (let i = 0; i < 2000 && !ok(); i++) await new Promise((r) => setTimeout(r, 5));
  if (!ok()) throw new Error('timed out');
};
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

t.test('rows arriving during a call wait up to concurrentAfterMs, then share a call beside it', async (t) => {
  const { b, calls, most } = stand({ concurrentAfterMs: 2000, prefillChunk: 64 });
  b.enqueue([job()]);
  await until(() => calls.length === 1);
  t.equal(calls[0].prefillChunk, 64, 'prefillChunk reaches the engine');
  const t0 = performance.now();
  b.enqueue([job()]);
  await sleep(30);
  b.enqueue([job()]);
  await sleep(30);
  t.equal(calls.length, 1, 'not started at once');
  await until(() => calls.length === 2);
  // A lower bound only (a timer never fires early); the 2 s wait leaves the two 30 ms sleeps above a wide margin on a loaded machine.
  t.ok(calls[1].at - t0 >= 1990, `the second call started ${(calls[1].at - t0).toFixed(0)} ms after the first arrival (the wait is 2,000)`);
  t.equal(calls[1].rows, 2, 'the two arrivals share it');
  b.enqueue([job()]);
  await sleep(250);
  t.equal(calls.length, 2, 'a third call waits: two run already (maxConcurrentCalls default 2)');
  calls[0].end();
  await until(() => calls.length === 3);
  t.equal(most(), 2);
  calls[1].end();
  calls[2].end();
  await b.idle();
});

t.test('a row that arrives when the running call ends soon joins the next call; another adapter waits for none to run', async (t) => {
  const { b, calls, adapters } = stand({ concurrentAfterMs: 10_000 });
  b.enqueue([job()]);
  await until(() => calls.length === 1);
  b.enqueue([job(), job()]);
  b.enqueue([job('other')]);
  await sleep(100);
  t.equal(calls.length, 1, 'nothing beside it within the wait');
  calls[0].end();
  await until(() => calls.length === 2);
  t.equal(calls[1].rows, 2, 'the two queued rows in the next call');
  await sleep(100);
  t.equal(calls.length, 2, "the other adapter's row waits while a call runs");
  t.same(adapters, [], 'no adapter switched while a call ran');
  calls[1].end();
  await until(() => calls.length === 3);
  t.same(adapters, ['/adapters/other'], 'switched once none ran');
  calls[2].end();
  await b.idle();
});

t.test('maxConcurrentCalls 1: one call at a time', async (t) => {
  const { b, calls, most } = stand({ concurrentAfterMs: 0, maxConcurrentCalls: 1 });
  b.enqueue([job()]);
  await until(() => calls.length === 1);
  b.enqueue([job()]);
  await sleep(100);
  t.equal(calls.length, 1);
  calls[0].end();
  await until(() => calls.length === 2);
  calls[1].end();
  await b.idle();
  t.equal(most(), 1);
});

t.test('prompts of very different lengths are not padded into one call', async (t) => {
  const { b, calls } = stand({ concurrentAfterMs: 0 });
  // A 2,000-token prompt, then 31 of 30 tokens (all queued in one tick), then one of 1,200.
  b.enqueue([job(null, 2000), ...Array.from({ length: 31 }, () => job(null, 30)), job(null, 1200)]);
  await until(() => calls.length === 2);
  // Admitted while at least half the padded positions are real: 2,000 + one 30 (4,000 padded for 2,030),
  // not a second 30 (6,000 for 2,060), then the 1,200 (6,000 for 3,230); the other 30 short ones apart.
  t.same(
    calls.map((c) => c.rows),
    [3, 30],
    'the long prompt with one short and the 1,200-token one; the 30 other short ones apart',
  );
  calls[0].end();
  calls[1].end();
  await b.idle();
  const { b: b2, calls: c2 } = stand({});
  b2.enqueue([job(null, 30), job(null, 40), job(null, 25)]);
  await until(() => c2.length === 1);
  t.equal(c2[0].rows, 3, 'similar lengths share a call');
  c2[0].end();
  await b2.idle();
});

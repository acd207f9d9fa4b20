// Chunked prefill (GenerateRequest.prefillChunk, what `slm-train serve` uses, issue 33 row 1): a prompt
// run through the model a chunk of positions at a time gives the one-forward prefill's generation, and
// a call whose every row is cancelled stops between two chunks, its prompt not all computed.
import { join } from 'node:path';
import t from 'tap';
import { Model } from '../lib/engine/model.js';
import { initModel } from '../lib/model/init.js';

const dir = join(t.testdir(), 'model');
initModel({ preset: 'tiny', out: dir, seed: 33, embedStd: 0.3 });
const seq = (n: number, k: number) => Int32Array.from({ length: n }, (_, i) => 3 + ((i * 11 + k * 5) % 300));

t.test('chunked prefill = one forward: greedy tokens equal, log-probs within float rounding', async (t) => {
  const model = await Model.load(dir);
  t.teardown(() => model.dispose());
  // Unequal lengths (left padding inside the chunks), two identical prompts and a shared first 20
  // tokens (the shared-prefix path, its prefix chunked too).
  const common = seq(20, 9);
  const withCommon = (n: number, k: number) => Int32Array.from([...common, ...seq(n, k)]);
  const prompts = [withCommon(57, 1), withCommon(9, 2), withCommon(31, 3), withCommon(31, 3)];
  const req = { prompts, maxNewTokens: 10, temperature: 0 };
  const whole = await model.generateStream(req);
  for (const chunk of [1, 7, 16, 64]) {
    const c = await model.generateStream({ ...req, prefillChunk: chunk });
    t.same(
      c.tokens.map((x) => Array.from(x)),
      whole.tokens.map((x) => Array.from(x)),
      `chunks of ${chunk}: the same tokens`,
    );
    const diff = Math.max(...c.logprobs.flatMap((row, i) => Array.from(row, (x, k) => Math.abs(x - whole.logprobs[i][k]))));
    t.ok(diff < 1e-4, `chunks of ${chunk}: log-probs within ${diff.toExponential(1)}`);
    t.equal(c.prefillTokens, whole.prefillTokens, 'the same prompt tokens computed');
  }
  await t.rejects(model.generateStream({ ...req, prefillChunk: -1 }), { code: 'ARGUMENT_INVALID', message: /prefillChunk/ });
});

t.test('a call whose rows are all cancelled stops between prefill chunks', async (t) => {
  const model = await Model.load(dir);
  t.teardown(() => model.dispose());
  const prompts = [seq(3000, 1), seq(2500, 2)];
  const run = async (prefillChunk: number) => {
    const a = new AbortController();
    const b = new AbortController();
    const p = model.generateStream({
      prompts,
      maxNewTokens: 50,
      temperature: 1,
      rowSeeds: [1, 2],
      signals: [a.signal, b.signal],
      prefillChunk,
    });
    // Cancelled once the call is under way (its first chunk runs on the worker thread).
    setTimeout(() => {
      a.abort();
      b.abort();
    }, 20);
    return p;
  };
  const chunked = await run(128);
  t.same(chunked.finishReasons, ['cancelled', 'cancelled']);
  t.equal(chunked.steps, 0, 'no decode step');
  t.equal(chunked.prefillTokensRequested, 5500);
  t.ok(
    chunked.prefillTokens < 5500 && chunked.prefillTokens > 0,
    `the prefill stopped after ${chunked.prefillTokens} of 5,500 prompt tokens`,
  );
  const whole = await run(0);
  t.same(whole.finishReasons, ['cancelled', 'cancelled'], 'one forward: cancelled at the first decode step');
  t.equal(whole.prefillTokens, 5500, 'after its whole prompt was computed');
  // One row cancelled: the other needs the prefill, which runs to its end.
  const a = new AbortController();
  const one = model.generateStream({ prompts, maxNewTokens: 3, temperature: 0, signals: [a.signal, undefined], prefillChunk: 128 });
  setTimeout(() => a.abort(), 20);
  const r = await one;
  t.same(r.finishReasons, ['cancelled', 'length']);
  t.equal(r.prefillTokens, 5500, 'the prompt of the row left running is computed whole');
});

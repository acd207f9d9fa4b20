// Model.generateStream (issue 21, what `slm-train serve` streams from): the tokens reported step by
// step are generate's tokens, reported while the call runs, not at its end; the top-n log-probs are
// log_softmax(logits / T) of the model's own logits; per-row token limits hold; a cancelled row
// leaves the batch (the call ends early when every row is cancelled) without changing the others.
import { join } from 'node:path';
import t from 'tap';
import { Model } from '../lib/engine/model.js';
import type { TokenEvent } from '../lib/engine/types.js';
import { initModel } from '../lib/model/init.js';

const dir = join(t.testdir(), 'model');
initModel({ preset: 'tiny', out: dir, seed: 21, embedStd: 0.3 });
const prompts = [
  [5, 9, 33, 2],
  [40, 41, 42],
  [7, 7, 100, 12, 3],
].map((p) => Int32Array.from(p));

/** log_softmax(logits / temp) of the next token after `ids`, from the engine's full-logits path. */
async function nextLogprobs(model: Model, ids: number[], temp: number): Promise<Float64Array> {
  const { data, vocab } = await model.logits([ids]);
  const row = data.subarray((ids.length - 1) * vocab, ids.length * vocab);
  let max = -Infinity;
  for (const x of row) max = Math.max(max, x / temp);
  let sum = 0;
  for (const x of row) sum += Math.exp(x / temp - max);
  const lse = max + Math.log(sum);
  return Float64Array.from(row, (x) => x / temp - lse);
}

t.test('streamed tokens = generate; top log-probs = log_softmax of the logits; row limits', async (t) => {
  const model = await Model.load(dir);
  t.teardown(() => model.dispose());
  const req = { prompts, maxNewTokens: 12, temperature: [0, 0.8, 1], rowSeeds: [1, 2, 3], topK: 50 };
  const plain = await model.generate(req);
  const events: TokenEvent[] = [];
  const s = await model.generateStream({ ...req, topLogprobs: 3, onToken: (e) => events.push(e) });
  for (let i = 0; i < prompts.length; i++) {
    t.same(Array.from(s.tokens[i]), Array.from(plain.tokens[i]), `row ${i}: the same tokens as generate`);
    t.same(Array.from(s.logprobs[i]), Array.from(plain.logprobs[i]), `row ${i}: the same log-probs`);
    const mine = events.filter((e) => e.row === i);
    t.same(
      mine.map((e) => e.token),
      Array.from(s.tokens[i]),
      `row ${i}: every token reported once, in order`,
    );
    t.same(
      mine.map((e) => e.logprob),
      Array.from(s.logprobs[i]),
    );
    t.same(
      mine.map((e) => e.finish ?? null),
      mine.map((_, k) => (k === mine.length - 1 ? 'length' : null)),
      'finish on the last token only',
    );
    t.equal(s.topLogprobs![i].ids.length, 3 * s.tokens[i].length);
  }
  // Top-3 of every step against log_softmax(logits / T) computed from the full-logits path.
  const temps = [1, 0.8, 1]; // greedy rows report T = 1
  let checked = 0;
  for (let i = 0; i < prompts.length; i++) {
    for (let k = 0; k < s.tokens[i].length; k += 4) {
      const ctx = [...prompts[i], ...s.tokens[i].slice(0, k)];
      const ref = await nextLogprobs(model, ctx, temps[i]);
      const order = Array.from(ref.keys())
        .sort((a, b) => ref[b] - ref[a])
        .slice(0, 3);
      const ev = events.filter((e) => e.row === i)[k];
      t.same(Array.from(ev.top!.ids), order, `row ${i} step ${k}: the top-3 ids`);
      for (let j = 0; j < 3; j++)
        t.ok(Math.abs(ev.top!.logprobs[j] - ref[order[j]]) < 1e-4, `top log-prob ${ev.top!.logprobs[j]} ~ ${ref[order[j]]}`);
      t.ok(Math.abs(ev.logprob - ref[ev.token]) < 1e-4, `the sampled token's log-prob ${ev.logprob} ~ ${ref[ev.token]}`);
      checked++;
    }
  }
  t.ok(checked >= 9);
  t.equal(events[0].top!.ids[0], s.tokens[0][0], 'greedy row: the best token is the sampled one');

  const limited = await model.generateStream({ ...req, rowMaxNewTokens: [3, 12, 7] });
  t.same(
    limited.tokens.map((x) => x.length),
    [3, 12, 7],
  );
  t.same(limited.finishReasons, ['length', 'length', 'length']);
  for (let i = 0; i < 3; i++)
    t.same(
      Array.from(limited.tokens[i]),
      Array.from(plain.tokens[i].slice(0, limited.tokens[i].length)),
      `row ${i}: a prefix of the unlimited row`,
    );
  await t.rejects(model.generateStream({ ...req, rowMaxNewTokens: [3, 13, 7] }), { code: 'ARGUMENT_INVALID' });
});

t.test('tokens arrive while the call runs; cancelled rows leave it', async (t) => {
  const model = await Model.load(dir);
  t.teardown(() => model.dispose());
  const N = 300;
  const req = { prompts, maxNewTokens: N, greedy: true };
  const plain = await model.generate(req);
  const t0 = performance.now();
  let first = -1;
  await model.generateStream({ ...req, onToken: () => (first < 0 ? (first = performance.now()) : 0) });
  const total = performance.now() - t0;
  t.ok(first - t0 < total / 2, `the first token arrived after ${(first - t0).toFixed(0)} ms of ${total.toFixed(0)} ms`);

  // Row 1 is cancelled after its 5th token: it stops soon after, the other rows run to the end unchanged.
  const abort = new AbortController();
  let seen = 0;
  const c = await model.generateStream({
    ...req,
    signals: [undefined, abort.signal, undefined],
    onToken: (e) => {
      if (e.row === 1 && ++seen === 5) abort.abort();
    },
  });
  t.same(c.finishReasons, ['length', 'cancelled', 'length']);
  // The abort is seen on the JavaScript thread while the native loop goes on: "soon" is a bound loose
  // enough for a busy machine and a fast decode, yet far below the row's 300-token budget.
  t.ok(c.tokens[1].length >= 5 && c.tokens[1].length < N / 2, `the cancelled row stopped after ${c.tokens[1].length} tokens`);
  t.same(Array.from(c.tokens[1]), Array.from(plain.tokens[1].slice(0, c.tokens[1].length)));
  for (const i of [0, 2]) t.same(Array.from(c.tokens[i]), Array.from(plain.tokens[i]), `row ${i} unchanged by the cancellation`);

  // Every row cancelled: the call ends early.
  const all = [new AbortController(), new AbortController(), new AbortController()];
  let n = 0;
  const d = await model.generateStream({
    ...req,
    signals: all.map((a) => a.signal),
    onToken: () => (++n === 6 ? all.forEach((a) => a.abort()) : 0),
  });
  t.same(d.finishReasons, ['cancelled', 'cancelled', 'cancelled']);
  t.ok(d.steps < N / 2, `the call ended after ${d.steps} of ${N} steps`);
  // A signal aborted before the call: the row produces nothing.
  const pre = new AbortController();
  pre.abort();
  const e = await model.generateStream({ prompts: prompts.slice(0, 2), maxNewTokens: 5, greedy: true, signals: [pre.signal, undefined] });
  t.same(e.finishReasons, ['cancelled', 'length']);
  t.equal(e.tokens[0].length, 0);
});

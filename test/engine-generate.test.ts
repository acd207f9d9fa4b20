// Batched generation properties on the tiny fixture: the KV cache agrees with the full forward,
// left padding does not change a row, seeds repeat, top-k 1 is greedy, stops work, and the event
// loop keeps running while the native worker generates.
import t from 'tap';
import { Model } from '../lib/engine/model.js';
import { fixture } from './helpers/shared.js';

const dir = fixture('qwen3', 'tiny-qwen3-f32');
const prompts = [
  Int32Array.from([204, 125, 373, 399, 458]),
  Int32Array.from([17, 300]),
  Int32Array.from([457, 205, 161, 125, 489, 119, 182, 259, 322]),
];

function logSoftmaxRow(data: Float32Array, off: number, V: number): Float64Array {
  let max = -Infinity;
  for (let v = 0; v < V; v++) max = Math.max(max, data[off + v]);
  let s = 0;
  for (let v = 0; v < V; v++) s += Math.exp(data[off + v] - max);
  const out = new Float64Array(V);
  for (let v = 0; v < V; v++) out[v] = data[off + v] - max - Math.log(s);
  return out;
}

t.test('decoding with the KV cache equals the full forward', async (t) => {
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  for (const [temperature, seed] of [
    [0, 0],
    [1.0, 7],
  ] as const) {
    const g = await m.generate({ prompts: [prompts[0]], maxNewTokens: 12, temperature, seed });
    const seq = [...prompts[0], ...g.tokens[0]];
    const full = await m.logits([seq]);
    const V = full.vocab;
    for (let i = 0; i < g.tokens[0].length; i++) {
      const pos = prompts[0].length - 1 + i; // logits at pos predict token pos + 1
      const lsm = logSoftmaxRow(full.data, pos * V, V);
      t.ok(Math.abs(lsm[g.tokens[0][i]] - g.logprobs[0][i]) < 1e-4, `T=${temperature} step ${i}: cached log-prob equals full forward`);
      if (temperature === 0) {
        let best = 0;
        for (let v = 1; v < V; v++) if (lsm[v] > lsm[best]) best = v;
        t.equal(g.tokens[0][i], best, `greedy step ${i} is the argmax of the full forward`);
      }
    }
    // Teacher forcing gives the same log-probs for the generated part.
    const [tf] = await m.sequenceLogprobs([seq]);
    for (let i = 0; i < g.tokens[0].length; i++)
      t.ok(Math.abs(tf[prompts[0].length + i] - g.logprobs[0][i]) < 1e-4, `teacher-forced log-prob ${i}`);
  }
});

t.test('a left-padded batch equals its rows run alone', async (t) => {
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  const batch = await m.generate({ prompts, maxNewTokens: 10, greedy: true });
  for (let i = 0; i < prompts.length; i++) {
    const alone = await m.generate({ prompts: [prompts[i]], maxNewTokens: 10, greedy: true });
    t.same(Array.from(batch.tokens[i]), Array.from(alone.tokens[0]), `row ${i}: same tokens`);
    const d = Math.max(...Array.from(alone.logprobs[0], (x, j) => Math.abs(x - batch.logprobs[i][j])));
    t.ok(d < 1e-4, `row ${i}: log-probs within 1e-4 (${d.toExponential(2)})`);
  }
  // Sampled rows too: per-row random streams make a row independent of its batch-mates.
  const sb = await m.generate({ prompts, maxNewTokens: 10, temperature: 1, seed: 3 });
  const s0 = await m.generate({ prompts: [prompts[0]], maxNewTokens: 10, temperature: 1, seed: 3 });
  t.same(Array.from(sb.tokens[0]), Array.from(s0.tokens[0]), 'sampled row 0 identical alone and in the batch');
});

t.test('the same seed repeats the same samples; another seed differs', async (t) => {
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  const req = { prompts, maxNewTokens: 16, temperature: 1.2, seed: 42 };
  const a = await m.generate(req);
  const b = await m.generate(req);
  const c = await m.generate({ ...req, seed: 43 });
  t.same(
    a.tokens.map((x) => Array.from(x)),
    b.tokens.map((x) => Array.from(x)),
  );
  t.notSame(
    a.tokens.map((x) => Array.from(x)),
    c.tokens.map((x) => Array.from(x)),
  );
});

t.test('rowSeeds: a row samples the same tokens at any position of any batch; bad seeds are refused', async (t) => {
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  const seeds = [901, 17, 5550];
  const fwd = await m.generate({ prompts, maxNewTokens: 12, temperature: 1.3, rowSeeds: seeds });
  // Reversed order, and row 2 alone at position 0.
  const rev = await m.generate({ prompts: [...prompts].reverse(), maxNewTokens: 12, temperature: 1.3, rowSeeds: [...seeds].reverse() });
  const alone = await m.generate({ prompts: [prompts[2]], maxNewTokens: 12, temperature: 1.3, rowSeeds: [seeds[2]] });
  for (let i = 0; i < 3; i++)
    t.same(Array.from(rev.tokens[2 - i]), Array.from(fwd.tokens[i]), `row ${i}: the same samples in reversed position`);
  t.same(Array.from(alone.tokens[0]), Array.from(fwd.tokens[2]), 'row 2 alone = row 2 in the batch');
  // Without rowSeeds the stream is (seed, position): moving a row changes its samples.
  const posA = await m.generate({ prompts, maxNewTokens: 12, temperature: 1.3, seed: 9 });
  const posB = await m.generate({ prompts: [...prompts].reverse(), maxNewTokens: 12, temperature: 1.3, seed: 9 });
  t.notSame(Array.from(posB.tokens[2]), Array.from(posA.tokens[0]), 'the positional streams differ (so the check above can fail)');
  const other = await m.generate({ prompts, maxNewTokens: 12, temperature: 1.3, rowSeeds: [902, 17, 5550] });
  t.notSame(Array.from(other.tokens[0]), Array.from(fwd.tokens[0]), 'another seed, other samples');
  t.same(Array.from(other.tokens[1]), Array.from(fwd.tokens[1]), 'the other rows keep theirs');
  await t.rejects(m.generate({ prompts, maxNewTokens: 4, rowSeeds: [1, 2] }), {
    code: 'ARGUMENT_INVALID',
    message: /one non-negative integer per row \(3\)/,
  });
  await t.rejects(m.generate({ prompts, maxNewTokens: 4, rowSeeds: [1, -2, 3] }), { code: 'ARGUMENT_INVALID' });
});

t.test('top-k 1 equals greedy; per-row temperature 0 is greedy inside a sampled batch', async (t) => {
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  const greedy = await m.generate({ prompts, maxNewTokens: 10, greedy: true });
  const k1 = await m.generate({ prompts, maxNewTokens: 10, temperature: 1.5, topK: 1, seed: 9 });
  t.same(
    k1.tokens.map((x) => Array.from(x)),
    greedy.tokens.map((x) => Array.from(x)),
  );
  const mixed = await m.generate({ prompts, maxNewTokens: 10, temperature: [1.3, 0, 1.3], seed: 5 });
  t.same(Array.from(mixed.tokens[1]), Array.from(greedy.tokens[1]));
  // A tiny top-p keeps only the most likely token, so it is greedy too.
  const p = await m.generate({ prompts, maxNewTokens: 10, temperature: 1, topP: 1e-6, seed: 1 });
  t.same(
    p.tokens.map((x) => Array.from(x)),
    greedy.tokens.map((x) => Array.from(x)),
  );
});

t.test('sampling follows the distribution (chi-square on the first token)', async (t) => {
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  // Temperature 0.3 sharpens the distribution so a few tokens carry most mass.
  const N = 2000;
  const g = await m.generate({ prompts: Array.from({ length: N }, () => prompts[1]), maxNewTokens: 1, temperature: 0.3, seed: 11 });
  const counts = new Map<number, number>();
  for (const r of g.tokens) counts.set(r[0], (counts.get(r[0]) ?? 0) + 1);
  const full = await m.logits([Array.from(prompts[1])]);
  const V = full.vocab;
  const scaled = new Float32Array(V);
  for (let v = 0; v < V; v++) scaled[v] = full.data[(prompts[1].length - 1) * V + v] / 0.3;
  const lsm = logSoftmaxRow(scaled, 0, V);
  let chi = 0;
  let other = 0;
  let otherExp = 0;
  let cells = 0;
  for (let v = 0; v < V; v++) {
    const e = Math.exp(lsm[v]) * N;
    const o = counts.get(v) ?? 0;
    if (e >= 5) {
      chi += (o - e) ** 2 / e;
      cells++;
    } else {
      other += o;
      otherExp += e;
    }
  }
  if (otherExp > 0) {
    chi += (other - otherExp) ** 2 / otherExp;
    cells++;
  }
  // 99.9th percentile of chi-square with k-1 dof ~ k + 3.1*sqrt(2k) + 10 for moderate k (loose bound).
  t.ok(cells > 3, `${cells} cells`);
  t.ok(chi < cells + 3.1 * Math.sqrt(2 * cells) + 10, `chi-square ${chi.toFixed(1)} over ${cells} cells`);
});

t.test('stop token ids and stop strings end a row; others go on', async (t) => {
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  const greedy = await m.generate({ prompts, maxNewTokens: 10, greedy: true });
  const stopId = greedy.tokens[2][3];
  const firstAt = Array.from(greedy.tokens[2]).indexOf(stopId);
  const s = await m.generate({ prompts, maxNewTokens: 10, greedy: true, stopTokenIds: [stopId] });
  t.equal(s.finishReasons[2], 'stop_token');
  t.same(Array.from(s.tokens[2]), Array.from(greedy.tokens[2]).slice(0, firstAt + 1), 'stops after (and includes) the stop token');
  // Stop strings work on the bytes of the tokens: give every id the text "<id>|".
  m.setVocab(Array.from({ length: m.vocabSize }, (_, i) => new TextEncoder().encode(`${i}|`)));
  // A stop string spanning two tokens: "<a>|<b>|" for the pair at positions 2-3 of row 2.
  const g2 = Array.from(greedy.tokens[2]);
  const stop = `${g2[2]}|${g2[3]}|`;
  let end = -1;
  for (let i = 1; i < g2.length && end < 0; i++) if (`${g2[i - 1]}|${g2[i]}|` === stop) end = i;
  const ss = await m.generate({ prompts: [prompts[2]], maxNewTokens: 10, greedy: true, stopStrings: [stop] });
  t.equal(ss.finishReasons[0], 'stop_string');
  t.same(Array.from(ss.tokens[0]), g2.slice(0, end + 1), 'stops right after the token that completes the string');
  const none = await m.generate({ prompts: [prompts[0]], maxNewTokens: 10, greedy: true, stopStrings: ['never-appears'] });
  t.equal(none.finishReasons[0], 'length');
  t.equal(none.tokens[0].length, 10);
});

t.test('generation runs on a worker thread: the event loop keeps turning', async (t) => {
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  let ticks = 0;
  const timer = setInterval(() => ticks++, 1);
  const started = Date.now();
  await m.generate({ prompts: Array.from({ length: 64 }, () => prompts[2]), maxNewTokens: 200, temperature: 1, seed: 1 });
  const elapsed = Date.now() - started;
  clearInterval(timer);
  t.ok(elapsed < 20 || ticks > 2, `timer fired ${ticks} times during ${elapsed} ms of generation`);
});

// The fused CPU sampler (native/core/sampler_cpu.cc) against ATen's tensor path (the CPU kernels
// off: what every other device runs) and against a float64 reference written here from the rules:
// log-probs of softmax(logits / T); greedy = first index of the maximum; top-k keeps the k best and
// top-p is applied to their renormalised probabilities; top-p keeps the best tokens while the mass
// before them is at most p; the token is the first whose cumulative probability reaches u x the kept
// mass (ids in order for plain sampling, best first with top-k or top-p). Peaked and flat rows, the full Qwen3 vocabulary, and batches mixing greedy and sampled rows
// and different top-p values.
import t from 'tap';
import { atEachLevel } from './helpers/isa.js';
import { native } from '../lib/engine/runtime.js';
import { rng } from './helpers/numeric.js';

const a = native();

function logitsRows(rows: number, V: number, scale: number, seed: number): Float32Array {
  const r = rng(seed);
  const out = new Float32Array(rows * V);
  for (let i = 0; i < out.length; i++) {
    // A heavy head: a few ids far above the rest when scale is large (a trained model's shape).
    const g = Math.sqrt(-2 * Math.log(r() + 1e-12)) * Math.cos(2 * Math.PI * r());
    out[i] = g * scale * (r() < 0.002 ? 3 : 1);
  }
  return out;
}

/** The rules, in float64. */
function reference(x: Float32Array, T: number, topK: number, topP: number, u: number): { token: number; logprob: number } {
  const V = x.length;
  const greedy = !(T > 0);
  const s = Array.from(x, (v) => (greedy || T === 1 ? v : Math.fround(v / T)));
  let m = -Infinity,
    arg = 0;
  for (let i = 0; i < V; i++) if (s[i] > m) (m = s[i]), (arg = i);
  let z = 0;
  for (const v of s) z += Math.exp(v - m);
  const lse = m + Math.log(z);
  if (greedy) return { token: arg, logprob: s[arg] - lse };
  // Plain sampling walks the vocabulary in id order; top-k and top-p walk it best first.
  const sorted = (topK > 0 && topK < V) || topP < 1;
  let order = Array.from({ length: V }, (_, i) => i);
  if (sorted) order.sort((i, j) => s[j] - s[i] || i - j);
  let p = order.map((i) => Math.exp(s[i] - lse));
  if (topK > 0 && topK < V) {
    order = order.slice(0, topK);
    p = p.slice(0, topK);
    if (topP < 1) {
      const sum = p.reduce((x, y) => x + y, 0);
      p = p.map((v) => v / sum);
    }
  }
  if (topP < 1) {
    let cum = 0,
      n = p.length;
    for (let j = 0; j < p.length; j++) {
      cum += p[j];
      if (cum - p[j] > topP) {
        n = j;
        break;
      }
    }
    order = order.slice(0, n);
    p = p.slice(0, n);
  }
  const total = p.reduce((x, y) => x + y, 0);
  let cum = 0;
  for (let j = 0; j < p.length; j++) {
    cum += p[j];
    if (cum >= u * total) return { token: order[j], logprob: s[order[j]] - lse };
  }
  return { token: order[order.length - 1], logprob: s[order[order.length - 1]] - lse };
}

interface Case {
  name: string;
  V: number;
  scale: number;
  temperature: number[];
  topK?: number;
  topP?: number[];
  topN?: number;
}
const cases: Case[] = [
  { name: 'greedy', V: 3001, scale: 2, temperature: [0, 0, 0, 0] },
  { name: 'temperature 1', V: 3001, scale: 2, temperature: [1, 1, 1, 1] },
  { name: 'temperature 0.7, flat', V: 3001, scale: 0.3, temperature: [0.7, 0.7, 0.7, 0.7] },
  { name: 'top-k 40', V: 3001, scale: 2, temperature: [1, 0.8, 1, 1.2], topK: 40 },
  { name: 'top-k 40 + top-p 0.9', V: 3001, scale: 2, temperature: [1, 1, 1, 1], topK: 40, topP: [0.9, 0.9, 0.9, 0.9] },
  { name: 'top-p 0.9, peaked', V: 3001, scale: 4, temperature: [1, 1, 1, 1], topP: [0.9, 0.9, 0.9, 0.9] },
  { name: 'top-p 0.5, flat', V: 3001, scale: 0.2, temperature: [1, 1, 1, 1], topP: [0.5, 0.5, 0.5, 0.5] },
  { name: 'per-row top-p with an open row and a greedy row', V: 3001, scale: 2, temperature: [1, 0, 0.9, 1], topP: [1, 0.9, 0.85, 0.99] },
  { name: 'top-k + per-row top-p, open row', V: 3001, scale: 2, temperature: [1, 1, 1, 1], topK: 64, topP: [1, 0.5, 0.95, 1] },
  { name: 'top-n 5 beside sampling', V: 3001, scale: 2, temperature: [1, 0, 1, 1], topN: 5 },
  { name: 'the Qwen3 vocabulary, top-p 0.9', V: 151936, scale: 3, temperature: [1, 0.7], topP: [0.9, 0.9] },
  { name: 'the Qwen3 vocabulary, plain', V: 151936, scale: 1, temperature: [1, 1] },
];

for (const c of cases) {
  atEachLevel(
    t,
    a,
    c.name,
    async (t) => {
      t.teardown(() => a.setCpuKernels(true));
      const B = c.temperature.length;
      const draws = c.V > 10000 ? 3 : 40;
      let checked = 0;
      for (let d = 0; d < draws; d++) {
        const logits = logitsRows(B, c.V, c.scale, 17 + d * 7 + c.V);
        const r = rng(99 + d);
        const u = Array.from({ length: B }, () => 1 - r());
        const req = {
          logits,
          rows: B,
          vocab: c.V,
          temperature: c.temperature,
          u,
          topK: c.topK ?? 0,
          ...(c.topP ? { topP: c.topP } : {}),
          topN: c.topN ?? 0,
        };
        a.setCpuKernels(true);
        const fused = a.sample(req);
        a.setCpuKernels(false);
        const aten = a.sample(req);
        for (let b = 0; b < B; b++) {
          const ref = reference(logits.subarray(b * c.V, (b + 1) * c.V), c.temperature[b], c.topK ?? 0, c.topP?.[b] ?? 1, u[b]);
          if (
            fused.tokens[b] !== ref.token ||
            aten.tokens[b] !== ref.token ||
            Math.abs(fused.logprobs[b] - ref.logprob) > 1e-4 ||
            Math.abs(fused.logprobs[b] - aten.logprobs[b]) > 1e-5
          ) {
            t.fail(
              `draw ${d} row ${b}: fused ${fused.tokens[b]} (${fused.logprobs[b]}), ATen ${aten.tokens[b]} (${aten.logprobs[b]}), float64 ${ref.token} (${ref.logprob})`,
            );
            return;
          }
          checked++;
        }
        if (c.topN) {
          t.same(fused.topIds, aten.topIds, 'top-n ids equal ATen topk');
          for (let i = 0; i < fused.topLogprobs!.length; i++)
            if (Math.abs(fused.topLogprobs![i] - aten.topLogprobs![i]) > 1e-5) t.fail(`top-n log-prob ${i}`);
        }
      }
      t.pass(`${checked} draws: the fused sampler, ATen's path and the float64 rules pick the same token (log-probs within 1e-5)`);
    },
    { withNone: true },
  );
}

// Plain sampling skips whole 64-id chunks (and 2,048-id blocks) whose mass cannot reach the target:
// the token may be in the first chunk, in the tail after the last whole chunk (3001 = 46 x 64 + 57),
// on a chunk or block edge, or the only likely id at either end; u at its extremes.
atEachLevel(
  t,
  a,
  'plain sampling at chunk edges and extremes of u',
  async (t) => {
    t.teardown(() => a.setCpuKernels(true));
    const V = 3001;
    const rows: Array<{ name: string; logits: Float32Array; u: number }> = [];
    const peak = (at: number[]) => {
      const x = new Float32Array(V).fill(-30);
      for (const i of at) x[i] = 0;
      return x;
    };
    rows.push({ name: 'only the last id is likely', logits: peak([V - 1]), u: 0.3 });
    rows.push({ name: 'only the first id is likely', logits: peak([0]), u: 0.99 });
    rows.push({ name: 'two ids on a chunk edge (63, 64), u below half', logits: peak([63, 64]), u: 0.49 });
    rows.push({ name: 'two ids on a chunk edge (63, 64), u above half', logits: peak([63, 64]), u: 0.51 });
    rows.push({ name: 'mass in the tail (2950, 2990)', logits: peak([2950, 2990]), u: 0.75 });
    // Plain sampling reads the row in blocks of 2,048 ids, the maximum so far rescaling the sum: two ids
    // on the block edge, and a ramp whose maximum grows in every block (the sum rescaled each time).
    rows.push({ name: 'two ids on the block edge (2047, 2048), u below half', logits: peak([2047, 2048]), u: 0.49 });
    rows.push({ name: 'two ids on the block edge (2047, 2048), u above half', logits: peak([2047, 2048]), u: 0.51 });
    const ramp = Float32Array.from({ length: V }, (_, i) => i / 300);
    for (const u of [0.05, 0.5, 0.97]) rows.push({ name: `a rising ramp, u ${u}`, logits: ramp, u });
    const flat = logitsRows(1, V, 0.5, 5);
    for (const u of [1e-9, 0.25, 0.999999, 1]) rows.push({ name: `a flat row, u ${u}`, logits: flat, u });
    for (const row of rows) {
      const req = { logits: row.logits, rows: 1, vocab: V, temperature: [1], u: [row.u], topK: 0, topN: 0 };
      a.setCpuKernels(true);
      const fused = a.sample(req);
      a.setCpuKernels(false);
      const aten = a.sample(req);
      const ref = reference(row.logits, 1, 0, 1, row.u);
      t.equal(fused.tokens[0], ref.token, `${row.name}: the float64 rules' token`);
      t.equal(aten.tokens[0], ref.token, `${row.name}: ATen's path agrees`);
    }
  },
  { withNone: true },
);

t.test('a wrong request is a coded error', async (t) => {
  t.throws(() => a.sample({ logits: new Float32Array(5), rows: 2, vocab: 3, temperature: [1, 1], u: [0.5, 0.5] }), {
    code: 'ARGUMENT_INVALID',
  });
  t.throws(
    () => a.sample({ logits: new Float32Array(6), vocab: 3, temperature: [1, 1], u: [0.5, 0.5] } as never),
    { code: 'ARGUMENT_INVALID' },
    'a missing row count',
  );
});

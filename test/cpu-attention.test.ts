// The fused attention of generation (native/core/cpu_attention.cc) against attention computed here
// in float64: decode steps (one query position) and prefills (several, causal, after a cached past),
// grouped-query shapes (1 to 8 query heads per KV head), head sizes 16 to 128, 1 to 300 keys read
// from a larger cache (a view with the cache's strides), padded keys, a fully masked row (uniform
// over the keys, as ATen gives), bfloat16 inputs; ATen's path (CPU kernels off) must agree too, and a
// row's result must not depend on the other rows.
import t from 'tap';
import { native } from '../lib/engine/runtime.js';
import { toBf16, uniform as rand } from './helpers/numeric.js';
import { atEachLevel, cpuLevels } from './helpers/isa.js';

const a = native();
const LOWEST = -3.4028234663852886e38;

interface Case {
  b: number;
  nq: number;
  nkv: number;
  s: number;
  d: number;
  capacity: number;
  t?: number;
}

function reference(c: Case, q: Float32Array, k: Float32Array, v: Float32Array, mask: Float32Array): Float64Array {
  const { b: B, nq, nkv, s: S, d: D, capacity: C } = c;
  const T = c.t ?? 1;
  const R = nq / nkv;
  const out = new Float64Array(B * nq * T * D);
  for (let b = 0; b < B; b++)
    for (let h = 0; h < nq; h++)
      for (let t = 0; t < T; t++) {
        const g = Math.floor(h / R);
        const qo = ((b * nq + h) * T + t) * D;
        const sc = new Float64Array(S);
        for (let j = 0; j < S; j++) {
          let dot = 0;
          for (let d = 0; d < D; d++) dot += q[qo + d] * k[((b * nkv + g) * C + j) * D + d];
          sc[j] = mask[(b * T + t) * S + j] === LOWEST ? -Infinity : dot / Math.sqrt(D);
        }
        const allMasked = sc.every((x) => x === -Infinity);
        const m = allMasked ? 0 : Math.max(...sc);
        const p = Array.from(sc, (x) => (allMasked ? 1 : Math.exp(x - m)));
        const z = p.reduce((x, y) => x + y, 0);
        for (let d = 0; d < D; d++) {
          let acc = 0;
          for (let j = 0; j < S; j++) acc += p[j] * v[((b * nkv + g) * C + j) * D + d];
          out[qo + d] = acc / z;
        }
      }
  return out;
}

function inputs(c: Case, seed: number) {
  const { b: B, nq, nkv, s: S, d: D, capacity: C } = c;
  const T = c.t ?? 1;
  const q = rand(B * nq * T * D, seed, 2),
    k = rand(B * nkv * C * D, seed + 1),
    v = rand(B * nkv * C * D, seed + 2);
  // Row b has its first (b * 3) % S keys padded (left padding), the last row of a multi-row case none;
  // with T query positions (the last T keys), position t sees the keys up to S - T + t (causal).
  const mask = new Float32Array(B * T * S);
  for (let b = 0; b < B; b++)
    for (let t = 0; t < T; t++)
      for (let j = 0; j < S; j++) if ((b < B - 1 && j < (b * 3) % S) || j > S - T + t) mask[(b * T + t) * S + j] = LOWEST;
  return { q, k, v, mask };
}

const cases: Case[] = [
  { b: 1, nq: 2, nkv: 1, s: 1, d: 64, capacity: 1 },
  { b: 3, nq: 8, nkv: 4, s: 37, d: 64, capacity: 50 },
  { b: 2, nq: 4, nkv: 4, s: 200, d: 128, capacity: 256 },
  { b: 4, nq: 16, nkv: 4, s: 129, d: 64, capacity: 129 },
  { b: 2, nq: 8, nkv: 1, s: 300, d: 16, capacity: 310 },
  { b: 5, nq: 6, nkv: 2, s: 17, d: 32, capacity: 20 },
  // Decode steps (one position) with 8 query heads per KV head at head size 128 (Qwen3-4B's head size),
  // and 3 per KV head at head size 48 (three AVX-512 vectors, six AVX2 ones: not a power of two).
  { b: 2, nq: 16, nkv: 2, s: 70, d: 128, capacity: 80 },
  { b: 3, nq: 6, nkv: 2, s: 45, d: 48, capacity: 50 },
  { b: 3, nq: 8, nkv: 4, s: 90, d: 64, capacity: 100, t: 12 },
  { b: 1, nq: 4, nkv: 2, s: 64, d: 32, capacity: 64, t: 64 },
  // The blocked prefill path (4 positions or more, 16 per block): a block's boundary, a partial last
  // block, 8 query heads per KV head with head size 128, head size 48 (three vectors), and 3
  // positions (still one position at a time).
  { b: 2, nq: 4, nkv: 2, s: 20, d: 32, capacity: 24, t: 4 },
  { b: 2, nq: 16, nkv: 2, s: 70, d: 128, capacity: 80, t: 37 },
  { b: 3, nq: 6, nkv: 2, s: 40, d: 48, capacity: 40, t: 20 },
  { b: 2, nq: 4, nkv: 2, s: 30, d: 64, capacity: 30, t: 3 },
  // More than 128 query positions: ATen's path (kernels off) runs them in blocks of 128, each against
  // the keys up to the last one its rows see (qwen3.cc grouped_attention): a whole prefill (three
  // blocks, the last partial) and one after 140 cached positions.
  { b: 2, nq: 4, nkv: 2, s: 300, d: 32, capacity: 300, t: 300 },
  { b: 1, nq: 8, nkv: 4, s: 400, d: 64, capacity: 410, t: 260 },
];

t.test('every instruction-set level the CPU has gets its kernel (the tests below would otherwise only check ATen)', async (t) => {
  t.teardown(() => void a.setCpuIsa('avx512-bf16'));
  const levels = cpuLevels(a, true);
  t.comment(`levels on this CPU: ${levels.join(', ')}`);
  if (process.arch === 'x64') t.ok(levels.includes('avx2'), 'an x86-64 CPU with AVX2 (the CI machines) runs the AVX2 kernel');
  for (const level of levels) {
    a.setCpuIsa(level);
    const isa = a.version().attentionKernel;
    if (level === 'none') t.equal(isa, 'none', 'none: ATen runs attention');
    else t.match(isa, new RegExp(`^${level.replace('-bf16', '')} `), `${level}: attention kernel ${isa}`);
  }
});

atEachLevel(t, a, 'float32: the kernel and ATen agree with float64 attention', async (t) => {
  t.teardown(() => a.setCpuKernels(true));
  for (const [i, c] of cases.entries()) {
    const x = inputs(c, 10 + i);
    const want = reference(c, x.q, x.k, x.v, x.mask);
    for (const on of [true, false]) {
      a.setCpuKernels(on);
      const got = a.attention({ ...c, ...x });
      let worst = 0;
      got.forEach((y, j) => (worst = Math.max(worst, Math.abs(y - want[j]))));
      t.ok(
        worst < 2e-6,
        `${on ? 'kernel' : 'ATen'} b${c.b} nq${c.nq} nkv${c.nkv} t${c.t ?? 1} s${c.s} d${c.d}: worst error ${worst.toExponential(2)}`,
      );
    }
  }
});

atEachLevel(t, a, 'a fully masked row attends uniformly, as ATen does', async (t) => {
  const c = { b: 2, nq: 4, nkv: 2, s: 9, d: 16, capacity: 9 };
  const x = inputs(c, 3);
  x.mask.fill(LOWEST, 0, c.s); // row 0: every key masked
  const want = reference(c, x.q, x.k, x.v, x.mask);
  const got = a.attention({ ...c, ...x });
  t.ok(
    got.every((y, j) => Math.abs(y - want[j]) < 2e-6),
    'the mean of the values over all keys',
  );
});

// Decode steps take two phases (the prefix for 16 rows at a time, then each row's own keys); a row
// that sees no prefix key sends its block of 16 to the one-pass path.
for (const c of [
  { b: 3, nq: 8, nkv: 4, s: 90, d: 64, capacity: 100, t: 1, prefix: 60 },
  { b: 20, nq: 4, nkv: 2, s: 50, d: 48, capacity: 50, t: 1, prefix: 30 },
  { b: 20, nq: 4, nkv: 2, s: 50, d: 32, capacity: 50, t: 1, prefix: 30, hidePrefixFromRow: 17 },
  { b: 2, nq: 4, nkv: 2, s: 40, d: 32, capacity: 40, t: 20, prefix: 15 },
])
  atEachLevel(
    t,
    a,
    `a prefix shared by every row (cascade cache): keys [0, ${c.prefix}) read from row 0 only, ${c.b} rows, ${c.t} query position(s)${c.hidePrefixFromRow ? `, row ${c.hidePrefixFromRow} sees none of it` : ''}`,
    async (t) => {
      t.teardown(() => a.setCpuKernels(true));
      const x = inputs(c, 8);
      // The reference: every row's first `prefix` keys and values are row 0's, and nothing is padded.
      x.mask.fill(0);
      for (let b = 0; b < c.b; b++)
        for (let p = 0; p < c.t; p++) for (let j = c.s - c.t + p + 1; j < c.s; j++) x.mask[(b * c.t + p) * c.s + j] = LOWEST;
      if (c.hidePrefixFromRow)
        for (let p = 0; p < c.t; p++)
          x.mask.fill(LOWEST, (c.hidePrefixFromRow * c.t + p) * c.s, (c.hidePrefixFromRow * c.t + p) * c.s + c.prefix);
      const kv = c.nkv * c.capacity * c.d;
      for (let b = 1; b < c.b; b++)
        for (let g = 0; g < c.nkv; g++)
          for (let j = 0; j < c.prefix; j++)
            for (let d = 0; d < c.d; d++) {
              const o = (g * c.capacity + j) * c.d + d;
              x.k[b * kv + o] = x.k[o];
              x.v[b * kv + o] = x.v[o];
            }
      const want = reference(c, x.q, x.k, x.v, x.mask);
      // Rows 1.. hold NaN where the prefix is: the shared rows must be read instead.
      const k = x.k.slice(),
        v = x.v.slice();
      for (let b = 1; b < c.b; b++)
        for (let g = 0; g < c.nkv; g++)
          k.fill(NaN, b * kv + g * c.capacity * c.d, b * kv + (g * c.capacity + c.prefix) * c.d),
            v.fill(NaN, b * kv + g * c.capacity * c.d, b * kv + (g * c.capacity + c.prefix) * c.d);
      for (const on of [true, false]) {
        a.setCpuKernels(on);
        const got = a.attention({ ...c, ...x, k, v });
        let worst = 0;
        got.forEach((y, j) => (worst = Math.max(worst, Number.isNaN(y) ? Infinity : Math.abs(y - want[j]))));
        t.ok(worst < 2e-6, `${on ? 'kernel' : 'ATen'}: worst error ${worst.toExponential(2)}`);
      }
      a.setCpuKernels(true);
      const r = { q: toBf16(x.q), k: toBf16(x.k), v: toBf16(x.v) };
      const wantBf = reference(c, r.q, r.k, r.v, x.mask);
      const kb = r.k.slice(),
        vb = r.v.slice();
      for (let i = 0; i < k.length; i++) if (Number.isNaN(k[i])) (kb[i] = NaN), (vb[i] = NaN);
      const gotBf = a.attention({ ...c, ...x, ...r, k: kb, v: vb, dtype: 'bfloat16' });
      const bad = Array.from(gotBf).findIndex((y, j) => !(Math.abs(y - wantBf[j]) <= Math.abs(wantBf[j]) * 2 ** -8 + 1e-6));
      t.equal(bad, -1, 'bfloat16 kernel: within one rounding of float64');
      t.throws(() => a.attention({ ...c, ...x, prefix: c.s }), { code: 'ARGUMENT_INVALID', message: /'prefix' must be smaller than s/ });
    },
  );

atEachLevel(t, a, 'a fully masked position inside a prefill block attends uniformly too', async (t) => {
  const c = { b: 2, nq: 4, nkv: 2, s: 24, d: 32, capacity: 24, t: 10 };
  const x = inputs(c, 5);
  x.mask.fill(LOWEST, 3 * c.s, 4 * c.s); // row 0, position 3: every key masked
  const want = reference(c, x.q, x.k, x.v, x.mask);
  const got = a.attention({ ...c, ...x });
  let worst = 0;
  got.forEach((y, j) => (worst = Math.max(worst, Math.abs(y - want[j]))));
  t.ok(worst < 2e-6, `worst error ${worst.toExponential(2)}`);
});

for (const T of [1, 8])
  atEachLevel(t, a, `masked keys are not read by the kernel (the kernel really runs), ${T} query position(s)`, async (t) => {
    t.teardown(() => a.setCpuKernels(true));
    const c = { b: 2, nq: 4, nkv: 2, s: 12, d: 32, capacity: 12, t: T };
    const x = inputs(c, 4);
    for (let p = 0; p < T; p++) for (let j = 0; j < 3; j++) x.mask[p * c.s + j] = LOWEST; // row 0: first 3 keys padding ...
    for (let g = 0; g < c.nkv; g++)
      for (let j = 0; j < 3; j++)
        for (let d = 0; d < c.d; d++) {
          x.k[((0 * c.nkv + g) * c.capacity + j) * c.d + d] = NaN; // ... holding NaN
          x.v[((0 * c.nkv + g) * c.capacity + j) * c.d + d] = NaN;
        }
    const want = reference(
      c,
      x.q,
      x.k.map((y) => (Number.isNaN(y) ? 0 : y)),
      x.v.map((y) => (Number.isNaN(y) ? 0 : y)),
      x.mask,
    );
    a.setCpuKernels(true);
    const got = a.attention({ ...c, ...x });
    t.ok(
      got.every((y, j) => Math.abs(y - want[j]) < 2e-6),
      'kernel: finite and equal to attention without the padded keys',
    );
    a.setCpuKernels(false);
    t.ok(
      a
        .attention({ ...c, ...x })
        .slice(0, c.nq * c.d)
        .some(Number.isNaN),
      'ATen: the NaN leaks (0 x NaN), so the first result came from the kernel',
    );
  });

for (const T of [1, 20])
  atEachLevel(t, a, `a row's result does not depend on the other rows, ${T} query position(s)`, async (t) => {
    const c = { b: 4, nq: 8, nkv: 4, s: 50, d: 64, capacity: 64, t: T };
    const x = inputs(c, 7);
    const all = a.attention({ ...c, ...x });
    const per = c.nq * c.d * T,
      kv = c.nkv * c.capacity * c.d;
    for (const b of [0, 2]) {
      const one = a.attention({
        ...c,
        b: 1,
        q: x.q.slice(b * per, (b + 1) * per),
        k: x.k.slice(b * kv, (b + 1) * kv),
        v: x.v.slice(b * kv, (b + 1) * kv),
        mask: x.mask.slice(b * c.s * T, (b + 1) * c.s * T),
      });
      t.same(Array.from(one), Array.from(all.slice(b * per, (b + 1) * per)), `row ${b} alone: bit for bit`);
    }
  });

atEachLevel(t, a, 'bfloat16: attention of the rounded inputs, rounded once', async (t) => {
  t.teardown(() => a.setCpuKernels(true));
  for (const [i, c] of cases.entries()) {
    const x = inputs(c, 30 + i);
    const r = { q: toBf16(x.q), k: toBf16(x.k), v: toBf16(x.v), mask: x.mask };
    const want = reference(c, r.q, r.k, r.v, r.mask);
    a.setCpuKernels(true);
    const got = a.attention({ ...c, ...r, dtype: 'bfloat16' });
    const bad = Array.from(got).findIndex((y, j) => Math.abs(y - want[j]) > Math.abs(want[j]) * 2 ** -8 + 1e-6);
    t.equal(
      bad,
      -1,
      `kernel b${c.b} nq${c.nq} t${c.t ?? 1} s${c.s} d${c.d}: within one bfloat16 rounding of float64${bad >= 0 ? ` (at ${bad}: ${got[bad]} vs ${want[bad]})` : ''}`,
    );
    a.setCpuKernels(false);
    const aten = a.attention({ ...c, ...r, dtype: 'bfloat16' });
    let worst = 0;
    aten.forEach((y, j) => (worst = Math.max(worst, Math.abs(y - want[j]))));
    t.ok(worst < 0.05, `ATen (scores and probabilities rounded to bfloat16 too): worst error ${worst.toExponential(2)}`);
  }
});

t.test('a wrong request is a coded error', async (t) => {
  const c = { b: 1, nq: 2, nkv: 1, s: 4, d: 16 };
  const x = inputs({ ...c, capacity: 4 }, 1);
  t.throws(() => a.attention({ ...c, ...x, nq: 3 }), { code: 'ARGUMENT_INVALID' }, 'nq not a multiple of nkv');
  t.throws(() => a.attention({ ...c, ...x, q: x.q.slice(1) }), {
    code: 'ARGUMENT_INVALID',
    message: /'q' must be a Float32Array of 32 values/,
  });
  t.throws(() => a.attention({ ...c, ...x, dtype: 'float16' as never }), { code: 'ARGUMENT_INVALID', message: /dtype/ });
  t.throws(() => a.attention({ ...c, ...x, s: 0 }), { code: 'ARGUMENT_INVALID', message: /'s' must be a positive integer/ });
  t.throws(
    () => a.attention({ ...c, ...x, t: 2 }),
    { code: 'ARGUMENT_INVALID', message: /'q' must be a Float32Array of 64 values/ },
    'two query positions need twice the queries',
  );
});

// The decode step's RMSNorm, per-head RMSNorm + RoPE and SiLU-gate kernels (core/cpu_norm.cc) against ATen's
// operations (the model's path everywhere else), at every instruction-set level this CPU has and the
// plain one. Where the sum of squares is exact in every order (inputs k/8 with |k| <= 32), the kernel
// must give ATen's bits: the same products, the same roundings to bfloat16 (to nearest, ties to
// even: random bfloat16 weights times bfloat16-exact values hit ties), the same rsqrt. On random
// inputs the sum's order may move a rounding by one unit: at most one bfloat16 step, and rarely. The
// gate's exp is the kernels' own (within 2 ulp of expf), so there the bound is a tolerance, not bits.
import t, { type Test } from 'tap';
import { native } from '../lib/engine/runtime.js';
import { atEachLevel, cpuLevels } from './helpers/isa.js';
import { rng, toBf16, uniform } from './helpers/numeric.js';

const a = native();
const dtypes = ['float32', 'bfloat16'] as const;

/** Values k/8, |k| <= 32: exact in bfloat16, their squares' sums exact in float32 in any order. */
function exactSum(n: number, seed: number): Float32Array {
  const r = rng(seed);
  return Float32Array.from({ length: n }, () => (Math.floor(r() * 65) - 32) / 8);
}

const bits = (x: Float32Array) => new Uint32Array(x.buffer, x.byteOffset, x.length);
function sameBits(x: Float32Array, y: Float32Array): number {
  const bx = bits(x),
    by = bits(y);
  let diff = 0;
  for (let i = 0; i < bx.length; i++) if (bx[i] !== by[i]) diff++;
  return diff;
}

type Req = Parameters<typeof a.norm>[0];
/** The kernel's result (asserting it ran) and ATen's (kernels off) for the same request. */
function both(t: Test, req: Req): { k: Float32Array; ref: Float32Array } {
  const k = a.norm(req);
  t.ok(k.kernel, 'the kernel ran');
  a.setCpuKernels(false);
  try {
    const ref = a.norm(req);
    t.notOk(ref.kernel, "with the CPU kernels off, ATen's operations ran");
    return { k: k.y, ref: ref.y };
  } finally {
    a.setCpuKernels(true);
  }
}

// RMSNorm shapes: the model's hidden size, and sizes that leave a tail after 16 and after 8 lanes.
const normShapes = [
  { rows: 16, d: 512 },
  { rows: 3, d: 40 },
  { rows: 2, d: 7 },
];
// Per-head shapes: Qwen3's head size (half a multiple of the lanes), and one whose half is not; one
// position per row (a decode step) and several (a prefill, each position its own angles).
const ropeShapes = [
  { rows: 16, positions: 1, heads: 8, d: 64 },
  { rows: 2, positions: 1, heads: 3, d: 24 },
  { rows: 3, positions: 5, heads: 4, d: 64 },
  { rows: 2, positions: 7, heads: 3, d: 24 },
];

atEachLevel(
  t,
  a,
  "RMSNorm: ATen's bits when the sum of squares is exact",
  async (t) => {
    for (const dtype of dtypes)
      for (const { rows, d } of normShapes) {
        const { k, ref } = both(t, { x: exactSum(rows * d, rows + d), w: uniform(d, d, 2), rows, d, dtype });
        t.equal(sameBits(k, ref), 0, `${dtype} rows ${rows} d ${d}: every element ATen's`);
      }
  },
  { withNone: true },
);

atEachLevel(
  t,
  a,
  "q/k norm + RoPE, and RoPE alone: ATen's bits when the sum of squares is exact",
  async (t) => {
    for (const dtype of dtypes)
      for (const { rows, positions, heads, d } of ropeShapes)
        for (const withNorm of [true, false]) {
          const angles = uniform(rows * positions * d, 7 * d + positions, 3);
          const req: Req = {
            x: exactSum(rows * positions * heads * d, heads * d + positions),
            w: withNorm ? uniform(d, 3 * d, 2) : undefined,
            cos: Float32Array.from(angles, Math.cos),
            sin: Float32Array.from(angles, Math.sin),
            rows,
            positions,
            heads,
            d,
            dtype,
          };
          const { k, ref } = both(t, req);
          t.equal(
            sameBits(k, ref),
            0,
            `${dtype} ${rows}x${positions}x${heads}x${d} ${withNorm ? 'norm + RoPE' : 'RoPE alone'}: every element ATen's`,
          );
        }
  },
  { withNone: true },
);

atEachLevel(
  t,
  a,
  'q/k norm + RoPE of a prefill: each position as the same row alone in a decode step, bit for bit',
  async (t) => {
    for (const dtype of dtypes) {
      const rows = 3,
        positions = 6,
        heads = 8,
        d = 64;
      const x = uniform(rows * positions * heads * d, 21, 4),
        w = uniform(d, 22, 2),
        angles = uniform(rows * positions * d, 23, 3);
      const cos = Float32Array.from(angles, Math.cos),
        sin = Float32Array.from(angles, Math.sin);
      const all = a.norm({ x, w, cos, sin, rows, positions, heads, d, dtype });
      t.ok(all.kernel, 'the kernel ran on the prefill');
      let diff = 0;
      for (let r = 0; r < rows; r++)
        for (let p = 0; p < positions; p++) {
          const i = r * positions + p;
          const one = a.norm({
            x: x.subarray(i * heads * d, (i + 1) * heads * d),
            w,
            cos: cos.subarray(i * d, (i + 1) * d),
            sin: sin.subarray(i * d, (i + 1) * d),
            rows: 1,
            heads,
            d,
            dtype,
          });
          diff += sameBits(one.y, all.y.subarray(i * heads * d, (i + 1) * heads * d));
        }
      t.equal(diff, 0, `${dtype}: every (row, position) of the prefill equals its decode step's values`);
    }
  },
  { withNone: true },
);

atEachLevel(
  t,
  a,
  'random inputs: within one rounding of ATen, nearly always equal',
  async (t) => {
    for (const dtype of dtypes) {
      const rows = 16,
        d = 512;
      const { k, ref } = both(t, { x: uniform(rows * d, 11, 4), w: uniform(d, 12, 2), rows, d, dtype });
      // float32: another order of the 512 squares' sum (ATen's pairwise, the kernel's 16 or 8 lanes, the
      // plain level's one by one) moves it, and rsqrt, by a few units in the last place (measured: up to
      // 5.7e-7 relative, the plain level); bfloat16: a rounding may flip to the neighbouring value (one
      // step of 2^-8 relative, twice: x * inv, then w * that).
      const tol = dtype === 'float32' ? 2e-6 : 2 ** -7;
      let worst = 0;
      for (let i = 0; i < k.length; i++) worst = Math.max(worst, Math.abs(k[i] - ref[i]) / Math.max(Math.abs(ref[i]), 1e-30));
      t.ok(worst <= tol, `${dtype}: worst relative difference ${worst.toExponential(2)} <= ${tol.toExponential(2)}`);
      if (dtype === 'bfloat16') t.ok(sameBits(k, ref) <= k.length / 100, `${dtype}: ${sameBits(k, ref)} of ${k.length} elements differ`);
    }
  },
  { withNone: true },
);

atEachLevel(
  t,
  a,
  'a NaN stays in its own row',
  async (t) => {
    for (const dtype of dtypes) {
      const rows = 3,
        d = 40;
      const x = exactSum(rows * d, 5);
      x[d + 17] = Number.NaN;
      const { k, ref } = both(t, { x, w: uniform(d, 6, 2), rows, d, dtype });
      t.ok(
        k.subarray(d, 2 * d).every((v) => Number.isNaN(v)),
        `${dtype}: row 1 all NaN`,
      );
      t.equal(
        sameBits(k.subarray(0, d), ref.subarray(0, d)) + sameBits(k.subarray(2 * d), ref.subarray(2 * d)),
        0,
        `${dtype}: rows 0 and 2 ATen's`,
      );
    }
  },
  { withNone: true },
);

/**
 * silu(g) * u computed once in float32 as PyTorch 2's silu does (double here, then rounded to float32:
 * within an ulp of float32 arithmetic), each result rounded to the dtype: the reference.
 */
function siluMulRef(g: Float32Array, u: Float32Array, dtype: 'float32' | 'bfloat16'): Float32Array {
  const round = (v: Float32Array) => (dtype === 'bfloat16' ? toBf16(v) : v);
  const s = round(Float32Array.from(g, (x) => x / (1 + Math.exp(-x))));
  return round(Float32Array.from(s, (v, i) => v * u[i]));
}

function worstRelative(x: Float32Array, ref: Float32Array): number {
  let worst = 0;
  for (let i = 0; i < x.length; i++) worst = Math.max(worst, Math.abs(x[i] - ref[i]) / Math.max(Math.abs(ref[i]), 1e-30));
  return worst;
}

atEachLevel(
  t,
  a,
  'SiLU gate: silu(g) * u as PyTorch 2 computes it',
  async (t) => {
    // n = 1536 (the small preset's MLP), and 37: a tail after 16 and after 8 lanes.
    for (const dtype of dtypes)
      for (const n of [1536, 37]) {
        const rows = 16;
        const g = toBf16(uniform(rows * n, n, 12)),
          u = toBf16(uniform(rows * n, n + 1, 3));
        const k = a.siluMul({ g, u, rows, n, dtype });
        t.ok(k.kernel, 'the kernel ran');
        const ref = siluMulRef(g, u, dtype);
        // float32: the kernel's exp is within 2 ulp of expf, then a division and a product; bfloat16: a
        // rounding may flip to the neighbouring value (2^-8 relative), rarely (measured: never here).
        const tol = dtype === 'float32' ? 1e-6 : 2 ** -7;
        t.ok(worstRelative(k.y, ref) <= tol, `${dtype} n ${n}: worst relative difference ${worstRelative(k.y, ref).toExponential(2)}`);
        if (dtype === 'bfloat16')
          t.ok(sameBits(k.y, ref) <= k.y.length / 1000, `${dtype} n ${n}: ${sameBits(k.y, ref)} of ${k.y.length} differ`);
        // ATen's at::silu(g) * u (the kernels off): float32 the same arithmetic; libtorch 1.13 rounds a
        // bfloat16 silu to bfloat16 after each operation (exp, 1 + e, the division: measured 5,121 of
        // 24,576 values one to a few steps away, the largest 1.4 % relative), PyTorch 2 once, at the end.
        a.setCpuKernels(false);
        const aten = a.siluMul({ g, u, rows, n, dtype });
        a.setCpuKernels(true);
        t.notOk(aten.kernel, "with the CPU kernels off, ATen's operations ran");
        const atenTol = dtype === 'float32' ? 1e-6 : 2 ** -5;
        t.ok(
          worstRelative(k.y, aten.y) <= atenTol,
          `${dtype} n ${n}: within ${atenTol} of ATen (${worstRelative(k.y, aten.y).toExponential(2)})`,
        );
      }
  },
  { withNone: true },
);

t.test('SiLU gate: a row gets the same values alone and in a batch, at every level', async (t) => {
  const n = 37;
  const before = a.version().cpuIsa; // the level in force (SLM_TRAIN_CPU_ISA may cap it), restored after
  t.teardown(() => void a.setCpuIsa(before));
  for (const level of cpuLevels(a, true)) {
    t.equal(a.setCpuIsa(level), level, `the kernels run at ${level}`);
    for (const dtype of dtypes) {
      const g = uniform(5 * n, 3, 12),
        u = uniform(5 * n, 4, 3);
      const all = a.siluMul({ g, u, rows: 5, n, dtype }).y;
      for (const r of [0, 4]) {
        const one = a.siluMul({ g: g.slice(r * n, (r + 1) * n), u: u.slice(r * n, (r + 1) * n), rows: 1, n, dtype }).y;
        t.equal(sameBits(one, all.slice(r * n, (r + 1) * n)), 0, `${level} ${dtype}: row ${r} alone = in the batch`);
      }
    }
  }
});

t.test('bad requests get a coded error', async (t) => {
  t.throws(() => a.norm({ x: new Float32Array(8), rows: 2, d: 4 }), { code: 'ARGUMENT_INVALID' }, 'RMSNorm without w');
  t.throws(
    () => a.norm({ x: new Float32Array(7), w: new Float32Array(4), rows: 2, d: 4 }),
    { code: 'ARGUMENT_INVALID' },
    'x of the wrong length',
  );
});

// The CPU kernels for linear layers over a few rows (native/core/cpu_gemm.cc), checked against dot
// products computed here in float64: every row count from 1 to 32 and a few up to 256 (tiles of 4 and the 1-3 row
// remainders), output sizes that are and are not multiples of the 4-row weight tile, and input sizes
// with and without a remainder after the 16-float (32 for bfloat16) steps. The same product through
// at::linear (kernels forbidden) must agree too, and a row's result must not depend on the other rows.
import t from 'tap';
import { existsSync, readFileSync } from 'node:fs';
import { CPU_ISA_LEVELS, type CpuIsaLevel } from '../lib/binding/types.js';
import { native } from '../lib/engine/runtime.js';
import { toBf16, uniform as rand } from './helpers/numeric.js';
import { atEachLevel, cpuLevels } from './helpers/isa.js';

const a = native();

function reference(x: Float32Array, w: Float32Array, m: number, n: number, k: number): { y: Float64Array; mag: Float64Array } {
  const y = new Float64Array(m * n),
    mag = new Float64Array(m * n);
  for (let i = 0; i < m; i++)
    for (let j = 0; j < n; j++) {
      let s = 0,
        g = 0;
      for (let q = 0; q < k; q++) {
        s += x[i * k + q] * w[j * k + q];
        g += Math.abs(x[i * k + q] * w[j * k + q]);
      }
      y[i * n + j] = s;
      mag[i * n + j] = g;
    }
  return { y, mag };
}

/** Largest |got - want| / (sum of |products|), the scale-free error of a dot product. */
function worst(got: Float32Array, want: Float64Array, mag: Float64Array): number {
  let e = 0;
  for (let i = 0; i < got.length; i++) e = Math.max(e, Math.abs(got[i] - want[i]) / Math.max(mag[i], 1e-30));
  return e;
}

const isa = a.version().smallLinear;
t.comment(`small-row linear kernels on this CPU: ${isa}`);

t.test('a CPU with AVX2 gets a kernel at each level it has (the tests below would otherwise only check at::linear)', async (t) => {
  t.teardown(() => void a.setCpuIsa('avx512-bf16'));
  // The CPU's flags: /proc/cpuinfo's, or the emulated CPU's where test/cpu-emulated-avx2 runs this file
  // under QEMU (whose /proc/cpuinfo is the host's).
  const flags = process.env.SLM_TRAIN_TEST_CPU_FLAGS ?? (existsSync('/proc/cpuinfo') ? readFileSync('/proc/cpuinfo', 'utf8') : '');
  if (process.arch !== 'x64' || !/\bavx2\b/.test(flags)) {
    t.comment('not an x86-64 CPU with AVX2: no kernel expected');
    return;
  }
  // What the CPU has, from its flags, whatever the environment caps.
  const v = a.version();
  t.not(v.cpuIsaDetected, 'none');
  if (/\bavx512f\b/.test(flags)) t.match(v.cpuIsaDetected, /^avx512/);
  if (/\bavx512_bf16\b/.test(flags)) t.equal(v.cpuIsaDetected, 'avx512-bf16');
  if (!/\bavx512f\b/.test(flags) && /\bfma\b/.test(flags)) t.equal(v.cpuIsaDetected, 'avx2', 'AVX2 and FMA without AVX-512');
  // The level the addon starts at: the lower of that and SLM_TRAIN_CPU_ISA (how an AVX-512 machine
  // runs the suite as an AVX2 one would), and the small-row kernel of that level.
  const cap = (process.env.SLM_TRAIN_CPU_ISA || v.cpuIsaDetected) as CpuIsaLevel;
  const want = CPU_ISA_LEVELS[Math.max(CPU_ISA_LEVELS.indexOf(cap), CPU_ISA_LEVELS.indexOf(v.cpuIsaDetected))];
  t.equal(v.cpuIsa, want, `cap ${process.env.SLM_TRAIN_CPU_ISA || 'none set'} on a CPU with ${v.cpuIsaDetected}: ${v.cpuIsa}`);
  t.match(isa, want === 'none' ? /^none$/ : new RegExp(`^${want} \\(float32; bfloat16`), `its kernel: ${isa}`);
  if (want === 'avx512-bf16') t.match(isa, /bfloat16 dot products/);
  for (const level of cpuLevels(a, true)) {
    a.setCpuIsa(level);
    const k = a.version().smallLinear;
    if (level === 'none') t.equal(k, 'none', 'none: at::linear');
    else t.match(k, new RegExp(`^${level} \\(float32; bfloat16`), `${level}: ${k}`);
  }
});

atEachLevel(t, a, 'float32: every row count 1..32 and ragged sizes agree with float64 dot products', async (t) => {
  t.teardown(() => a.setCpuKernels(true));
  let shapes = 0;
  for (const [n, k] of [
    [37, 53],
    [64, 48],
    [6, 16],
    [5, 100],
    [130, 512],
    [23, 1300],
    // Split between the threads (the kernel's shares come off a counter): 334 tiles of three rows, the
    // last one ragged, in shares of 1 to 83 tiles; every row checked against float64.
    [1001, 96],
    // Fewer than 8 values per row: no vector step, only the tail (above 8 rows the packed copy of x is empty).
    [19, 5],
  ] as const) {
    const w = rand(n * k, 7 + n + k);
    for (const m of [...Array.from({ length: 32 }, (_, i) => i + 1), 47, 130, 256]) {
      shapes++;
      const x = rand(m * k, 1000 + m * 31 + k);
      const ref = reference(x, w, m, n, k);
      a.setCpuKernels(true);
      const y = a.linear({ x, w, m, n, k });
      a.setCpuKernels(false);
      const yBlas = a.linear({ x, w, m, n, k });
      const e = worst(y, ref.y, ref.mag),
        eBlas = worst(yBlas, ref.y, ref.mag);
      if (!(e < 1e-6) || !(eBlas < 1e-6)) {
        t.fail(`m ${m} n ${n} k ${k}: kernel error ${e}, at::linear error ${eBlas}`);
        return;
      }
    }
  }
  t.pass(`float32 within 1e-6 of float64 (relative to the sum of |products|) for ${shapes} shapes, kernel and at::linear`);
});

// A few rows take their own kernel (whole weight rows, rows_256 / rows_512 / rows_bf16_512: one row,
// or two, but one where bfloat16 is widened): 29 x 75 stays on one thread
// with a ragged last group of rows and a remainder after the vector steps; 1001 x 512 is split between
// threads at a row that is not a multiple of the kernels' groups. Groups of 2-5 rows cross each level's
// boundary between the row kernels and the tiles. 61 x 1300: a k longer than the presets' hidden sizes
// (64, 512), with a remainder after every level's vector steps (8, 16, 32 values); 23 x 95 another
// (7, 15 and 31 values left).
atEachLevel(t, a, "a row's result does not depend on the rest of the batch", async (t) => {
  for (const [n, k] of [
    [29, 75],
    [23, 95],
    [1001, 512],
    [61, 1300],
  ] as const) {
    const w = rand(n * k, 3);
    const x = rand(32 * k, 4);
    for (const dtype of ['float32', 'bfloat16'] as const) {
      const full = a.linear({ x, w, m: 32, n, k, dtype });
      for (const r of [0, 5, 31]) {
        const one = a.linear({ x: x.subarray(r * k, (r + 1) * k).slice(), w, m: 1, n, k, dtype });
        t.same(
          Array.from(one),
          Array.from(full.subarray(r * n, (r + 1) * n)),
          `${dtype} ${n} x ${k}: row ${r} alone equals row ${r} of 32, bit for bit`,
        );
      }
      for (const [r, m] of [
        [3, 2],
        [10, 3],
        [20, 4],
        [26, 5],
      ]) {
        const some = a.linear({ x: x.subarray(r * k, (r + m) * k).slice(), w, m, n, k, dtype });
        t.same(
          Array.from(some),
          Array.from(full.subarray(r * n, (r + m) * n)),
          `${dtype} ${n} x ${k}: rows ${r}-${r + m - 1} (${m} rows) equal those of 32, bit for bit`,
        );
      }
    }
  }
});

atEachLevel(t, a, 'bfloat16: products of the rounded inputs, rounded once', async (t) => {
  t.teardown(() => a.setCpuKernels(true));
  for (const [n, k] of [
    [37, 77],
    [64, 64],
    [9, 31],
    [130, 512],
  ] as const) {
    const w = rand(n * k, 11 + k);
    // 300 rows: above the small-row kernel, ATen, or on CPUs without bfloat16 dot products BLAS in float32 (cpu_linear_widened).
    for (const m of [1, 3, 4, 16, 17, 32, 300]) {
      const x = rand(m * k, 5 + m);
      const ref = reference(toBf16(x), toBf16(w), m, n, k);
      a.setCpuKernels(true);
      const y = a.linear({ x, w, m, n, k, dtype: 'bfloat16' });
      a.setCpuKernels(false);
      const yRef = a.linear({ x, w, m, n, k, dtype: 'bfloat16' });
      // One bfloat16 rounding of the result: half an ulp is 2^-9 of its magnitude (plus float32 sums).
      for (let i = 0; i < y.length; i++) {
        const tol = Math.abs(ref.y[i]) * 2 ** -8 + ref.mag[i] * 1e-6;
        if (!(Math.abs(y[i] - ref.y[i]) <= tol) || !(Math.abs(yRef[i] - ref.y[i]) <= tol)) {
          t.fail(`m ${m} n ${n} k ${k} [${i}]: kernel ${y[i]}, at::linear ${yRef[i]}, float64 ${ref.y[i]}`);
          return;
        }
      }
    }
  }
  t.pass('bfloat16 within one rounding of the float64 product of the rounded inputs, kernel and at::linear');
});

// A decode loop's vocabulary head asks for float32 logits written into one buffer reused every step
// (Qwen3Model::logits): the values must be the layer's own output widened, bit for bit (bfloat16:
// rounded to bfloat16 first, as training's head rounds them), and the addon checks they landed in
// the buffer.
// With the kernels off, the head's fallback (ATen) must equal the plain layer's too.
atEachLevel(t, a, 'the head path: float32 into a reused buffer, equal to the plain output', async (t) => {
  t.teardown(() => a.setCpuKernels(true));
  for (const kernels of [true, false])
    for (const dtype of ['float32', 'bfloat16'] as const) {
      a.setCpuKernels(kernels);
      for (const [m, n, k] of [
        [16, 151, 64],
        [3, 37, 77],
        [1, 4, 32],
      ] as const) {
        const x = rand(m * k, 21 + m),
          w = rand(n * k, 22 + n);
        const plain = a.linear({ x, w, m, n, k, dtype });
        const head = a.linear({ x, w, m, n, k, dtype, head: true });
        t.same(Array.from(head), Array.from(plain), `kernels ${kernels ? 'on' : 'off'}, ${dtype} m ${m} n ${n} k ${k}: bit for bit`);
      }
    }
});

t.test('a wrong request is a coded error', async (t) => {
  t.throws(() => a.linear({ x: new Float32Array(3), w: new Float32Array(4), m: 1, n: 2, k: 2 }), { code: 'ARGUMENT_INVALID' });
  t.throws(() => a.setCpuKernels(1 as unknown as boolean), { code: 'ARGUMENT_INVALID' });
  t.throws(
    () => a.linear({ x: new Float32Array(4), w: new Float32Array(4), n: 2, k: 2 } as never),
    { code: 'ARGUMENT_INVALID' },
    'a missing size',
  );
  t.throws(
    () => a.linear({ x: new Float32Array(4), w: new Float32Array(4), m: 2, n: 2, k: 2, dtype: 'float16' as never }),
    { code: 'ARGUMENT_INVALID', message: /float16/ },
    'an unsupported dtype is named',
  );
});

// A decode step through the CPU kernels (fused RMSNorm, q/k norm + RoPE and attention; small-row
// linear layers; the fused sampler) against the same step through ATen's operations (CPU kernels
// off) and against the teacher-forced forward (always ATen): Qwen3 (q/k norms) and Llama (none,
// RoPE only), float32 and bfloat16, prompts of different lengths (left padding), norm weights and
// biases drawn at random so that a mishandled weight shows.
import t from 'tap';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Model } from '../lib/engine/model.js';
import { native } from '../lib/engine/runtime.js';
import { initModel } from '../lib/model/init.js';
import { atEachLevel } from './helpers/isa.js';

const a = native();
const root = mkdtempSync(join(tmpdir(), 'slm-decode-step-'));
t.teardown(() => rmSync(root, { recursive: true, force: true }));
const prompts = [
  Int32Array.from([204, 125, 373, 399, 458, 17, 33]),
  Int32Array.from([17, 300]),
  Int32Array.from([457, 205, 161, 125, 489, 119, 182, 259, 322, 5, 6, 7]),
];

for (const modelType of ['qwen3', 'llama']) {
  const dir = join(root, modelType);
  initModel({ preset: 'tiny', out: dir, modelType, seed: 3, embedStd: 0.5, biasStd: 0.1, normStd: 0.2 });
  for (const dtype of ['float32', 'bfloat16'] as const) {
    atEachLevel(t, a, `${modelType} ${dtype}: kernels vs ATen vs the teacher-forced forward`, async (t) => {
      const m = await Model.load(dir, { dtype });
      t.teardown(() => {
        a.setCpuKernels(true);
        m.dispose();
      });
      const run = async (on: boolean) => {
        a.setCpuKernels(on);
        return m.generate({ prompts, maxNewTokens: 24, greedy: true });
      };
      const fused = await run(true);
      const aten = await run(false);
      // bfloat16: the kernels keep scores and probabilities in float32 where ATen rounds them (measured
      // here: within 1e-5 on this model), so a few thousandths is already a loose bound.
      const tol = dtype === 'float32' ? 2e-5 : 5e-3;
      for (let i = 0; i < prompts.length; i++) {
        // bfloat16: the ATen path rounds scores and probabilities to bfloat16, the kernel does not,
        // so a near tie may pick another token; compare up to the first difference.
        let n = 0;
        while (n < fused.tokens[i].length && fused.tokens[i][n] === aten.tokens[i][n]) n++;
        if (dtype === 'float32') t.equal(n, fused.tokens[i].length, `row ${i}: the same greedy tokens`);
        else t.ok(n >= 16, `row ${i}: the same first ${n} greedy tokens (at least 16 of ${fused.tokens[i].length})`);
        const worst = Math.max(...Array.from({ length: n }, (_, j) => Math.abs(fused.logprobs[i][j] - aten.logprobs[i][j])));
        t.ok(worst < tol, `row ${i}: log-probs within ${tol} of ATen's (worst ${worst.toExponential(2)})`);
        const seq = [...prompts[i], ...fused.tokens[i]];
        const [tf] = await m.sequenceLogprobs([seq]);
        const gap = Math.max(...Array.from(fused.logprobs[i], (x, j) => Math.abs(x - tf[prompts[i].length + j])));
        t.ok(gap < tol, `row ${i}: within ${tol} of the teacher-forced log-probs (worst ${gap.toExponential(2)})`);
      }
    });
  }
}

// 80 rows: enough that a step's RMSNorms (80 x 64 values) and q/k norm + RoPE (320 and 160 head rows)
// are split between the threads; every row must still equal ATen's path.
atEachLevel(t, a, 'qwen3 float32, 80 rows: the norms split between threads, kernels vs ATen', async (t) => {
  const dir = join(root, 'qwen3');
  const m = await Model.load(dir, { dtype: 'float32' });
  t.teardown(() => {
    a.setCpuKernels(true);
    m.dispose();
  });
  const many = Array.from({ length: 80 }, (_, r) => Int32Array.from({ length: 3 + (r % 9) }, (_, i) => ((r * 37 + i * 101) % 490) + 5));
  a.setCpuKernels(true);
  const fused = await m.generate({ prompts: many, maxNewTokens: 8, greedy: true });
  a.setCpuKernels(false);
  const aten = await m.generate({ prompts: many, maxNewTokens: 8, greedy: true });
  let worst = 0;
  for (let i = 0; i < many.length; i++) {
    t.same(fused.tokens[i], aten.tokens[i], `row ${i}: the same greedy tokens`);
    for (let j = 0; j < fused.logprobs[i].length; j++) worst = Math.max(worst, Math.abs(fused.logprobs[i][j] - aten.logprobs[i][j]));
  }
  t.ok(worst < 2e-5, `log-probs within 2e-5 of ATen's (worst ${worst.toExponential(2)})`);
});

// Plumbing: a prefill (several positions per row), not only a decode step, goes through the fused
// RMSNorm, q/k norm + RoPE and SiLU-gate kernels, counted by the addon per call and per position. Per
// forward of B rows x T positions through L layers: 2L + 1 RMSNorms (two per layer, the final one),
// 2L norm + RoPE calls (q and k), L gates, each over B x T positions. Three rows of different lengths
// with different first tokens (no shared prefix), left-padded to the longest.
t.test('a prefill and each decode step go through the fused norm kernels (counted), none with the kernels off', async (t) => {
  const dir = join(root, 'qwen3');
  for (const dtype of ['float32', 'bfloat16'] as const) {
    const m = await Model.load(dir, { dtype });
    const L = m.config.num_hidden_layers;
    const B = prompts.length,
      T = Math.max(...prompts.map((p) => p.length));
    const delta = async (maxNewTokens: number) => {
      const before = a.cpuNormCounts();
      await m.generate({ prompts, maxNewTokens, greedy: true });
      const after = a.cpuNormCounts();
      const d = (k: keyof typeof before) => ({
        calls: after[k].calls - before[k].calls,
        positions: after[k].positions - before[k].positions,
      });
      return { rmsNorm: d('rmsNorm'), normRope: d('normRope'), siluMul: d('siluMul') };
    };
    try {
      a.setCpuKernels(true);
      const forwards = (steps: number) => ({
        rmsNorm: { calls: (2 * L + 1) * (1 + steps), positions: (2 * L + 1) * B * (T + steps) },
        normRope: { calls: 2 * L * (1 + steps), positions: 2 * L * B * (T + steps) },
        siluMul: { calls: L * (1 + steps), positions: L * B * (T + steps) },
      });
      t.same(await delta(1), forwards(0), `${dtype}: one new token = the prefill alone, ${B} rows x ${T} positions, through the kernels`);
      t.same(await delta(4), forwards(3), `${dtype}: four new tokens = the prefill and three decode steps of ${B} rows`);
      a.setCpuKernels(false);
      const off = await delta(4);
      t.same(
        off,
        { rmsNorm: { calls: 0, positions: 0 }, normRope: { calls: 0, positions: 0 }, siluMul: { calls: 0, positions: 0 } },
        `${dtype}: with the CPU kernels off no kernel runs`,
      );
    } finally {
      a.setCpuKernels(true);
      m.dispose();
    }
  }
});

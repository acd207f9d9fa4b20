// `bench rollout`'s generation rooflines (bench/rollout.ts): one generate call's time at the matmul
// rate and the read bandwidth (callRoofline), the read a run stands at (the harmonic mean of the reads
// before and after it), and the plumbing: `slm-train bench rollout --quick --out F` on the tiny
// preset, each run's roofline recomputed from its calls and its own reads in the JSON.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { layerMatmulParams } from '../bench/engine.js';
import { callRoofline } from '../bench/rollout.js';
import { harmonicMean } from '../bench/stats.js';
import { initModel } from '../lib/model/init.js';
import { runCliAsync } from './helpers/cli.js';

t.test('a generate call at the rooflines: prefill at the matmul rate, each step after the first at its binding limit', async (t) => {
  const m = { layerParams: 1e6, VH: 2e5, bytesPerParam: 4 };
  const lim = { f32: 100, read: 10 }; // GFLOP/s, GB/s
  // Prefill of 50 tokens, 2 rows: (2e6 x 50 + 2 x 2e5 x 2) / 1e11 = 1.008 ms. A step reads 4.8 MB
  // (0.48 ms at 10 GB/s) against 2 x 1.2e6 x 2 FLOPs (0.048 ms): memory bound; 9 steps after the first.
  const c = { rows: 2, prefillTokens: 50, steps: 10 };
  t.ok(Math.abs(callRoofline(c, m, lim) - (1.008e-3 + 9 * 0.48e-3)) < 1e-12, `${callRoofline(c, m, lim)}`);
  // 64 rows: 2 x 1.2e6 x 64 / 1e11 = 1.536 ms per step, above the read's 0.48: compute bound.
  const wide = { rows: 64, prefillTokens: 0, steps: 2 };
  t.ok(Math.abs(callRoofline(wide, m, lim) - (2 * 2e5 * 64) / 1e11 - 1.536e-3) < 1e-12);
  // A faster read lowers only the memory-bound steps.
  t.ok(callRoofline(c, m, { ...lim, read: 20 }) < callRoofline(c, m, lim));
  t.equal(callRoofline(wide, m, { ...lim, read: 20 }), callRoofline(wide, m, lim));
  t.equal(callRoofline({ rows: 1, prefillTokens: 0, steps: 1 }, m, lim), (2 * 2e5) / 1e11, 'one step: the prefill only');
});

t.test(
  "slm-train bench rollout --quick: each run's roofline from its calls at the read measured around it",
  { timeout: 600_000 },
  async (t) => {
    const tmp = t.testdir();
    const model = join(tmp, 'tiny');
    initModel({ preset: 'tiny', out: model, seed: 0 });
    const out = join(tmp, 'bench.json');
    const r = await runCliAsync(['bench', 'rollout', '--quick', '--out', out, '--model', model], {
      env: { SLM_TRAIN_THREADS: '2' },
      timeout: 540_000,
    });
    t.equal(r.code, 0, r.stderr.slice(-3000));
    const rep = JSON.parse(readFileSync(out, 'utf8')).reports.rollout;
    const cfg = JSON.parse(readFileSync(join(model, 'config.json'), 'utf8'));
    const params = rep.machine.params;
    const sizes = { layerParams: layerMatmulParams(params, cfg), VH: cfg.vocab_size * cfg.hidden_size, bytesPerParam: 4 };
    t.same(
      rep.runs.map((x: { k: number; unbatched: boolean }) => [x.k, x.unbatched]),
      [
        [1, false],
        [4, false],
        [4, true],
      ],
    );
    for (const run of rep.runs) {
      t.equal(run.read_GBps.length, 2, `K ${run.k}: the reads before and after`);
      t.ok(
        run.read_GBps.every((g: number) => g > 0),
        `K ${run.k}: ${run.read_GBps.join(' / ')} GB/s`,
      );
      t.equal(run.calls.length, run.generate_calls, 'every generate call in the JSON');
      const want = run.calls.reduce(
        (s: number, c: { rows: number; prefill_tokens: number; steps: number }) =>
          s +
          callRoofline({ rows: c.rows, prefillTokens: c.prefill_tokens, steps: c.steps }, sizes, {
            f32: rep.machine.matmul_f32_GFLOPs,
            read: harmonicMean(run.read_GBps),
          }),
        0,
      );
      // The JSON's matmul rate is rounded to 0.1 GFLOP/s and the roofline to 1 ms.
      t.ok(
        Math.abs(run.split_s.generation_roofline - want) <= 0.0006 + 0.002 * want,
        `K ${run.k}${run.unbatched ? ' unbatched' : ''}: roofline ${run.split_s.generation_roofline} s = its calls at its own read (${want.toFixed(4)})`,
      );
      t.match(r.stdout, `(${run.split_s.generation_roofline}; ${run.read_GBps.join(' / ')}) |`, 'the table carries the reads');
    }
    const k1 = rep.runs[0],
      k4 = rep.runs[1];
    const perRoof = (x: typeof k1) => x.split_s.generation_roofline / x.rollouts;
    t.ok(Math.abs(rep.per_rollout_vs_k1.at_rooflines - perRoof(k4) / perRoof(k1)) <= 0.002 + 0.01 * rep.per_rollout_vs_k1.at_rooflines);
  },
);

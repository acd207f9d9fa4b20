// The train benchmark's own side (bench/train-child.ts, run from dist/ as `bench train` runs it): one
// configuration in its own process, its warm-up steps untimed, then the median of the timed ones.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import t from 'tap';
import { initModel } from '../lib/model/init.js';
import { repoRoot } from './helpers/shared.js';

t.test('bench/train-child runs warm-up steps, then the timed ones, with and without checkpointing', { timeout: 300_000 }, async (t) => {
  const dir = join(t.testdir(), 'tiny');
  initModel({ preset: 'tiny', out: dir, seed: 1 });
  const child = join(repoRoot, 'dist', 'bench', 'train-child.js');
  for (const [ckpt, reps, warm] of [
    ['0', '3', '2'],
    ['1', '1', undefined],
  ] as const) {
    const r = spawnSync(process.execPath, [child, dir, ckpt, '64', reps, ...(warm ? [warm] : [])], { encoding: 'utf8', timeout: 240_000 });
    t.equal(r.status, 0, r.status === 0 ? 'the child exits 0' : r.stderr.slice(-2000));
    const out = JSON.parse(r.stdout.trim().split('\n').pop()!);
    t.match(
      out,
      { steps_warmup: warm ? 2 : 1, steps_timed: Number(reps), step_s: Number, head_rows: 48, peak_MiB: Number, loaded_MiB: Number },
      `checkpointing ${ckpt === '1' ? 'on' : 'off'}: ${out.steps_warmup} warm-up, ${out.steps_timed} timed, the last 3/4 of 64 tokens trained`,
    );
    t.ok(out.step_s > 0 && out.peak_MiB >= out.loaded_MiB, `step ${out.step_s.toFixed(3)} s, peak ${out.peak_MiB.toFixed(0)} MiB`);
  }
});

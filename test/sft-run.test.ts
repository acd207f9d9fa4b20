// SFT end to end at tiny scale: the loss falls, checkpoints are complete, and a run interrupted and
// resumed reaches exactly the state of an uninterrupted run.
import t from 'tap';
import { existsSync, mkdirSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { Model } from '../lib/engine/model.js';
import { initModel } from '../lib/model/init.js';
import { RunFolder, permutation } from '../lib/train/run.js';
import { runSft, type SftOptions } from '../lib/train/sft/sft.js';
import type { SftExample } from '../lib/train/sft/sft-data.js';
import { fixture } from './helpers/shared.js';

const examples: SftExample[] = Array.from({ length: 6 }, (_, i) => {
  const ids = Array.from({ length: 10 + i }, (_, k) => ((k * 37 + i * 11) % 500) + 5);
  return { ids, mask: ids.map((_, k) => (k >= 4 ? 1 : 0)), row: i };
});
const opts: SftOptions = {
  lora: { r: 4, alpha: 8, dropout: 0.1, rslora: false, targets: ['q_proj', 'v_proj', 'up_proj'] },
  epochs: 3,
  batchSize: 2,
  schedule: { kind: 'cosine', lr: 3e-2, warmupSteps: 2 },
  seed: 7,
  checkpointEvery: 2,
};

t.test('permutations are deterministic per (seed, epoch) and differ across epochs', async (t) => {
  t.same(permutation(10, 3, 1), permutation(10, 3, 1));
  t.notSame(permutation(10, 3, 1), permutation(10, 3, 2));
  t.same(
    [...permutation(10, 3, 1)].sort((a, b) => a - b),
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
  );
});

t.test('SFT lowers the loss; resume after an interruption reaches exactly the uninterrupted state', async (t) => {
  const root = t.testdir();
  const modelDir = join(root, 'model');
  initModel({ preset: 'tiny', out: modelDir, seed: 2, overrides: { vocab_size: 512 }, embedStd: 0.3 });

  const a = await Model.load(modelDir);
  t.teardown(() => a.dispose());
  const runA = new RunFolder(join(root, 'run-a'));
  const ra = await runSft(a, examples, runA, opts);
  t.equal(ra.steps, 9);
  const metrics = runA.readMetrics();
  t.equal(metrics.length, 9);
  // The same batches are seen once per epoch: compare epoch means.
  const mean = (e: number) => metrics.filter((m) => m.epoch === e).reduce((x, m) => x + (m.loss as number), 0) / 3;
  t.ok(mean(2) < mean(0) * 0.8, `mean loss epoch 0 ${mean(0).toFixed(3)} -> epoch 2 ${mean(2).toFixed(3)}`);
  t.ok(metrics.every((m) => (m.mask_coverage as number) > 0 && (m.mask_coverage as number) < 1));
  t.same(readdirSync(join(root, 'run-a', 'checkpoints')).sort(), ['step-2', 'step-4', 'step-6', 'step-8', 'step-9']);

  // Interrupted after 5 steps (the last checkpoint is step 4), then resumed in a fresh process state.
  const runB = new RunFolder(join(root, 'run-b'));
  const b1 = await Model.load(modelDir);
  await runSft(b1, examples, runB, { ...opts, stopAfter: 5 });
  b1.dispose();
  t.equal(runB.latestCheckpoint()?.state.step, 4);
  const b2 = await Model.load(modelDir);
  t.teardown(() => b2.dispose());
  const rb = await runSft(b2, examples, runB, { ...opts, resume: true });
  t.equal(rb.steps, 9);
  const pa = a.trainable();
  const pb = b2.trainable();
  for (const k of Object.keys(pa)) t.same(Array.from(pb[k]), Array.from(pa[k]), `${k}: identical to the uninterrupted run`);
  t.same(
    runB.readMetrics().map((m) => m.loss),
    metrics.map((m) => m.loss),
    'same metrics, no duplicated steps',
  );
});

t.test('a checkpoint cut short by a kill is never loaded', async (t) => {
  const root = t.testdir();
  const run = new RunFolder(join(root, 'run'));
  // A partial save (temporary folder) and a step folder without state.json: both ignored.
  mkdirSync(join(root, 'run', 'checkpoints', '.step-3.partial-123', 'adapter'), { recursive: true });
  mkdirSync(join(root, 'run', 'checkpoints', 'step-5', 'adapter'), { recursive: true });
  t.equal(run.latestCheckpoint(), undefined);
  t.ok(existsSync(join(root, 'run', 'checkpoints')));
  const m = await Model.load(fixture('qwen3', 'tiny-qwen3-f32'));
  t.teardown(() => m.dispose());
  await t.rejects(run.restore(m), { code: 'CHECKPOINT_INVALID', message: /no complete checkpoint/ });
});

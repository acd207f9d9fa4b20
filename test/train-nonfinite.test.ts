// Non-finite training state (issue 33 row 12): an adapter holding NaN or inf is refused when loaded
// or resumed, and a run whose loss turns NaN/inf stops with TRAINING_DIVERGED, keeping its last good
// checkpoint, instead of training on NaN for the rest of the run and exiting 0.
import t, { type Test } from 'tap';
import { closeSync, openSync, readFileSync, readdirSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { Model } from '../lib/engine/model.js';
import { initModel } from '../lib/model/init.js';
import { RunFolder } from '../lib/train/run.js';
import { runSft, type SftOptions } from '../lib/train/sft/sft.js';
import type { SftExample } from '../lib/train/sft/sft-data.js';

const examples: SftExample[] = Array.from({ length: 4 }, (_, i) => {
  const ids = Array.from({ length: 10 + i }, (_, k) => ((k * 37 + i * 11) % 500) + 5);
  return { ids, mask: ids.map((_, k) => (k >= 4 ? 1 : 0)), row: i };
});
const opts: SftOptions = {
  lora: { r: 4, alpha: 8, dropout: 0, rslora: false, targets: ['q_proj', 'v_proj'] },
  epochs: 2,
  batchSize: 2,
  schedule: { kind: 'constant', lr: 1e-2, warmupSteps: 0 },
  seed: 3,
  checkpointEvery: 1,
};

/** Writes up to 4 KB of 0xff (NaN as float32) over the start of a safetensors file's data. */
function poison(file: string): void {
  const header = Number(readFileSync(file).readBigUInt64LE(0));
  const size = readFileSync(file).length - 8 - header;
  const fd = openSync(file, 'r+');
  writeSync(fd, Buffer.alloc(Math.min(4096, size), 0xff), 0, Math.min(4096, size), 8 + header);
  closeSync(fd);
}

t.test('an adapter with non-finite values is refused; --resume falls back to a good checkpoint or refuses', async (t) => {
  const { root, m, run } = await tinyRun(t);
  await runSft(m, examples, run, { ...opts, stopAfter: 2 });
  t.same(readdirSync(join(root, 'run', 'checkpoints')).sort(), ['step-1', 'step-2']);
  const newest = join(root, 'run', 'checkpoints', 'step-2', 'adapter', 'adapter_model.safetensors');
  poison(newest);

  await t.rejects(m.loadAdapter(join(root, 'run', 'checkpoints', 'step-2', 'adapter')), {
    code: 'ADAPTER_INVALID',
    message: new RegExp(`${newest.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')} holds \\d+ non-finite values`),
  });
  t.equal(m.lora, undefined, 'the refused adapter is not left attached');

  // --resume: the damaged newest checkpoint is named and passed over for the older one.
  const lines: string[] = [];
  run.log = (l) => lines.push(l);
  const state = await run.restore(m);
  t.equal(state.step, 1);
  t.match(lines.join('\n'), /step-2\/adapter\/adapter_model\.safetensors holds \d+ non-finite values/);
  t.equal(m.nonFinite(), undefined);

  // Every checkpoint damaged: CHECKPOINT_INVALID naming the files, nothing resumed.
  poison(join(root, 'run', 'checkpoints', 'step-1', 'adapter', 'adapter_model.safetensors'));
  await t.rejects(runSft(m, examples, run, { ...opts, resume: true }), {
    code: 'CHECKPOINT_INVALID',
    message: /step-2\/adapter\/adapter_model\.safetensors holds \d+ non-finite values.*step-1\/adapter\/adapter_model\.safetensors holds/s,
  });
});

/** runSft that writes NaN into one LoRA tensor after step `at` (as an update that overflowed would). */
async function trainPoisonedAfter(m: Model, run: RunFolder, at: number) {
  return runSft(m, examples, run, {
    ...opts,
    epochs: 3,
    checkpointEvery: 2,
    onStep: (row) => {
      if (row.step !== at) return;
      const [name, v] = Object.entries(m.trainable()).find(([k]) => k.includes('lora_B'))!;
      m.setTrainable(
        name,
        v.map((x, i) => (i % 3 ? x : NaN)),
      );
    },
  }).then(
    () => undefined,
    (e: unknown) => e as { code: string; message: string; details: { step: number; checkpoint?: string } },
  );
}

/** A tiny model (loaded, disposed with the test) and an empty run folder in the test's own folder. */
async function tinyRun(t: Test) {
  const root = t.testdir();
  const modelDir = join(root, 'model');
  initModel({ preset: 'tiny', out: modelDir, seed: 2, overrides: { vocab_size: 512 } });
  const m = await Model.load(modelDir);
  t.teardown(() => m.dispose());
  return { root, modelDir, m, run: new RunFolder(join(root, 'run')) };
}

t.test('a loss that turns NaN/inf stops training with TRAINING_DIVERGED and keeps the last good checkpoint', async (t) => {
  const { root, modelDir, m, run } = await tinyRun(t);
  const err = await trainPoisonedAfter(m, run, 3);
  t.equal(err?.code, 'TRAINING_DIVERGED', String(err?.message));
  t.match(
    err?.message,
    /training diverged at step 4: the loss is NaN, expected finite values\. Training stopped without saving that step; the last good checkpoint is .*step-2 \(step 2\): continue from it with --resume/,
  );
  t.equal(err?.details.step, 4);
  t.same(
    readdirSync(join(root, 'run', 'checkpoints')).filter((d) => /^step-\d+$/.test(d)),
    ['step-2'],
    'no checkpoint after the last good one',
  );
  t.same(
    run.readMetrics().map((r) => r.step),
    [1, 2, 3, 4],
    'the diverged step is logged, nothing after it',
  );
  t.equal(run.readMetrics()[3].loss, null);
  // The last good checkpoint loads and resumes.
  const m2 = await Model.load(modelDir);
  t.teardown(() => m2.dispose());
  await m2.loadAdapter(join(root, 'run', 'checkpoints', 'step-2', 'adapter'));
  t.equal(m2.nonFinite(), undefined);
});

t.test('a checkpoint is never written from an adapter holding NaN or inf', async (t) => {
  const { root, m, run } = await tinyRun(t);
  const err = await trainPoisonedAfter(m, run, 2);
  t.equal(err?.code, 'TRAINING_DIVERGED', String(err?.message));
  t.match(
    err?.message,
    /training diverged at step 2: the adapter holds \d+ non-finite values \(NaN or inf; first in .*lora_B.*\).*no checkpoint was written before it/,
  );
  t.same(readdirSync(join(root, 'run', 'checkpoints')), [], 'nothing written, not even a partial folder');
});

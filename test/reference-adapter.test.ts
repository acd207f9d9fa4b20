// The KL reference policy of RL: the adapter an RL stage starts from (e.g. the SFT adapter), frozen,
// instead of the base model. Checked against log-probs computed without the reference machinery:
// the reference equals the starting adapter while the trained one moves, survives replacing the
// trained adapter (resume), and the loss's KL term is 0 exactly when policy = reference.
import t from 'tap';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Model } from '../lib/engine/model.js';
import { fixture } from './helpers/shared.js';

const base = fixture('qwen3', 'tiny-qwen3-f32');
const rows = [
  [204, 125, 373, 399, 458, 17, 300, 457, 205, 161],
  [12, 99, 300, 7, 45, 210],
];
const spec = { r: 4, alpha: 8, dropout: 0, rslora: false, targets: ['q_proj', 'v_proj', 'down_proj'] as never };

/** Sets every lora_B to a pattern scaled by `s` (B = 0 would make the adapter a no-op). */
function setB(m: Model, s: number): void {
  for (const [name, v] of Object.entries(m.trainable()))
    if (name.endsWith('lora_B.weight'))
      m.setTrainable(
        name,
        v.map((_, i) => s * Math.sin(i * 0.7 + name.length)),
      );
}

const maxDiff = (a: Float32Array[], b: Float32Array[]) => Math.max(...a.flatMap((r, i) => Array.from(r, (x, j) => Math.abs(x - b[i][j]))));

t.test('the reference is the adapter frozen when set, the base model otherwise', async (t) => {
  const m = await Model.load(base);
  t.teardown(() => m.dispose());
  const baseLp = await m.sequenceLogprobs(rows);
  m.attachLora(spec, 3);
  setB(m, 0.2);
  const start = await m.sequenceLogprobs(rows);
  t.ok(maxDiff(start, baseLp) > 1e-3, 'the starting adapter changes the log-probs (else the test proves nothing)');
  t.equal(m.hasReferenceAdapter(), false);
  t.ok(maxDiff(await m.referenceLogprobs(rows), baseLp) < 1e-6, 'no reference set: the base model');

  m.setReferenceAdapter();
  t.equal(m.hasReferenceAdapter(), true);
  t.ok(maxDiff(await m.referenceLogprobs(rows), start) < 1e-6, 'reference = the adapter at the time it was frozen');
  setB(m, -0.35); // training moves the adapter
  const moved = await m.sequenceLogprobs(rows);
  t.ok(maxDiff(moved, start) > 1e-3, 'the trained adapter moved');
  t.ok(maxDiff(await m.referenceLogprobs(rows), start) < 1e-6, 'the reference did not move with it');
  t.ok(maxDiff(await m.sequenceLogprobs(rows), moved) < 1e-6, 'computing reference log-probs leaves the trained adapter as it was');

  // Replacing the trained adapter (a checkpoint restored on resume) keeps the reference.
  const dir = mkdtempSync(join(tmpdir(), 'slm-ref-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  await m.saveAdapter(dir);
  m.detachLora();
  await m.loadAdapter(dir);
  t.ok(maxDiff(await m.sequenceLogprobs(rows), moved) < 1e-6, 'the saved adapter came back');
  t.ok(maxDiff(await m.referenceLogprobs(rows), start) < 1e-6, 'the reference survived detach + load');

  m.clearReferenceAdapter();
  t.ok(maxDiff(await m.referenceLogprobs(rows), baseLp) < 1e-6, 'cleared: the base model again');
});

t.test('the KL term of the loss is measured against the frozen reference', async (t) => {
  const m = await Model.load(base);
  t.teardown(() => m.dispose());
  m.attachLora(spec, 5);
  setB(m, 0.25);
  const mask = rows.map((r) => r.map((_, i) => (i >= 2 ? 1 : 0)));
  const lp = await m.sequenceLogprobs(rows);
  const batch = { sequences: rows, masks: mask, advantages: rows.map((r) => r.map(() => 0)), oldLogprobs: lp };
  const step = () =>
    m.trainStep(batch, { loss: 'pg', clipLow: 0.2, lr: 0, klCoef: 1, klEstimator: 'k1', maxGradNorm: 0, update: false, checkpoint: false });
  const againstBase = await step();
  // k1 KL against the base = mean over trained tokens of (logp - logp_base): computed here from
  // log-probs, independently of the loss.
  const baseLp = await m.referenceLogprobs(rows);
  let sum = 0;
  let n = 0;
  lp.forEach((r, i) => r.forEach((x, j) => mask[i][j] && ((sum += x - baseLp[i][j]), n++)));
  t.ok(Math.abs(againstBase.kl - sum / n) < 1e-5, `KL against the base model: loss ${againstBase.kl} vs log-probs ${sum / n}`);
  t.ok(Math.abs(againstBase.kl) > 1e-4, 'the adapter is away from the base');
  m.setReferenceAdapter();
  const againstStart = await step();
  t.ok(Math.abs(againstStart.kl) < 1e-7, `policy = frozen reference: KL ${againstStart.kl}`);
  setB(m, 0.1);
  const lp2 = await m.sequenceLogprobs(rows);
  const moved = await m.trainStep(
    { ...batch, oldLogprobs: lp2 },
    { loss: 'pg', clipLow: 0.2, lr: 0, klCoef: 1, klEstimator: 'k1', maxGradNorm: 0, update: false, checkpoint: false },
  );
  let sum2 = 0;
  lp2.forEach((r, i) => r.forEach((x, j) => mask[i][j] && (sum2 += x - lp[i][j])));
  t.ok(Math.abs(moved.kl - sum2 / n) < 1e-5, `after the adapter moved: KL ${moved.kl} vs log-probs against the frozen start ${sum2 / n}`);
});

t.test('freezing a reference needs an adapter', async (t) => {
  const m = await Model.load(base);
  t.teardown(() => m.dispose());
  t.throws(() => m.setReferenceAdapter(), { code: 'NOT_SUPPORTED' });
});

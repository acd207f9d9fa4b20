// A reference for tests of Model.values: the values read back from the training loss's gradient.
import type { Model } from '../../lib/engine/model.js';
import { SlmError } from '../../lib/errors.js';

/**
 * The values exactly as the training loss sees them, read from the training path (a reference for
 * tests of `values`): one `trainStep` without update per requested token, its mask on that token
 * alone, returns 0, old values 0 and no value clipping, so the loss is 0.5 * V^2 and the value-head
 * bias gradient is V itself. One forward + backward per token; leaves gradients on the parameters
 * and, with LoRA dropout > 0, samples dropout like a training forward.
 */
export async function valuesFromTrainingPath(
  m: Model,
  rows: ArrayLike<number>[],
  masks?: ArrayLike<number>[],
  opts: { checkpoint?: boolean } = {},
): Promise<Float32Array[]> {
  if (masks && masks.length !== rows.length)
    throw new SlmError('ARGUMENT_INVALID', `values: expected one mask per row (${rows.length}), found ${masks.length}.`);
  if (!m.hasValueHead())
    throw new SlmError('NOT_SUPPORTED', 'values: no value head is attached; call attachValueHead() or load an adapter saved with one.');
  const out: Float32Array[] = [];
  for (let i = 0; i < rows.length; i++) {
    const ids = Int32Array.from(rows[i]);
    m.checkIds(ids);
    const n = ids.length;
    if (masks && masks[i].length !== n)
      throw new SlmError('ARGUMENT_INVALID', `values: mask ${i} has ${masks[i].length} entries for ${n} tokens.`);
    const v = new Float32Array(n);
    const zeros = new Float32Array(n);
    for (let t = 1; t < n; t++) {
      if (masks && !masks[i][t]) continue;
      const mask = new Uint8Array(n);
      mask[t] = 1;
      await m.trainStepLocal(
        { sequences: [ids], masks: [mask], returns: [zeros], oldValues: [zeros] },
        { loss: 'sft', vfCoef: 1, valueClip: Infinity, maxGradNorm: 0, checkpoint: opts.checkpoint ?? false, update: false },
      );
      v[t] = m.trainable({ grad: true })['value_head.bias'][0];
    }
    out.push(v);
  }
  return out;
}

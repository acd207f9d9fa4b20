// Teacher-forced log-probs with a temperature per row (a forward option): rows sampled at different
// temperatures share one forward, and each row's log-probs are those of softmax(logits / its own
// temperature) — checked against a float64 log-softmax of the full logits, row by row, and against
// the same rows scored one temperature at a time. Bad temperatures are coded errors.
import t from 'tap';
import { Model } from '../lib/engine/model.js';
import { fixture } from './helpers/shared.js';

const base = fixture('qwen3', 'tiny-qwen3-f32');
const rows = [
  [204, 125, 373, 399, 458, 17, 300, 457, 205, 161],
  [12, 99, 300, 7, 45, 210],
  [3, 8, 400, 401, 402, 13, 77, 1, 250],
];
const temps = [0.7, 1, 1.6];

/** float64 log-softmax(logits / T) of each next token, from the model's full logits of one row. */
async function reference(m: Model, row: number[], T: number): Promise<number[]> {
  const { data, vocab } = await m.logits([row]);
  const out = [0];
  for (let pos = 0; pos + 1 < row.length; pos++) {
    const z = Array.from(data.subarray(pos * vocab, (pos + 1) * vocab), (x) => x / T);
    const mx = Math.max(...z);
    const lse = mx + Math.log(z.reduce((s, x) => s + Math.exp(x - mx), 0));
    out.push(z[row[pos + 1]] - lse);
  }
  return out;
}

t.test('one temperature per row: each row under its own softmax(logits / T)', async (t) => {
  const m = await Model.load(base);
  t.teardown(() => m.dispose());
  const mixed = await m.sequenceLogprobs(rows, temps);
  let worst = 0;
  for (let i = 0; i < rows.length; i++) {
    const want = await reference(m, rows[i], temps[i]);
    t.equal(mixed[i].length, rows[i].length);
    for (let j = 0; j < want.length; j++) worst = Math.max(worst, Math.abs(mixed[i][j] - want[j]));
    const alone = (await m.sequenceLogprobs(rows, temps[i]))[i];
    t.ok(
      alone.every((x, j) => Math.abs(x - mixed[i][j]) < 1e-6),
      `row ${i}: equal to the batch scored at ${temps[i]} for every row`,
    );
  }
  t.ok(worst < 1e-4, `within 1e-4 of a float64 log-softmax of the logits (worst ${worst.toExponential(2)})`);
  const flat = await m.sequenceLogprobs(rows, 1);
  t.ok(
    Math.abs(flat[0][5] - mixed[0][5]) > 1e-3 && Math.abs(flat[2][5] - mixed[2][5]) > 1e-3,
    'the temperatures change the log-probs (else the test proves nothing)',
  );
  const ref = await m.referenceLogprobs(rows, temps);
  t.ok(
    ref.every((r, i) => r.every((x, j) => Math.abs(x - mixed[i][j]) < 1e-6)),
    'the reference policy (no adapter: the base model) takes the same per-row temperatures',
  );
});

t.test('with masks, the kept positions are scored as without and the others are 0', async (t) => {
  const m = await Model.load(base);
  t.teardown(() => m.dispose());
  // A prompt, a masked stretch mid-row, a row with nothing kept.
  const masks = [rows[0].map((_, i) => (i >= 3 && i !== 6 ? 1 : 0)), rows[1].map((_, i) => (i % 2 ? 1 : 0)), rows[2].map(() => 0)];
  const full = await m.sequenceLogprobs(rows, temps);
  const part = await m.sequenceLogprobs(rows, temps, masks);
  const ref = await m.referenceLogprobs(rows, temps, masks);
  for (let i = 0; i < rows.length; i++) {
    t.equal(part[i].length, rows[i].length);
    t.ok(
      part[i].every((x, j) => (masks[i][j] && j > 0 ? Math.abs(x - full[i][j]) < 1e-6 : x === 0)),
      `row ${i}: kept positions equal the unmasked scores, the rest 0`,
    );
    t.ok(
      ref[i].every((x, j) => (masks[i][j] && j > 0 ? Math.abs(x - full[i][j]) < 1e-6 : x === 0)),
      `row ${i}: the reference policy takes the masks too`,
    );
  }
  t.ok(full[0][1] !== 0 && full[2][4] !== 0, 'the masked-out positions have nonzero log-probs unmasked (else the test proves nothing)');
  await t.rejects(m.sequenceLogprobs(rows, temps, masks.slice(1)), {
    code: 'ARGUMENT_INVALID',
    message: /log-prob masks: expected one row per sequence \(3\), found 2/,
  });
  await t.rejects(m.sequenceLogprobs(rows, temps, [masks[0], masks[1], [1]]), {
    code: 'ARGUMENT_INVALID',
    message: /log-prob masks\[2\] has 1 values for 9 tokens/,
  });
  // A row one too long and the next one too short: the total matches, the rows do not.
  const shifted = [[...masks[0], 1], masks[1].slice(1), masks[2]];
  t.equal(shifted.flat().length, rows.flat().length, 'the same number of mask entries in all');
  await t.rejects(m.referenceLogprobs(rows, temps, shifted), {
    code: 'ARGUMENT_INVALID',
    message: /log-prob masks\[0\] has 11 values for 10 tokens/,
  });
});

t.test('bad temperatures are coded errors', async (t) => {
  const m = await Model.load(base);
  t.teardown(() => m.dispose());
  await t.rejects(m.sequenceLogprobs(rows, [1, 2]), { code: 'ARGUMENT_INVALID', message: /one value or one per sequence \(3\), found 2/ });
  await t.rejects(m.sequenceLogprobs(rows, [1, 0, 1]), { code: 'ARGUMENT_INVALID', message: /must be > 0, found 0.* at row 1/ });
  await t.rejects(m.sequenceLogprobs(rows, -1), { code: 'ARGUMENT_INVALID', message: /must be > 0/ });
});

// One GRPO update on one group does what the algorithm promises: the best sample's log-probability
// rises and the worst ones' fall, whatever the loss normalisation and however the lengths differ
// (the failing samples here are the long ones, as a rambling wrong program is). Log-probabilities
// are measured before and after with teacher forcing, independently of the training step's own
// statistics; the advantages are the reference's (population std, eps 1e-8) computed by hand.
import t from 'tap';
import { join } from 'node:path';
import { Model } from '../lib/engine/model.js';
import { initModel } from '../lib/model/init.js';
import { groupAdvantage } from '../lib/train/rl/advantages.js';

const prompt = [11, 23, 35, 47, 59, 6];
// Completions of one prompt: the rewarded one is the shortest; two failures are 3x and 5x longer.
const completions = [
  [7, 8, 9],
  [12, 40, 41, 42, 43, 44, 45, 46, 47],
  [7, 8, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 50, 51, 52],
  [7, 20, 21, 22],
];
const rewards = [1, 0, 0, 0.25];

/** Sum of the completion's log-probs (the part the loss trains). */
async function completionLogprob(m: Model): Promise<number[]> {
  const rows = completions.map((c) => [...prompt, ...c]);
  const lp = await m.sequenceLogprobs(rows);
  return lp.map((r) => r.slice(prompt.length).reduce((a, b) => a + b, 0));
}

for (const tokenLevel of [true, false]) {
  t.test(
    `one update on one group raises its best sample and lowers its worst (${tokenLevel ? 'token-level' : 'per-sequence'} loss)`,
    async (t) => {
      const root = t.testdir();
      initModel({ preset: 'tiny', out: join(root, 'model'), seed: 9, overrides: { vocab_size: 64 }, embedStd: 0.08 });
      const m = await Model.load(join(root, 'model'));
      t.teardown(() => m.dispose());
      m.attachLora(
        {
          r: 8,
          alpha: 16,
          dropout: 0,
          rslora: false,
          targets: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'],
        },
        2,
      );
      // r = [1, 0, 0, 0.25]: mean 0.3125, deviations [0.6875, -0.3125, -0.3125, -0.0625], population std
      // sqrt(0.671875 / 4) = 0.4098399; advantages [1.6775, -0.7625, -0.7625, -0.1525].
      const g = groupAdvantage(rewards, { stdEstimator: 'population', eps: 1e-8 });
      const want = [1.6775, -0.7625, -0.7625, -0.1525];
      g.advantages!.forEach((a, i) => t.ok(Math.abs(a - want[i]) < 1e-4, `advantage ${i}: ${a.toFixed(4)} vs ${want[i]}`));
      const rows = completions.map((c) => [...prompt, ...c]);
      const masks = completions.map((c) => [...prompt.map(() => 0), ...c.map(() => 1)]);
      const before = await completionLogprob(m);
      const old = await m.sequenceLogprobs(rows);
      const stats = await m.trainStep(
        { sequences: rows, masks, advantages: rows.map((r, i) => r.map((_, k) => (masks[i][k] ? g.advantages![i] : 0))), oldLogprobs: old },
        { loss: 'pg', lr: 1e-3, tokenLevel, clipLow: 0.2, maxGradNorm: 1, checkpoint: false },
      );
      t.ok(Math.abs(stats.ratio - 1) < 1e-5, `first pass: ratio 1 (${stats.ratio})`);
      const after = await completionLogprob(m);
      const delta = after.map((x, i) => x - before[i]);
      t.ok(delta[0] > 0, `best sample (reward 1, 3 tokens): log-prob ${before[0].toFixed(4)} -> ${after[0].toFixed(4)}`);
      if (tokenLevel)
        t.ok(delta[1] < 0 && delta[2] < 0, `failures (9 and 15 tokens) fall: ${delta[1].toExponential(2)}, ${delta[2].toExponential(2)}`);
      else {
        // Per-sequence means weigh each token of the 15-token failure 1/15 and each token of the
        // 3-token success 1/3: the push up on the prefix they share (tokens 7, 8) outweighs the push
        // down, and the long failure may rise (the length bias Dr.GRPO describes). The 9-token failure,
        // which shares nothing with the success, falls.
        t.ok(delta[1] < 0, `the failure sharing no prefix with the success falls: ${delta[1].toExponential(2)}`);
      }
      // The objective the update ascends must rise: sum_i A_i * logp_i (token-level: every token weighs
      // the same) or sum_i A_i * logp_i / n_i (per-sequence means).
      const n = completions.map((c) => c.length);
      const objective = (lp: number[]) => lp.reduce((a, x, i) => a + (g.advantages![i] * x) / (tokenLevel ? 1 : n[i]), 0);
      t.ok(objective(after) > objective(before), `objective: ${objective(before).toFixed(4)} -> ${objective(after).toFixed(4)}`);
    },
  );
}

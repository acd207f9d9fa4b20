// The reference code-search system's loss (src/trainer/episode.py 510-530), as configs/code-grpo.yaml
// runs it: no ratio (algorithm.old_logprobs: forward) and the entropy bonus as a turn's mean entropy
// averaged over the step's turns (loss_norm: turn). Checked on the native train step against values
// computed here from the model's own logits and from the SFT loss's gradient.
import t from 'tap';
import { join } from 'node:path';
import { Model } from '../lib/engine/model.js';
import { initModel } from '../lib/model/init.js';
import { turnScale } from '../lib/train/rl/advantages.js';
import { groupPolicyGradient } from '../lib/train/rl/grpo.js';
import { validateConfig } from '../lib/config/load.js';
import { fakeTrainStats } from './helpers/train-stats.js';

const targets: Array<'q_proj' | 'k_proj' | 'v_proj' | 'o_proj'> = ['q_proj', 'k_proj', 'v_proj', 'o_proj'];
// prompt (3), turn 1 (4 tokens), tool reply (2), turn 2 (3 tokens)
const ids = Int32Array.from([3, 9, 12, 20, 21, 22, 23, 5, 6, 30, 31, 32]);
const mask = Uint8Array.from([0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1]);

async function tinyModel(dir: string, dropout: number): Promise<Model> {
  initModel({ preset: 'tiny', out: join(dir, 'model'), seed: 4, overrides: { vocab_size: 64 }, embedStd: 0.08 });
  const m = await Model.load(join(dir, 'model'));
  m.attachLora({ r: 8, alpha: 16, dropout, rslora: false, targets }, 2);
  // Non-zero lora_B, so that dropout on the LoRA inputs changes the output.
  for (const [k, v] of Object.entries(m.trainable()))
    if (k.includes('lora_B'))
      m.setTrainable(
        k,
        Float32Array.from(v, (_, i) => ((i % 7) - 3) * 0.05),
      );
  return m;
}

t.test('turnScale: the factor that makes a token of turn j weigh 1 / (P * m_ij)', async (t) => {
  const other = Uint8Array.from([0, 1, 1, 0, 1, 1, 1, 1, 1]); // turns of 2 and 5 tokens
  const [a, b] = turnScale([mask, other]);
  // S = 2 episodes, P = 4 (episode, turn) pairs; episode 0: n 7, turns 4 and 3; episode 1: n 7, turns 2 and 5.
  const w0 = 1 / (2 * 7); // the native per-sequence weight 1 / (S n_i)
  const near = (got: Float32Array, want: number[], what: string) =>
    t.ok(
      want.every((w, k) => Math.abs(got[k] * w0 - w) < 1e-7),
      `${what}: ${Array.from(got, (x) => (x * w0).toFixed(4))}`,
    );
  near(
    a,
    Array.from(mask, (x, k) => (x ? 1 / (4 * (k < 8 ? 4 : 3)) : 0)),
    'episode 0: 1/16 on turn 1, 1/12 on turn 2',
  );
  near(
    b,
    Array.from(other, (x, k) => (x ? 1 / (4 * (k < 3 ? 2 : 5)) : 0)),
    'episode 1: 1/8 on turn 1, 1/20 on turn 2',
  );
  // Global counts (data-parallel ranks) replace the batch's own: S 1, P 4 gives 7 / (4 m) instead of 7 / (2 m).
  const g = turnScale([mask], { sequences: 1, pairs: 4 })[0];
  t.ok(Math.abs(g[3] - 7 / 16) < 1e-7 && Math.abs(g[9] - 7 / 12) < 1e-7, `the global counts are used: ${g[3]}, ${g[9]}`);
});

t.test(
  'old_logprobs forward: the ratio is exactly 1 under LoRA dropout and the gradient is -A grad log p of that same forward',
  async (t) => {
    const m = await tinyModel(t.testdir(), 0.1);
    t.teardown(() => m.dispose());
    const A = 0.5;
    const batch = { sequences: [ids], masks: [mask], advantages: [Float32Array.from(mask, (x) => x * A)] };
    const pg = (seed: number) =>
      m.trainStepLocal(batch, {
        loss: 'pg',
        oldFromForward: true,
        lr: 0,
        clipLow: 0.2,
        clipHigh: 0.2,
        maxGradNorm: 1,
        checkpoint: false,
        update: false,
        seed,
      });
    const s = await pg(7);
    t.equal(s.ratio, 1, `ratio exactly 1 (${s.ratio})`);
    t.equal(s.clipFrac, 0, 'nothing clipped');
    const gPg = m.gradients();
    // The SFT loss -sum(w log p) under the same seed draws the same dropout masks: its gradient is -grad log p.
    await m.trainStepLocal(
      { sequences: [ids], masks: [mask] },
      { loss: 'sft', lr: 0, maxGradNorm: 1, checkpoint: false, update: false, seed: 7 },
    );
    const gSft = m.gradients();
    let worst = 0;
    let norm = 0;
    gSft.forEach((g, i) => {
      worst = Math.max(worst, Math.abs(gPg[i] - A * g));
      norm = Math.max(norm, Math.abs(g));
    });
    t.ok(norm > 1e-4, `a gradient to compare (max |g| ${norm})`);
    t.ok(worst <= 1e-6 * Math.max(1, norm), `pg gradient = A x SFT gradient under the same dropout mask (max diff ${worst})`);
    await pg(8);
    const g8 = m.gradients();
    t.ok(
      g8.some((g, i) => Math.abs(g - gPg[i]) > 1e-6),
      'another seed draws other dropout masks (the dropout acts)',
    );
    // Without oldLogprobs and without oldFromForward the policy loss has nothing to divide by.
    await t.rejects(m.trainStepLocal(batch, { loss: 'pg', lr: 0, clipLow: 0.2, maxGradNorm: 1, checkpoint: false, update: false }), {
      code: 'ARGUMENT_INVALID',
    });
  },
);

t.test(
  "entropy bonus per turn (loss_norm turn): 0.05 x the mean over turns of a turn's mean entropy, from the model's own logits",
  async (t) => {
    const m = await tinyModel(t.testdir(), 0);
    t.teardown(() => m.dispose());
    // Entropy at each position from the logits (position t - 1 predicts token t), computed here.
    const { data, seqLen, vocab } = await m.logits([Array.from(ids)]);
    const H = (p: number) => {
      const row = data.subarray(p * vocab, (p + 1) * vocab);
      const mx = Math.max(...row);
      const z = row.reduce((a, x) => a + Math.exp(x - mx), 0);
      return -row.reduce((a, x) => a + (Math.exp(x - mx) / z) * (x - mx - Math.log(z)), 0);
    };
    t.equal(seqLen, ids.length);
    const mean = (ts: number[]) => ts.reduce((a, k) => a + H(k - 1), 0) / ts.length;
    const reference = 0.05 * ((mean([3, 4, 5, 6]) + mean([9, 10, 11])) / 2);
    const zero = Float32Array.from(mask, () => 0);
    const step = (entropyScale?: Float32Array[]) =>
      m.trainStepLocal(
        { sequences: [ids], masks: [mask], advantages: [zero], oldLogprobs: [zero], ...(entropyScale ? { entropyScale } : {}) },
        {
          loss: 'pg',
          lr: 0,
          clipLow: 0.2,
          entropyCoef: 0.05,
          tokenLevel: false,
          maxGradNorm: 1,
          checkpoint: false,
          update: false,
          seed: 1,
        },
      );
    const perTurn = await step(turnScale([mask]));
    t.ok(Math.abs(-perTurn.loss - reference) < 1e-5 * Math.max(1, reference), `loss ${-perTurn.loss} = -${reference}`);
    const perSeq = await step();
    const seqRef = 0.05 * ([3, 4, 5, 6, 9, 10, 11].reduce((a, k) => a + H(k - 1), 0) / 7);
    t.ok(
      Math.abs(-perSeq.loss - seqRef) < 1e-5 * Math.max(1, seqRef),
      `without the scale: the sequence mean (${-perSeq.loss} = ${seqRef})`,
    );
    t.ok(Math.abs(reference - seqRef) > 1e-6, 'the two averagings differ on turns of unequal length');
  },
);

t.test('GRPO passes oldFromForward and the per-turn entropy scale to the train step (plumbing)', async (t) => {
  const seen: Array<{ batch: { entropyScale?: Float32Array[] }; opts: { oldFromForward?: boolean } }> = [];
  const stats = fakeTrainStats();

  const model = { trainStep: async (batch: never, opts: never) => (seen.push({ batch, opts }), stats) } as unknown as Model;
  const ep = { ids, lossMask: mask, logprobs: new Float32Array(ids.length), temperature: 1, answer: null, turns: 2, record: {} };
  const run = async (o: { oldLogprobs?: 'sampler' | 'recompute' | 'forward'; lossNorm?: 'turn' | 'token'; entropyCoef?: number }) => {
    const algo = groupPolicyGradient('grpo', () => ({ advantages: [1, -1] }), {
      k: 2,
      ...o,
      schedule: { lr: 1e-5, kind: 'constant' },
      lora: { r: 4, alpha: 8, dropout: 0, rslora: false, targets: ['q_proj'] },
      questionsPerStep: 1,
      steps: 1,
      temperature: 1,
      seed: 1,
    });
    await algo.update(
      { model, step: 0, requests: [], episodes: [ep, ep] as never, rewards: [{ total: 1 }, { total: 0 }] as never, offset: 0 },
      { adv: [1, -1], keep: [0, 1], skipped: [] },
    );
    return seen[seen.length - 1];
  };
  const f = await run({ oldLogprobs: 'forward', lossNorm: 'turn', entropyCoef: 0.05 });
  t.equal(f.opts.oldFromForward, true);
  t.same(f.batch.entropyScale, turnScale([mask, mask]), 'the per-turn factors of the batch');
  const r = await run({ oldLogprobs: 'recompute', lossNorm: 'token', entropyCoef: 0.05 });
  t.equal(r.opts.oldFromForward, false);
  t.equal(r.batch.entropyScale, undefined, 'token normalisation: no scale');
});

t.test('old_logprobs forward: one pass, group policy gradient only (coded config errors)', async (t) => {
  const base = { stage: 'grpo', model: { path: '/m' }, data: { questions: '/q.jsonl', corpus: '/c.jsonl' }, rollout: { k: 2 } };
  t.throws(() => validateConfig({ ...base, algorithm: { old_logprobs: 'forward', inner_epochs: 2 } }, 'x'), {
    code: 'CONFIG_INVALID',
    message: /algorithm\.old_logprobs.*expected inner_epochs 1, found 2/s,
  });
  t.throws(() => validateConfig({ ...base, stage: 'ppo', algorithm: { old_logprobs: 'forward' } }, 'x'), {
    code: 'CONFIG_INVALID',
    message: /algorithm\.old_logprobs.*found ppo/s,
  });
  t.doesNotThrow(() => validateConfig({ ...base, algorithm: { old_logprobs: 'forward' } }, 'x'));
});

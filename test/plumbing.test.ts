// The plumbing between a setting and where it acts (issue 33 item 2): each test fails when the value
// is dropped, replaced or swapped on its way — hand-made bugs the suite did not catch before.
import t from 'tap';
import { configFromObject } from '../lib/config/index.js';
import { sectionDefaults } from '../lib/config/schema.js';
import type { Model } from '../lib/engine/model.js';
import { codeProtocol } from '../lib/episodes/protocol.js';
import { ppoOptionsFrom } from '../lib/train/rl/ppo.js';
import { ppoUpdate } from '../lib/train/rl/ppo-batch.js';
import { configuredGroupAdvantages, groupPolicyGradient, pgOptionsFrom } from '../lib/train/rl/grpo.js';
import { fakeTrainStats } from './helpers/train-stats.js';

const base = { model: { path: '/m' }, data: { questions: '/q.jsonl', corpus: '/c.jsonl' } };

/** A model whose trainStep records the options it was given. */
function recordingModel() {
  const seen: Record<string, unknown>[] = [];
  const stats = fakeTrainStats({ loss: 0.5, pgLoss: 0.5 });

  const model = { trainStep: async (_b: unknown, o: Record<string, unknown>) => (seen.push(o), stats) } as unknown as Model;
  return { model, seen };
}

t.test("the code protocol's maxOutputChars caps the observation (not always 6,000)", async (t) => {
  const out = 'x'.repeat(20_000);
  const executor = { run: async () => ({ stdout: out, error: null, timed_out: false, calls: [], truncated: false, duration_ms: 1 }) };
  const observed = async (maxOutputChars?: number) => {
    const p = codeProtocol({ executor, ...(maxOutputChars ? { maxOutputChars } : {}) });
    const r = await p.respond({ kind: 'code', code: 'print(1)' } as never, { turn: 0, maxTurns: 4, question: 'q' } as never);
    return (r.messages![0].content as string).split('x').length - 1;
  };
  const small = await observed(500);
  t.ok(small > 300 && small <= 500, `500: ${small} characters of the output shown`);
  const big = await observed(12_000);
  t.ok(big > 9000 && big <= 12_000, `12,000: ${big} shown`);
  const dflt = await observed();
  t.ok(dflt > 4000 && dflt <= 6000, `default 6,000: ${dflt} shown`);
});

t.test('algorithm.fallbacks.fail_by: correct reaches the GRPO trainer', async (t) => {
  // A group with a spread of rewards but no correct rollout: with fail_by correct and all_failed
  // skip it is skipped; with fail_by reward (rewards > 0 count as successes) it is normalized.
  const rewards = [0.2, 0.9, 0.5, 0.4];
  const correct = [false, false, false, false];
  const byCorrect = configFromObject({ ...base, stage: 'grpo', algorithm: { fallbacks: { all_failed: 'skip', fail_by: 'correct' } } });
  const byReward = configFromObject({ ...base, stage: 'grpo', algorithm: { fallbacks: { all_failed: 'skip', fail_by: 'reward' } } });
  const a = configuredGroupAdvantages(byCorrect)(rewards, correct);
  t.equal(a.advantages, null, 'skipped: no rollout was correct');
  t.match(a.reason, /./);
  const b = configuredGroupAdvantages(byReward)(rewards, correct);
  t.equal(b.advantages?.length, 4, 'normalized: rewards above fail_at_or_below are successes');
  // And a correct rollout makes the same group a normal one under fail_by: correct.
  t.equal(configuredGroupAdvantages(byCorrect)(rewards, [false, true, false, false]).advantages?.length, 4);
});

t.test('clip_low and clip_high reach trainStep as clipLow and clipHigh (GRPO and PPO)', async (t) => {
  const cfg = configFromObject({ ...base, stage: 'grpo', algorithm: { clip_low: 0.1, clip_high: 0.3 } });
  const o = pgOptionsFrom(cfg);
  t.same([o.clipLow, o.clipHigh], [0.1, 0.3]);
  const { model, seen } = recordingModel();
  const algo = groupPolicyGradient('grpo', () => ({ advantages: [1] }), {
    ...o,
    lora: { r: 4, alpha: 8, dropout: 0, rslora: false, targets: ['q_proj'] },
    questionsPerStep: 1,
    steps: 1,
    temperature: 1,
    seed: 1,
  });
  const ep = {
    ids: [1, 2, 3],
    lossMask: new Uint8Array([0, 1, 1]),
    logprobs: new Float32Array([0, -1, -1]),
    temperature: 1,
    answer: null,
    turns: 1,
    record: {},
  };
  await algo.update(
    { model, step: 0, requests: [], episodes: [ep as never], rewards: [{ total: 1 } as never], offset: 0 },
    { adv: [1], keep: [0], skipped: [] },
  );
  t.same([seen[0].clipLow, seen[0].clipHigh], [0.1, 0.3], 'GRPO');

  const ppo = ppoOptionsFrom(configFromObject({ ...base, stage: 'ppo', algorithm: { clip_low: 0.1, clip_high: 0.3 } }));
  t.same([ppo.clipLow, ppo.clipHigh], [0.1, 0.3]);
  const r = recordingModel();
  const row = [new Float32Array([0, 1, 1])];
  await ppoUpdate(
    r.model,
    {
      sequences: [[1, 2, 3]],
      masks: [new Uint8Array([0, 1, 1])],
      advantages: row,
      oldLogprobs: row,
      returns: row,
      oldValues: row,
      temperature: [1],
    } as never,
    {
      epochs: 1,
      seed: 1,
      lr: 1e-3,
      valueLr: 1e-3,
      clipLow: 0.1,
      clipHigh: 0.3,
      klCoef: 0,
      klEstimator: 'k1',
      entropyCoef: 0,
      vfCoef: 0.5,
      valueClip: 0.5,
      tokenLevel: true,
      weightDecay: 0,
      maxGradNorm: 1,
      checkpoint: false,
    },
  );
  t.same([r.seen[0].clipLow, r.seen[0].clipHigh], [0.1, 0.3], 'PPO');
});

t.test("the algorithm section's defaults are pinned (a changed default is a decision, made here too)", async (t) => {
  const fallbacks = {
    flat_std: 0.01,
    flat_skip_below: 0.1,
    zero_variance: 'center',
    center: 0.5,
    all_failed: 'normalize',
    fail_by: 'reward',
    fail_at_or_below: 0,
  };
  const common = {
    clip_low: 0.2,
    kl_coef: 0,
    kl_reference: 'start',
    loss_norm: 'token',
    turn_discount: 1,
    inner_epochs: 1,
    entropy_coef: 0,
    std: 'group',
    std_estimator: 'sample',
    adv_eps: 1e-4,
    fallbacks,
    gamma: 1,
    lam: 1,
    vf_coef: 0.5,
    critic: 'shared',
    value_clip: 0.5,
    whiten: true,
    loss_temperature: null,
    old_logprobs: 'sampler',
    overlong: { filter: false, buffer: 0, penalty_factor: 1 },
    mini_batch: 0,
  };
  t.same(sectionDefaults('algorithm'), { kind: null, clip_high: null, kl_in: null, kl_estimator: null, ...common }, 'the schema');
  // As resolved per stage (kind, clip_high = clip_low, where the KL goes and its estimator).
  for (const [stage, derived] of [
    ['grpo', { kl_in: 'loss', kl_estimator: 'k3' }],
    ['rloo', { kl_in: 'loss', kl_estimator: 'k3' }],
    ['ppo', { kl_in: 'reward', kl_estimator: 'k1' }],
  ] as const)
    t.same(configFromObject({ ...base, stage }).algorithm, { kind: stage, clip_high: 0.2, ...derived, ...common }, stage);
});

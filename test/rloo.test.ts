// RLOO (lib/train/rl/rloo.ts), the algorithm added as one file of the RL loop: its leave-one-out
// advantages against hand-computed values, one update on one group raising the best sample (as
// test/grpo-update.test.ts does for GRPO), and `stage: rloo` end to end through trainFromConfig (the
// path `slm-train train` takes), checked against the trajectories it wrote.
import t from 'tap';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Model } from '../lib/engine/model.js';
import { initModel } from '../lib/model/init.js';
import { loadConfig } from '../lib/config/load.js';
import { grpoAdvantages } from '../lib/train/rl/advantages.js';
import { rlooAdvantages, runRloo } from '../lib/train/rl/rloo.js';
import { RunFolder } from '../lib/train/run.js';
import { trainFromConfig } from '../lib/train/session.js';
import { writeTinyRlStage } from './helpers/rl-stage.js';

const LORA = {
  r: 8,
  alpha: 16,
  dropout: 0,
  rslora: false,
  targets: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] as const,
};
const near = (a: number | null, b: number) => a !== null && Math.abs(a - b) < 1e-9;

t.test("leave-one-out advantages: r_i minus the mean of the group's other rewards", async (t) => {
  // [1, 0, 0, 0.25]: others' means [0.0833333, 0.4166667, 0.4166667, 0.3333333] ->
  // [0.9166667, -0.4166667, -0.4166667, -0.0833333] (= 4/3 x (r - 0.3125)).
  const a = rlooAdvantages([1, 0, 0, 0.25]).advantages!;
  [11 / 12, -5 / 12, -5 / 12, -1 / 12].forEach((w, i) => t.ok(near(a[i], w), `4 rollouts, advantage ${i}: ${a[i]} vs ${w}`));
  // Two rollouts: each is measured against the other alone.
  t.same(rlooAdvantages([3, 1]).advantages, [2, -2]);
  // Three: [2, 5, 11] -> [2 - 8, 5 - 6.5, 11 - 3.5].
  t.same(rlooAdvantages([2, 5, 11]).advantages, [-6, -1.5, 7.5]);
  t.same(rlooAdvantages([0.5, 0.5, 0.5]).advantages, [0, 0, 0], 'all equal: zero (nothing to learn)');
  t.same(rlooAdvantages([1]), { advantages: null, reason: 'single_rollout' }, 'one rollout has no baseline');
  t.same(rlooAdvantages([1, NaN]), { advantages: null, reason: 'non_finite_reward' });
  // In a batch, with excluded members leaving their group: groups of 4 become groups of 3, 1 and 4.
  const b = grpoAdvantages([2, 5, 9, 11, 7, 1, 1, 1, 1, 2, 3, 6], 4, rlooAdvantages, undefined, [
    false,
    false,
    true,
    false,
    true,
    true,
    false,
    true,
    false,
    false,
    false,
    false,
  ]);
  const want = [-6, -1.5, null, 7.5, null, null, null, null, 1 - 11 / 3, 2 - 10 / 3, 3 - 3, 6 - 2];
  want.forEach((w, i) =>
    w === null
      ? t.equal(b.advantages[i], null, `episode ${i}: none`)
      : t.ok(near(b.advantages[i], w), `episode ${i}: ${b.advantages[i]} vs ${w}`),
  );
  t.same(b.skipped, [{ group: 1, reason: 'single_rollout' }]);
});

t.test('one RLOO update on one group raises its best sample and lowers its worst', async (t) => {
  const prompt = [11, 23, 35, 47, 59, 6];
  const completions = [
    [7, 8, 9],
    [12, 40, 41, 42, 43, 44, 45, 46, 47],
    [7, 8, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 50, 51, 52],
    [7, 20, 21, 22],
  ];
  const root = t.testdir();
  initModel({ preset: 'tiny', out: join(root, 'model'), seed: 9, overrides: { vocab_size: 64 }, embedStd: 0.08 });
  const m = await Model.load(join(root, 'model'));
  t.teardown(() => m.dispose());
  m.attachLora({ ...LORA, targets: [...LORA.targets] }, 2);
  const adv = rlooAdvantages([1, 0, 0, 0.25]).advantages!;
  const rows = completions.map((c) => [...prompt, ...c]);
  const masks = completions.map((c) => [...prompt.map(() => 0), ...c.map(() => 1)]);
  const logprob = async () => (await m.sequenceLogprobs(rows)).map((r) => r.slice(prompt.length).reduce((a, b) => a + b, 0));
  const before = await logprob();
  const old = await m.sequenceLogprobs(rows);
  await m.trainStep(
    { sequences: rows, masks, advantages: rows.map((r, i) => r.map((_, k) => (masks[i][k] ? adv[i] : 0))), oldLogprobs: old },
    { loss: 'pg', lr: 1e-3, tokenLevel: true, clipLow: 0.2, maxGradNorm: 1, checkpoint: false },
  );
  const after = await logprob();
  t.ok(after[0] > before[0], `best sample (reward 1): log-prob ${before[0].toFixed(4)} -> ${after[0].toFixed(4)}`);
  t.ok(after[1] < before[1], `worst sample sharing no prefix with it: ${before[1].toFixed(4)} -> ${after[1].toFixed(4)}`);
  const objective = (lp: number[]) => lp.reduce((a, x, i) => a + adv[i] * x, 0);
  t.ok(objective(after) > objective(before), `objective sum A_i logp_i: ${objective(before).toFixed(4)} -> ${objective(after).toFixed(4)}`);
});

t.test('runRloo refuses a group of one (no baseline) with a coded error', async (t) => {
  const root = t.testdir();
  const run = new RunFolder(join(root, 'run'));
  const never = async () => {
    throw new Error('not reached');
  };
  await t.rejects(
    runRloo(
      null as never,
      [1],
      run,
      { rollout: never, reward: never },
      {
        lora: { ...LORA, targets: [...LORA.targets] },
        k: 1,
        questionsPerStep: 1,
        steps: 1,
        temperature: 1,
        seed: 0,
        schedule: { kind: 'constant', lr: 1e-3 },
      },
    ),
    {
      code: 'CONFIG_INVALID',
      message: /RLOO's baseline for a rollout is the mean reward of its group's other rollouts: expected an integer >= 2, found 1/,
    },
  );
});

t.test('stage: rloo end to end through trainFromConfig: rows, trajectories and their leave-one-out advantages', async (t) => {
  const root = t.testdir();
  const file = writeTinyRlStage(root, 'rloo', 'train: { steps: 2, checkpoint_every: 1 }\n');
  const cfg = loadConfig(file);
  t.equal(cfg.algorithm.kind, 'rloo', 'algorithm.kind follows the stage');
  const r = await trainFromConfig(cfg);
  t.match(r, { stage: 'rloo', steps: 2 });
  const jsonl = (f: string) =>
    readFileSync(f, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
  const metrics = jsonl(join(r.dir, 'metrics.jsonl'));
  t.same(
    metrics.map((m) => [m.stage, m.step]),
    [
      ['rloo', 1],
      ['rloo', 2],
    ],
  );
  for (const k of [
    'lr',
    'reward_mean',
    'episodes_trained',
    'groups_skipped',
    'time_rollout_s',
    'time_reward_s',
    'time_train_s',
    'time_step_s',
  ])
    t.type(metrics[0][k], 'number', `metrics has ${k}`);
  t.notOk('time_prepare_s' in metrics[0], 'no critic forward to time');
  const traj = jsonl(join(r.dir, 'trajectories.jsonl'));
  t.equal(traj.length, 2 * 2 * 3, 'every episode saved');
  // Rollouts of a question are consecutive (3 per group): each advantage is r_i - mean of the other two.
  let nonzero = 0;
  for (let g = 0; g < traj.length; g += 3) {
    const group = traj.slice(g, g + 3);
    t.equal(new Set(group.map((x) => `${x.step}/${x.question}`)).size, 1, `group ${g / 3}: one question`);
    group.forEach((x, i) => {
      const others = group.filter((_, j) => j !== i).map((y) => y.reward as number);
      const want = (x.reward as number) - (others[0] + others[1]) / 2;
      t.ok(near(x.advantage, want), `group ${g / 3}, rollout ${i}: advantage ${x.advantage} = ${x.reward} - mean(${others.join(', ')})`);
      if (want !== 0) nonzero++;
    });
  }
  const trained = metrics.reduce((a, m) => a + (m.episodes_trained as number), 0);
  t.equal(trained, nonzero, 'every episode with a non-zero advantage is trained on, and no other');
  t.ok(trained > 0, `${trained} episodes trained`);
  t.ok(
    metrics.filter((m) => m.episodes_trained > 0).every((m) => Number.isFinite(m.loss)),
    'a step with episodes has a loss',
  );
  t.ok(readFileSync(join(r.dir, 'checkpoints', 'step-2', 'state.json'), 'utf8').includes('"step": 2'), 'checkpoint of the last step');
});

// The RL algorithm registry (lib/train/rl/registry.ts): an algorithm is one definition. A toy one,
// written here in this file alone — REINFORCE with the batch's mean reward as its baseline, scaled by a
// config key of its own — is registered, validated (its key, its default, its group-size rule) and run
// through trainFromConfig, the path `slm-train train` takes; and the built-in algorithms' rules are
// refused at validation, before any model loads (stage: rloo with rollout.k 1).
import t from 'tap';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { num } from '../lib/config/schema-kit.js';
import { configFromObject, loadConfig } from '../lib/config/load.js';
import type { AlgorithmDefinition } from '../lib/train/rl/algorithm.js';
import { groupPolicyGradient, pgOptionsFrom, type PgOptions } from '../lib/train/rl/grpo.js';
import { runRl } from '../lib/train/rl/rl-loop.js';
import { algorithmOf, registerAlgorithm, stageNames } from '../lib/train/rl/registry.js';
import { trainFromConfig } from '../lib/train/session.js';
import { writeTinyRlStage } from './helpers/rl-stage.js';

/** What the toy algorithm saw of its config, per run (the plumbing under test). */
const seen: Array<{ scale: number; k: number }> = [];

/** The toy algorithm: REINFORCE, advantage (r - mean of the batch's rewards) x algorithm.toy_scale. */
const toy: AlgorithmDefinition = {
  name: 'toy_reinforce',
  summary: 'REINFORCE with the batch mean as baseline (a test of the registry)',
  algorithmKeys: { toy_scale: num(1, { exclusiveMinimum: 0 }, 'toy: the advantages are multiplied by this') },
  minGroupSize: 2,
  groupReason: 'the toy baseline needs two rollouts',
  groupBaseline: false,
  lossNorms: ['token', 'sequence'],
  kl: { defaultIn: 'loss', loss: ['k3'] },
  train(r) {
    const scale = (r.cfg.algorithm as unknown as { toy_scale: number }).toy_scale;
    seen.push({ scale, k: r.cfg.rollout.k });
    const o: PgOptions = { ...r.loop, ...pgOptionsFrom(r.cfg) };
    const rule = (rewards: number[]) => {
      const mean = rewards.reduce((a, b) => a + b, 0) / rewards.length;
      return { advantages: rewards.map((x) => (x - mean) * scale) };
    };
    return runRl(r.model, r.questions, r.run, r.deps, groupPolicyGradient('toy_reinforce', rule, o), o);
  },
};

const base = { model: { path: '/m' }, data: { questions: '/q', corpus: '/c' } };

t.test('stage: rloo with rollout.k 1 is refused at validation, with a coded error that says what to do', async (t) => {
  t.throws(() => configFromObject({ ...base, stage: 'rloo', rollout: { k: 1 } }), {
    code: 'CONFIG_INVALID',
    message:
      /rollout\.k: RLOO's baseline for a rollout is the mean reward of its group's other rollouts: expected an integer >= 2, found 1; set rollout\.k to 2 or more/,
  });
  t.throws(() => configFromObject({ ...base, stage: 'grpo', rollout: { k: 1 } }), {
    code: 'CONFIG_INVALID',
    message: /rollout\.k: GRPO compares the rollouts of a group/,
  });
  t.doesNotThrow(() => configFromObject({ ...base, stage: 'ppo', rollout: { k: 1 } }), 'PPO needs no group');
  t.throws(() => configFromObject({ ...base, stage: 'ppo', algorithm: { loss_norm: 'turn' } }), {
    code: 'CONFIG_INVALID',
    message: /algorithm\.loss_norm: PPO takes token or sequence, found "turn"/,
  });
  t.doesNotThrow(
    () => configFromObject({ ...base, stage: 'rft', algorithm: { kl_coef: 0.1 } }),
    'RFT has no KL term: its settings are ignored',
  );
  t.throws(() => configFromObject({ ...base, stage: 'rft', train: { steps: 3 } }), {
    code: 'CONFIG_INVALID',
    message: /train\.steps: the rft stage runs rft\.rounds rounds/,
  });
});

t.test('an algorithm registered from outside: a stage, its own key with its default, its rules', async (t) => {
  t.throws(
    () => configFromObject({ ...base, stage: 'toy_reinforce' }),
    { code: 'CONFIG_INVALID', message: /stage/ },
    'unknown before it is registered',
  );
  registerAlgorithm(toy);
  t.equal(algorithmOf('toy_reinforce'), toy);
  t.ok(stageNames().includes('toy_reinforce'), 'a stage now');
  t.equal(stageNames().at(-1), 'eval');
  t.throws(() => registerAlgorithm(toy), /already a stage/, 'a name is registered once');
  t.throws(() => registerAlgorithm({ ...toy, name: 'sft' }), /already a stage/, 'sft is not an algorithm name');
  t.throws(
    () => registerAlgorithm({ ...toy, name: 'toy2', algorithmKeys: { clip_low: num(0.1) } }),
    /algorithm\.clip_low of toy2 is already in the schema/,
    'a key has one owner',
  );
  const c = configFromObject({ ...base, stage: 'toy_reinforce', rollout: { k: 4 } });
  t.equal((c.algorithm as unknown as { toy_scale: number }).toy_scale, 1, 'its key takes its default');
  t.equal(c.algorithm.kind, 'toy_reinforce', 'algorithm.kind follows the stage');
  t.equal(c.algorithm.kl_in, 'loss', 'its KL place');
  t.throws(() => configFromObject({ ...base, stage: 'toy_reinforce', rollout: { k: 1 } }), {
    code: 'CONFIG_INVALID',
    message: /rollout\.k: the toy baseline needs two rollouts: expected an integer >= 2, found 1/,
  });
  t.throws(
    () => configFromObject({ ...base, stage: 'toy_reinforce', algorithm: { toy_scale: 0 } }),
    { code: 'CONFIG_INVALID', message: /algorithm\.toy_scale/ },
    'its key is checked by the schema',
  );
  t.throws(() => configFromObject({ ...base, stage: 'toy_reinforce', algorithm: { loss_norm: 'turn' } }), {
    code: 'CONFIG_INVALID',
    message: /TOY_REINFORCE takes token or sequence/,
  });
  t.throws(() => configFromObject({ ...base, stage: 'toy_reinforce', rollout: { dynamic_sampling: { enabled: true } } }), {
    code: 'CONFIG_INVALID',
    message: /dynamic sampling keeps groups whose rewards differ: GRPO and RLOO only, found stage toy_reinforce/,
  });
});

t.test('the toy algorithm trains through trainFromConfig: its key reaches it, its rows and advantages are its own', async (t) => {
  if (!algorithmOf('toy_reinforce')) registerAlgorithm(toy);
  const root = t.testdir();
  const file = writeTinyRlStage(root, 'toy_reinforce', 'algorithm: { toy_scale: 2.5 }\ntrain: { steps: 2 }\n');
  seen.length = 0;
  const r = await trainFromConfig(loadConfig(file));
  t.match(r, { stage: 'toy_reinforce', steps: 2 });
  t.same(seen, [{ scale: 2.5, k: 3 }], 'the config reached the algorithm');
  const jsonl = (f: string) =>
    readFileSync(f, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
  const metrics = jsonl(join(r.dir, 'metrics.jsonl'));
  t.same(
    metrics.map((m) => [m.stage, m.step]),
    [
      ['toy_reinforce', 1],
      ['toy_reinforce', 2],
    ],
    'its rows',
  );
  const traj = jsonl(join(r.dir, 'trajectories.jsonl'));
  t.equal(traj.length, 2 * 2 * 3, 'every episode saved');
  // Each group of 3 (one question): advantage = 2.5 x (r - the group's mean).
  for (let g = 0; g < traj.length; g += 3) {
    const group = traj.slice(g, g + 3);
    const mean = group.reduce((a, x) => a + (x.reward as number), 0) / 3;
    group.forEach((x, i) =>
      t.ok(
        Math.abs(x.advantage - 2.5 * ((x.reward as number) - mean)) < 1e-9,
        `group ${g / 3}, rollout ${i}: advantage ${x.advantage} = 2.5 x (${x.reward} - ${mean.toFixed(4)})`,
      ),
    );
  }
  t.ok(readFileSync(join(r.dir, 'config.yaml'), 'utf8').includes('toy_scale: 2.5'), 'the written config keeps its key');
});

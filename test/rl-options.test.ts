// The trainers take their options from the resolved config's sections (pgOptionsFrom, ppoOptionsFrom):
// every key is the config's value, none restated; a KL estimator the loss cannot take is a coded error.
import t from 'tap';
import { validateConfig } from '../lib/config/load.js';
import { pgOptionsFrom } from '../lib/train/rl/grpo.js';
import { ppoOptionsFrom } from '../lib/train/rl/ppo.js';

const base = { model: { path: '/m' }, data: { questions: '/q', corpus: '/c' } };

t.test('GRPO and RLOO options from the algorithm, rollout and optim sections', async (t) => {
  const algorithm = {
    clip_low: 0.15,
    clip_high: 0.3,
    kl_coef: 0.02,
    kl_estimator: 'k3',
    inner_epochs: 3,
    entropy_coef: 0.01,
    loss_norm: 'turn',
    turn_discount: 0.9,
    old_logprobs: 'recompute',
  };
  for (const stage of ['grpo', 'rloo']) {
    const c = validateConfig(
      {
        ...base,
        stage,
        rollout: { k: 5 },
        algorithm,
        optim: { lr: 3e-4, schedule: 'cosine', warmup_steps: 2, min_lr_ratio: 0.1 },
        train: { steps: 9 },
      },
      'test',
    );
    t.same(
      pgOptionsFrom(c),
      {
        k: 5,
        innerEpochs: 3,
        clipLow: 0.15,
        clipHigh: 0.3,
        klCoef: 0.02,
        klEstimator: 'k3',
        entropyCoef: 0.01,
        lossNorm: 'turn',
        turnDiscount: 0.9,
        oldLogprobs: 'recompute',
        schedule: { kind: 'cosine', lr: 3e-4, warmupSteps: 2, totalSteps: 9, minRatio: 0.1 },
      },
      stage,
    );
  }
  // clip_high left out: clip_low's (the config's derived default).
  t.equal(pgOptionsFrom(validateConfig({ ...base, stage: 'grpo', algorithm: { clip_low: 0.1 } }, 'test')).clipHigh, 0.1);
  // The KL of the group baselines goes in the loss: refused at validation, before a model loads.
  t.throws(() => validateConfig({ ...base, stage: 'rloo', algorithm: { kl_coef: 0.1, kl_in: 'reward', kl_estimator: 'k2' } }, 'test'), {
    code: 'CONFIG_INVALID',
    message: /algorithm\.kl_in: RLOO puts the KL in the loss, found kl_in: reward; set kl_in: loss/,
  });
  t.throws(() => validateConfig({ ...base, stage: 'grpo', algorithm: { kl_coef: 0.1, kl_estimator: 'k2' } }, 'test'), {
    code: 'CONFIG_INVALID',
    message: /algorithm\.kl_estimator: the KL term in the loss supports k3, found "k2" \(GRPO\)/,
  });
});

t.test('PPO options from the algorithm, rollout and optim sections', async (t) => {
  const c = validateConfig(
    {
      ...base,
      stage: 'ppo',
      rollout: { k: 2 },
      algorithm: {
        inner_epochs: 2,
        mini_batch: 4,
        gamma: 0.95,
        lam: 0.9,
        whiten: false,
        kl_coef: 0.001,
        vf_coef: 0.3,
        value_clip: 0.4,
        loss_norm: 'sequence',
        clip_low: 0.25,
        entropy_coef: 0.002,
        critic: 'separate',
      },
      optim: { lr: 1e-5, critic_lr: 2e-5, critic_max_grad_norm: 0.7 },
    },
    'test',
  );
  t.same(ppoOptionsFrom(c), {
    n: 2,
    ppoEpochs: 2,
    miniBatch: 4,
    clipLow: 0.25,
    clipHigh: 0.25,
    gamma: 0.95,
    lam: 0.9,
    whiten: false,
    klCoef: 0.001,
    klIn: 'reward',
    klEstimator: 'k1',
    entropyCoef: 0.002,
    tokenLevel: false,
    vfCoef: 0.3,
    valueClip: 0.4,
    schedule: { kind: 'constant', lr: 1e-5, warmupSteps: 0, totalSteps: undefined, minRatio: 0 },
    criticLr: 2e-5,
    critic: 'separate',
    criticMaxGradNorm: 0.7,
  });
  t.equal(
    ppoOptionsFrom(validateConfig({ ...base, stage: 'ppo' }, 'test')).miniBatch,
    undefined,
    'mini_batch 0: every episode of the step',
  );
});

// Top-p per rollout (rollout.top_p: [lo, hi], as the reference code-search system draws it from
// [0.85, 0.99]): the native sampler takes one top-p per row, each row sampling exactly as a call with
// that single top-p would; the runner passes an episode's own top-p; the trainers draw it per rollout.
import t from 'tap';
import { Model } from '../lib/engine/model.js';
import { validateConfig } from '../lib/config/load.js';
import { rolloutTopP } from '../lib/train/rl/rl-loop.js';
import { fixture } from './helpers/shared.js';

const prompts = [
  Int32Array.from([204, 125, 373, 399, 458]),
  Int32Array.from([17, 300]),
  Int32Array.from([457, 205, 161, 125, 489, 119]),
  Int32Array.from([88, 12, 301]),
];
const rowSeeds = [11, 22, 33, 44];

t.test('one top-p per row: each row samples exactly as a call with its top-p for every row', async (t) => {
  const m = await Model.load(fixture('qwen3', 'tiny-qwen3-f32'));
  t.teardown(() => m.dispose());
  const gen = (topP: number | number[], o: { topK?: number } = {}) =>
    m.generate({ prompts, maxNewTokens: 16, temperature: 1.5, rowSeeds, topP, ...o });
  for (const topK of [0, 40]) {
    const ps = [0.3, 1, 0.8, 0.55];
    const mixed = await gen(ps, { topK });
    let differs = 0;
    for (const [i, p] of ps.entries()) {
      const alone = await gen(p, { topK });
      t.same(Array.from(mixed.tokens[i]), Array.from(alone.tokens[i]), `top_k ${topK}: row ${i} (top-p ${p}) = the call with top-p ${p}`);
      t.same(Array.from(mixed.logprobs[i]), Array.from(alone.logprobs[i]));
      const open = await gen(1, { topK });
      if (p < 1 && Array.from(open.tokens[i]).join() !== Array.from(mixed.tokens[i]).join()) differs++;
    }
    t.ok(differs >= 1, `top_k ${topK}: the rows' top-p changed what they sampled (${differs} of the 3 rows below 1 differ from top-p 1)`);
  }
  // A tiny nucleus is greedy.
  const greedy = await m.generate({ prompts, maxNewTokens: 16, greedy: true });
  const tiny = await gen([1e-6, 1, 1e-6, 1]);
  t.same(Array.from(tiny.tokens[0]), Array.from(greedy.tokens[0]), 'top-p 1e-6 = greedy');
  t.same(Array.from(tiny.tokens[2]), Array.from(greedy.tokens[2]));
  await t.rejects(gen([0.9, 0.9]), { code: 'ARGUMENT_INVALID', message: /one value per row \(4\)/ });
  await t.rejects(gen([0.9, 0, 0.9, 0.9]), { code: 'ARGUMENT_INVALID', message: /topP must be in \(0, 1\]/ });
});

t.test('rollout.top_p as a range: validated, drawn per rollout inside it, deterministic', async (t) => {
  const base = { stage: 'grpo', model: { path: 'm' }, data: { questions: 'q.jsonl' }, protocol: { kind: 'direct' } };
  t.same(validateConfig({ ...base, rollout: { top_p: [0.85, 0.99] } }, 'test').rollout.top_p, [0.85, 0.99]);
  t.equal(validateConfig(base, 'test').rollout.top_p, 1);
  t.throws(() => validateConfig({ ...base, rollout: { top_p: [0.99, 0.85] } }, 'test'), {
    code: 'CONFIG_INVALID',
    message: /rollout\.top_p.*lo <= hi/,
  });
  t.throws(() => validateConfig({ ...base, rollout: { top_p: [0, 0.9] } }, 'test'), { code: 'CONFIG_INVALID' });
  t.equal(rolloutTopP(0.9, 0, 1, 0, 0), undefined, 'one value: the runner applies it');
  const draws = Array.from({ length: 200 }, (_, j) => rolloutTopP([0.85, 0.99], 3, 7, j % 10, j) as number);
  t.ok(
    draws.every((p) => p >= 0.85 && p <= 0.99),
    'inside the range',
  );
  t.ok(Math.max(...draws) - Math.min(...draws) > 0.1, 'spread over it');
  t.equal(
    rolloutTopP([0.85, 0.99], 3, 7, 2, 5),
    rolloutTopP([0.85, 0.99], 3, 7, 2, 5),
    'deterministic (a resumed or data-parallel run draws the same)',
  );
  t.not(rolloutTopP([0.85, 0.99], 3, 7, 2, 5), rolloutTopP([0.85, 0.99], 3, 8, 2, 5));
});

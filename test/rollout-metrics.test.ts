// The rollout part of the GRPO/PPO metrics rows (lib/train/rl/rollout-metrics.ts), on hand-made
// episodes whose turn records say which tool turns failed.
import t from 'tap';
import type { RewardResult, TrainEpisode } from '../lib/train/types.js';
import { rolloutMetrics, toolTurns } from '../lib/train/rl/rollout-metrics.js';

const ep = (mask: number[], answer: string | null, turns: number, record?: Record<string, unknown>): TrainEpisode => ({
  ids: Int32Array.from(mask, (_, i) => i),
  lossMask: Uint8Array.from(mask),
  logprobs: new Float32Array(mask.length),
  temperature: 1,
  answer,
  turns,
  record,
});

t.test('tool turns and their errors from the turn records', async (t) => {
  const record = {
    steps: [
      { turn: 1, action: 'code', program: { error: null, timed_out: false } },
      { turn: 2, action: 'code', program: { error: 'NameError: x', timed_out: false } },
      { turn: 3, action: 'code', program: { error: null, timed_out: true } },
      { turn: 4, action: 'search' },
      { turn: 5, action: 'search' },
      { turn: 6, action: 'answer' },
      { turn: 7, action: 'none' },
    ],
    calls: [
      { turn: 1, name: 'search_pages', ok: true },
      { turn: 4, name: 'search', ok: false, error: 'down' },
      { turn: 5, name: 'search', ok: true },
    ],
  };
  t.same(toolTurns(record), { turns: 5, errors: 3 }, 'raised, timed out, failed search; answers and no-action turns are not tool turns');
  t.equal(toolTurns({}), undefined, 'no records: unknown, not zero');
});

t.test('rollout metrics: rewards and parts, accuracy, answered, lengths, coverage, tools', async (t) => {
  const eps = [
    ep([0, 0, 1, 1, 0, 1], 'a', 2, {
      steps: [
        { turn: 1, action: 'code', program: { error: 'boom' } },
        { turn: 2, action: 'answer' },
      ],
      calls: [],
    }),
    ep([0, 1, 1, 1], null, 1, { steps: [{ turn: 1, action: 'code', program: { error: null } }], calls: [] }),
  ];
  const rewards: RewardResult[] = [
    { total: 1, parts: { f1: 1, judge: null }, correct: true },
    { total: 0, parts: { f1: 0, judge: 0.5 }, correct: false },
  ];
  const m = rolloutMetrics(eps, rewards);
  t.match(m, {
    reward_mean: 0.5,
    reward_std: 0.5,
    'reward/f1': 0.5,
    'reward/judge': 0.5,
    accuracy: 0.5,
    answered: 0.5,
    episodes: 2,
    turns_mean: 1.5,
    response_tokens_mean: 3,
    response_tokens_min: 3,
    response_tokens_max: 3,
    sequence_tokens_mean: 5,
    tool_turns_mean: 1,
    tool_errors_mean: 0.5,
    tool_error_rate: 0.5,
  });
  t.equal(m.mask_coverage, (3 / 6 + 3 / 4) / 2);
  const plain = rolloutMetrics([ep([0, 1], 'x', 1)], [{ total: 0.25, parts: {} }]);
  t.equal(plain.accuracy, undefined, 'no correctness flags: no accuracy');
  t.equal(plain.tool_turns_mean, undefined, 'no turn records: no tool metrics');
});

// Rule-based rewards and their composition: the Search-R1 normalisation (expected values produced by
// Search-R1's own normalize_answer in Python, see the table), EM / substring / F1 / ROUGE-L with
// hand-computed values, <answer> extraction, the format penalty, composeRewards and rewardFromConfig
// (with a scripted judge backend; the real backends are tested in rewards-judge.test.ts).
import t from 'tap';
import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import {
  answerMetrics,
  composeRewards,
  episodeContext,
  exactMatch,
  extractAnswer,
  f1Details,
  f1Score,
  formatReward,
  goldAnswers,
  lcsLength,
  matchReward,
  normalizeAnswer,
  rewardFromConfig,
  rougeL,
  rougeLDetails,
  SEARCH_R1_MIN_ANSWER_BLOCKS,
  subExactMatch,
  trainerReward,
  type JudgeBackend,
  type RewardContext,
  type RewardFn,
} from '../lib/rewards/index.js';
import type { RewardConfig } from '../lib/config/types.js';
import { repoRoot } from './helpers/shared.js';

const ctx = (answer: string | null, golds: string[] = ['Eiffel Tower'], extra: Partial<RewardContext> = {}): RewardContext => ({
  answer,
  golds,
  question: 'What is the tower in Paris?',
  ...extra,
});
const close = (a: number, b: number) => Math.abs(a - b) < 1e-12;

/** A judge backend that replies with the given texts in turn and counts its calls. */
function scriptedJudge(...replies: Array<string | Error>): JudgeBackend & { calls: number; seen: string[] } {
  const b = {
    description: 'scripted judge',
    calls: 0,
    seen: [] as string[],
    async complete(messages: readonly { content: string }[]) {
      const r = replies[Math.min(b.calls++, replies.length - 1)];
      b.seen.push(messages.map((m) => m.content).join('\n'));
      if (r instanceof Error) throw r;
      return { text: r };
    },
  };
  return b;
}

t.test('normalizeAnswer matches Search-R1 normalize_answer (Python outputs)', async (t) => {
  // Each right-hand side is what Search-R1's normalize_answer printed for the left-hand side.
  const golden: Array<[string, string]> = [
    ['The  Eiffel Tower!', 'eiffel tower'],
    ['an apple', 'apple'],
    ['Paris, France.', 'paris france'],
    ['Theater of the Absurd', 'theater of absurd'], // "the" inside a word stays
    ['the-end', 'theend'], // punctuation goes before articles, so "the" is no word any more
    ['A.B.C.', 'abc'],
    ["Don't Stop", 'dont stop'],
    ['THE END', 'end'],
    ['a_the', 'athe'], // "_" is in string.punctuation
    ['the2', 'the2'], // digits are word characters
    ['Émile the Great', 'émile great'],
    ['éthe', 'éthe'], // Python's \b is Unicode-aware: é is a word character (JS's \b would split here)
    ['日本the', '日本the'],
    ['Ⅻ the', 'ⅻ'],
    ['275,000–300,000', '275000–300000'], // the en dash is not ASCII punctuation
    [' An  “Elephant” ', '“elephant”'],
    ['\u00a0the\u3000cat\x1c', 'cat'], // Python splits on \xa0, \u3000 and \x1c
    ['a\ufeffb', '\ufeffb'], // ...but not on U+FEFF (JS \s would)
  ];
  for (const [input, expected] of golden) t.equal(normalizeAnswer(input), expected, JSON.stringify(input));
});

t.test('exact match and substring match (em_check, subem_check)', async (t) => {
  t.equal(exactMatch('The Eiffel Tower.', ['eiffel tower']), 1);
  t.equal(exactMatch('Eiffel Tower in Paris', ['Eiffel Tower']), 0);
  t.equal(exactMatch('Paris', ['London', 'paris!']), 1, 'any gold counts');
  t.equal(exactMatch('Paris', 'paris'), 1, 'a single gold string');
  t.equal(exactMatch('Paris', []), 0, 'no gold, no match');
  t.equal(subExactMatch('The capital is Paris.', ['paris']), 1);
  t.equal(subExactMatch('The capital is Paris.', ['London']), 0);
  t.equal(subExactMatch('Parisian', ['Paris']), 1, 'a plain substring, as subem_check');
  t.equal(subExactMatch('Paris', ['Paris, France']), 0, 'the gold must be inside the prediction, not the reverse');
  t.throws(() => exactMatch('x', [3 as unknown as string]), { code: 'ARGUMENT_INVALID' });
});

t.test('token F1 (SQuAD / HotpotQA) with hand-computed values', async (t) => {
  // [eiffel tower in paris] vs [eiffel tower]: 2 common, P = 2/4, R = 2/2, F1 = 2·0.5·1/1.5 = 2/3
  const d = f1Details('the Eiffel Tower in Paris', 'Eiffel Tower');
  t.ok(close(d.precision, 0.5) && close(d.recall, 1) && close(d.f1, 2 / 3), JSON.stringify(d));
  // multiset overlap: [paris paris] vs [paris] share 1 token, not 2: P = 1/2, R = 1, F1 = 2/3
  t.ok(close(f1Score('Paris Paris', ['Paris']), 2 / 3));
  // yes/no: "no" vs "no way" would be P = 1, R = 1/2, F1 = 2/3, but HotpotQA gives 0
  t.equal(f1Score('no', ['no way']), 0);
  t.equal(f1Score('no way', ['no']), 0);
  t.equal(f1Score('Yes.', ['yes']), 1);
  t.ok(close(f1Score('New York', ['York', 'New York City']), 0.8), 'best gold: P = 1, R = 2/3, F1 = 0.8 (York alone gives 2/3)');
  t.equal(f1Score('the', ['a']), 0, 'both empty after normalisation: no common token');
  t.equal(f1Score('Berlin', ['Paris']), 0);
});

t.test('ROUGE-L is the LCS F-measure over normalised tokens', async (t) => {
  t.equal(lcsLength(['x', 'y', 'z'], ['y', 'x', 'z']), 2);
  t.equal(lcsLength(['a', 'b', 'c', 'b', 'd', 'a', 'b'], ['b', 'd', 'c', 'a', 'b', 'a']), 4, 'the textbook example (bcba)');
  // [x y z] vs [y x z]: LCS 2 (F1 would be 1): P = R = 2/3
  t.ok(close(rougeL('x y z', ['y x z']), 2 / 3));
  // [w x y z] vs [x z]: LCS 2, P = 2/4, R = 2/2, F = 2/3
  const d = rougeLDetails('w x y z', 'x z');
  t.ok(close(d.precision, 0.5) && close(d.recall, 1) && close(d.f1, 2 / 3), JSON.stringify(d));
  // "The cat sat on the mat" vs "a cat was on a mat": [cat sat on mat] / [cat was on mat], LCS 3 -> 0.75
  t.ok(close(rougeL('The cat sat on the mat', 'a cat was on a mat'), 0.75));
  t.equal(rougeL('Berlin', ['Paris', 'Berlin!']), 1, 'best gold');
  t.equal(rougeL('', ['Paris']), 0);
});

t.test('answerMetrics gathers every metric; a missing answer scores 0', async (t) => {
  t.same(answerMetrics('Eiffel Tower', ['the Eiffel Tower']), { em: 1, subem: 1, f1: 1, rouge_l: 1 });
  const m = answerMetrics('the Eiffel Tower in Paris', ['Eiffel Tower']);
  t.equal(m.em, 0);
  t.equal(m.subem, 1);
  t.ok(close(m.f1, 2 / 3) && close(m.rouge_l, 2 / 3));
  t.same(answerMetrics(null, ['x']), { em: 0, subem: 0, f1: 0, rouge_l: 0 });
});

t.test('extractAnswer takes the last <answer> block; Search-R1 mode needs two', async (t) => {
  t.equal(extractAnswer('<think>hm</think><answer> Paris </answer>'), 'Paris');
  t.equal(extractAnswer('x <answer>A</answer> y <answer>\nB\n</answer> z'), 'B');
  t.equal(extractAnswer('no answer here'), null);
  t.equal(extractAnswer('<answer>unclosed'), null);
  // Search-R1's solution string holds the prompt's example answer too: one block = none from the model
  const prompt = 'For example, <answer> Beijing </answer>. Question: capital of France?';
  t.equal(extractAnswer(prompt, { minMatches: SEARCH_R1_MIN_ANSWER_BLOCKS }), null);
  t.equal(extractAnswer(prompt + '<answer>Paris</answer>', { minMatches: SEARCH_R1_MIN_ANSWER_BLOCKS }), 'Paris');
  t.equal(extractAnswer('<answer></answer>'), '', 'an empty block is an empty answer, not none');
});

t.test('format penalty: none, empty, overlong, fine', async (t) => {
  const f = formatReward({ noAnswer: 1, emptyAnswer: 0.8, maxWords: 3, overlong: 0.3 });
  t.same((await f(ctx(null))).parts, { format: -1 });
  t.same((await f(ctx(' . , '))).parts, { format: -0.8 }, 'empty after normalisation');
  t.same((await f(ctx('one two three four'))).parts, { format: -0.3 });
  t.same((await f(ctx('one two three'))).parts, { format: 0 });
  const defaults = formatReward({}, 'fmt');
  t.same((await defaults(ctx('a very long answer indeed with many words'))).parts, { fmt: 0 }, 'no word limit by default');
  t.throws(() => formatReward({ overlong: -1 }), { code: 'ARGUMENT_INVALID' });
});

t.test('match rewards: value, verdict, and 0 without an answer', async (t) => {
  t.same(await matchReward('em')(ctx('eiffel tower!')), { parts: { em: 1 }, correct: true });
  t.same(await matchReward('subem', 'sub')(ctx('Paris')), { parts: { sub: 0 }, correct: false });
  const f1 = await matchReward('f1')(ctx('Eiffel Tower in Paris'));
  t.ok(close(f1.parts.f1 as number, 2 / 3));
  t.equal(f1.correct, undefined, 'partial credit gives no verdict');
  t.same(await matchReward('em')(ctx(null)), { parts: { em: 0 }, correct: false });
});

t.test('composeRewards: weighted total, every part kept, verdict from the first term with one', async (t) => {
  const fn = composeRewards({
    terms: [
      { name: 'f1', weight: 0.5, fn: matchReward('f1') },
      { name: 'em', weight: 1, fn: matchReward('em') },
      { name: 'format', weight: 2, fn: formatReward({ maxWords: 3, overlong: 0.25 }) },
    ],
  });
  // f1 2/3 · 0.5 + em 0 · 1 + format -0.25 · 2 = 1/3 - 1/2
  const r = await fn(ctx('Eiffel Tower in Paris'));
  t.ok(close(r.total, 1 / 3 - 0.5), String(r.total));
  t.same(Object.keys(r.parts).sort(), ['em', 'f1', 'format']);
  t.equal(r.correct, false, 'f1 gives no verdict, em does');
  t.same(r.errors, {});
  const ok = await fn(ctx('Eiffel Tower'));
  t.equal(ok.total, 1.5);
  t.equal(ok.correct, true);
  t.throws(() => composeRewards({ terms: [] }), { code: 'ARGUMENT_INVALID' });
  t.throws(
    () =>
      composeRewards({
        terms: [
          { name: 'em', weight: 1, fn: matchReward('em') },
          { name: 'em', weight: 2, fn: matchReward('em') },
        ],
      }),
    { code: 'ARGUMENT_INVALID' },
  );
});

t.test('composeRewards records failures: null part, <component>_error, errors, onError', async (t) => {
  const seen: string[] = [];
  const broken: RewardFn = async () => {
    throw new Error('boom');
  };
  const nan: RewardFn = async () => ({ parts: { weird: NaN } });
  const fn = composeRewards({
    terms: [
      { name: 'em', weight: 1, fn: matchReward('em') },
      { name: 'bonus', weight: 1, fn: broken, component: 'bonus_judge' },
      { name: 'weird', weight: 1, fn: nan },
    ],
    failedValue: -0.5,
    onError: (c, m) => seen.push(`${c}: ${m}`),
  });
  const r = await fn(ctx('Eiffel Tower'));
  t.equal(r.total, 1 - 0.5 - 0.5, 'failed values count as failedValue, visibly');
  t.equal(r.parts.bonus_judge_error, 1);
  t.equal(r.parts.weird_error, 1);
  t.equal(r.parts.weird, null);
  t.match(r.errors.bonus_judge, /boom/);
  t.match(r.errors.weird, /NaN/);
  t.same(seen.sort(), [`bonus_judge: boom`, `weird: ${r.errors.weird}`].sort());
  t.equal(r.failed, true, 'a failed component marks the result failed');
  t.equal(r.excluded, undefined, 'penalty (the default) does not exclude');
  const ok = await composeRewards({ terms: [{ name: 'em', weight: 1, fn: matchReward('em') }] })(ctx('Eiffel Tower'));
  t.notOk('failed' in ok || 'excluded' in ok, 'no flags when nothing failed');
});

t.test('composeRewards sign_magnitude: sign from correctness, magnitude from approach', async (t) => {
  const grades: RewardFn = async (c) => ({ parts: JSON.parse(c.answer as string) });
  const fn = composeRewards({
    terms: [
      { name: 'c', weight: 0.75, fn: grades },
      { name: 'a', weight: 0.25, fn: grades },
      { name: 'format', weight: 1, fn: async () => ({ parts: { format: -0.1 } }) },
    ],
    combine: { kind: 'sign_magnitude', correctness: 'c', approach: 'a', threshold: 0.7 },
  });
  // Changed deliberately to the reference's formula: a wrong answer scores -(1 - approach), not
  // -approach; and a failed pair scores -1 by default (it was 0).
  t.ok(close((await fn(ctx('{"c": 0.8, "a": 0.6}'))).total, 0.6 - 0.1));
  t.ok(close((await fn(ctx('{"c": 0.3, "a": 0.9}'))).total, -0.1 - 0.1), 'wrong with approach 0.9: -(1 - 0.9)');
  t.ok(close((await fn(ctx('{"c": 0.3, "a": 0.1}'))).total, -0.9 - 0.1), 'wrong with approach 0.1: -(1 - 0.1)');
  t.ok(close((await fn(ctx('{"c": 1, "a": 0.9}'))).total, 0.9 - 0.1), 'right with approach 0.9: +0.9');
  t.ok(close((await fn(ctx('{"c": 0, "a": 0}'))).total, -1 - 0.1), 'no answer (0, 0): -1');
  t.ok(close((await fn(ctx('{"c": 0.7, "a": 0.2}'))).total, 0.2 - 0.1), 'at the threshold counts as correct');
  const failed = await fn(ctx('{"c": null, "a": 0.9}'));
  t.ok(close(failed.total, -1 - 0.1), 'a failed grade: the pair gives the default failedValue -1');
  t.equal(failed.failed, true);
  t.match(failed.errors.c, /could not be computed/);
  const custom = composeRewards({
    terms: [
      { name: 'c', weight: 1, fn: grades },
      { name: 'a', weight: 1, fn: grades },
    ],
    combine: { kind: 'sign_magnitude', correctness: 'c', approach: 'a' },
    failedValue: -2,
    onFailure: 'exclude',
  });
  const ex = await custom(ctx('{"c": 1, "a": null}'));
  t.equal(ex.total, -2, 'failedValue given');
  t.equal(ex.failed, true);
  t.equal(ex.excluded, true, "onFailure 'exclude' marks the episode");
  t.notOk('excluded' in (await custom(ctx('{"c": 1, "a": 0.5}'))), 'only failed episodes are excluded');
  const gave: RewardFn = async (c) => ({ parts: { ...JSON.parse(c.answer as string) } });
  const withGaveUp = composeRewards({
    terms: [
      { name: 'c', weight: 1, fn: gave },
      { name: 'a', weight: 1, fn: gave },
    ],
    combine: { kind: 'sign_magnitude', correctness: 'c', approach: 'a', gaveUp: { part: 'g', value: -1.5 } },
  });
  t.equal((await withGaveUp(ctx('{"c": 0, "a": 0.3, "g": 1}'))).total, -1.5, 'gave up: its value');
  t.ok(close((await withGaveUp(ctx('{"c": 0, "a": 0.3, "g": 0}'))).total, -0.7), 'not gave up: -(1 - 0.3)');
  t.throws(() => composeRewards({ terms: [{ name: 'c', weight: 1, fn: grades }], onFailure: 'drop' as never }), {
    code: 'ARGUMENT_INVALID',
    message: /penalty, exclude/,
  });
  t.throws(
    () =>
      composeRewards({
        terms: [{ name: 'c', weight: 1, fn: grades }],
        combine: { kind: 'sign_magnitude', correctness: 'c', approach: 'a' },
      }),
    { code: 'ARGUMENT_INVALID' },
  );
});

t.test('rewardFromConfig: the defaults are Search-R1 EM', async (t) => {
  const fn = rewardFromConfig();
  t.same(await fn(ctx('the eiffel tower')), { total: 1, parts: { em: 1 }, errors: {}, correct: true });
  t.same(await fn(ctx(null)), { total: 0, parts: { em: 0 }, errors: {}, correct: false });
});

t.test('rewardFromConfig: judge parts share one request; weighted 0.75 / 0.25', async (t) => {
  // the graded format and no match shortcut, stated since they stopped being the defaults
  const judge = scriptedJudge('Looks right.\nCorrectness: 8\nApproach: 6');
  const fn = rewardFromConfig(
    {
      combine: 'weighted',
      parts: [
        { kind: 'judge_correctness', weight: 0.75 },
        { kind: 'judge_approach', weight: 0.25 },
        { kind: 'em', weight: 0 },
      ],
      judge: { format: 'graded', match_shortcut: false },
    },
    { judgeBackend: judge },
  );
  const r = await fn(
    ctx('Eiffel Tower', ['Eiffel Tower'], {
      episode: {
        messages: [
          { role: 'user', content: 'q' },
          { role: 'assistant', content: 'searching <python>x</python>' },
        ],
      },
    }),
  );
  t.equal(judge.calls, 1, 'one judge request for both parts');
  t.ok(close(r.total, 0.75 * 0.8 + 0.25 * 0.6), String(r.total));
  t.equal(r.parts.judge_correctness, 0.8);
  t.equal(r.parts.judge_approach, 0.6);
  t.equal(r.parts.judge_error, 0);
  t.equal(r.parts.em, 1, 'a zero-weight part is still logged');
  t.equal(r.correct, true, 'correctness 0.8 >= 0.7');
  t.match(judge.seen[0], /searching <python>x<\/python>/, 'the judge saw the trajectory');
});

t.test('rewardFromConfig: sign_magnitude and a renamed judge part', async (t) => {
  // was a graded reply "Correctness: 2 / Approach: 9" scoring -0.9; now the binary default and the
  // reference's -(1 - approach) for a wrong answer
  const judge = scriptedJudge('{"category": "incorrect", "approach_score": 90}');
  const fn = rewardFromConfig(
    {
      combine: 'sign_magnitude',
      parts: [
        { kind: 'judge_correctness', weight: 1 },
        { kind: 'judge_approach', weight: 1, name: 'how' },
        { kind: 'format', weight: 1, max_words: 2, overlong: 0.5 },
      ],
      judge: {},
    },
    { judgeBackend: judge },
  );
  const r = await fn(ctx('the Eiffel Tour of Paris'));
  t.equal(judge.calls, 1, 'the renamed part reuses the same request');
  t.ok(close(r.total, -0.1 - 0.5), String(r.total));
  t.equal(r.parts.how, 0.9);
  t.equal(r.correct, false);
});

/** The reference's reward: sign_magnitude over the judge's two parts, and nothing else. */
const REFERENCE: Partial<RewardConfig> = {
  combine: 'sign_magnitude',
  parts: [{ kind: 'judge_correctness' }, { kind: 'judge_approach' }],
  judge: {},
};
const episode = {
  episode: {
    messages: [
      { role: 'user' as const, content: 'q' },
      { role: 'assistant' as const, content: '<python>search_pages("tower")</python>' },
    ],
  },
};

t.test('rewardFromConfig, the reference recipe: +approach, -(1 - approach), by hand', async (t) => {
  for (const [reply, total, correct] of [
    ['{"category": "correct", "approach_score": 90}', 0.9, true],
    ['{"category": "incorrect", "approach_score": 90}', -0.1, false],
    ['{"category": "correct", "approach_score": 10}', 0.1, true],
    ['{"category": "incorrect", "approach_score": 10}', -0.9, false],
    ['<think>said it could not find it</think>{"category": "gave_up", "approach_score": 30}', -0.7, false],
  ] as const) {
    const judge = scriptedJudge(reply);
    const r = await rewardFromConfig(REFERENCE, { judgeBackend: judge })(ctx('the Tower of Pisa', ['Eiffel Tower'], episode));
    t.equal(judge.calls, 1);
    t.ok(close(r.total, total), `${reply}: ${r.total} = ${total}`);
    t.ok(close(r.parts.judge as number, total), 'the logged judge part follows reward.combine');
    t.equal(r.correct, correct);
    t.notOk(r.failed);
  }
  const gave = await rewardFromConfig(
    { ...REFERENCE, judge: { gave_up_reward: -1.5 } },
    { judgeBackend: scriptedJudge('{"category": "gave_up", "approach_score": 30}') },
  )(ctx('unknown'));
  t.equal(gave.total, -1.5, 'judge.gave_up_reward: -1.5');
  t.equal(gave.parts.judge_gave_up, 1);
  const notGave = await rewardFromConfig(
    { ...REFERENCE, judge: { gave_up_reward: -1.5 } },
    { judgeBackend: scriptedJudge('{"category": "incorrect", "approach_score": 30}') },
  )(ctx('Big Ben'));
  t.ok(close(notGave.total, -0.7), 'gave_up_reward leaves a wrong answer alone');
});

t.test('rewardFromConfig, the reference recipe: no answer and a gold match need no request', async (t) => {
  const judge = scriptedJudge('{"category": "correct", "approach_score": 50}');
  const fn = rewardFromConfig(REFERENCE, { judgeBackend: judge });
  const none = await fn(ctx(null));
  t.equal(none.total, -1, 'no answer: -1');
  t.equal(none.parts.judge_skipped, 1);
  t.equal(none.correct, false);
  const hit = await fn(ctx('It is the Eiffel Tower.'));
  t.equal(hit.total, 1, 'contains the gold: correct, approach 100');
  t.equal(hit.parts.judge_matched, 1);
  t.equal(hit.correct, true);
  t.equal(judge.calls, 0, 'no request made for either');
  const off = await rewardFromConfig(
    { ...REFERENCE, judge: { match_shortcut: false } },
    { judgeBackend: judge },
  )(ctx('It is the Eiffel Tower.'));
  t.equal(judge.calls, 1, 'match_shortcut: false asks');
  t.equal(off.total, 0.5);
});

t.test('rewardFromConfig, the reference recipe: a failed judge scores -1, recorded; or is excluded', async (t) => {
  const errors: string[] = [];
  const deps = (reply: string | Error) => ({
    judgeBackend: scriptedJudge(reply),
    onError: (c: string, m: string) => errors.push(`${c}: ${m}`),
  });
  const down = await rewardFromConfig(REFERENCE, deps(new Error('connection reset')))(ctx('Big Ben'));
  t.equal(down.total, -1, 'the reference: -1');
  t.equal(down.failed, true);
  t.equal(down.excluded, undefined, 'on_failure penalty (default) keeps it');
  t.equal(down.parts.judge_error, 1);
  t.equal(down.parts.judge_correctness, null);
  t.equal(down.correct, undefined);
  t.match(down.errors.judge, /scripted judge: connection reset/);
  const garbled = await rewardFromConfig(REFERENCE, deps('Mostly right, I would say.'))(ctx('Big Ben'));
  t.equal(garbled.total, -1, 'an unparseable reply is a failure too');
  t.equal(garbled.failed, true);
  t.match(garbled.errors.judge, /Expected the judge's reply to end with a JSON object/);
  t.equal(errors.length, 2, 'onError heard both');
  const ex = await rewardFromConfig({ ...REFERENCE, on_failure: 'exclude' }, deps(new Error('timeout')))(ctx('Big Ben'));
  t.equal(ex.excluded, true, 'on_failure: exclude');
  t.equal(ex.failed, true);
  t.equal(ex.total, -1, 'the total still holds the penalty');
  const fine = await rewardFromConfig(
    { ...REFERENCE, on_failure: 'exclude' },
    deps('{"category": "incorrect", "approach_score": 20}'),
  )(ctx('Big Ben'));
  t.notOk('excluded' in fine || 'failed' in fine, 'a working judge is neither failed nor excluded');
  const fv = await rewardFromConfig({ ...REFERENCE, failure_value: -0.5 }, deps(new Error('x')))(ctx('Big Ben'));
  t.equal(fv.total, -0.5, 'failure_value');
});

t.test('rewardFromConfig: a judge failure is recorded, not a silent zero', async (t) => {
  const errors: string[] = [];
  const fn = rewardFromConfig(
    // match_shortcut off: the answer equals the gold, and the judge must be asked to fail
    {
      parts: [
        { kind: 'em', weight: 1 },
        { kind: 'judge', weight: 1 },
      ],
      judge: { match_shortcut: false },
    },
    { judgeBackend: scriptedJudge(new Error('connection reset')), onError: (c, m) => errors.push(`${c}: ${m}`) },
  );
  const r = await fn(ctx('Eiffel Tower'));
  t.equal(r.total, 1, 'em counts; the failed judge adds failedValue 0 (weighted)');
  t.equal(r.failed, true);
  t.equal(r.parts.judge, null);
  t.equal(r.parts.judge_correctness, null);
  t.equal(r.parts.judge_error, 1);
  t.match(r.errors.judge, /scripted judge: connection reset/);
  t.equal(errors.length, 1);
  t.equal(r.correct, true, 'the verdict comes from em, which worked');
});

t.test('rewardFromConfig: the shipped configs build', async (t) => {
  for (const [file, kinds] of [
    ['search-r1-ppo.yaml', ['em']],
    ['code-grpo.yaml', ['judge_correctness', 'judge_approach', 'judge_error', 'judge_skipped', 'judge_matched', 'judge_gave_up']],
  ] as const) {
    const reward = parseYaml(readFileSync(`${repoRoot}/configs/${file}`, 'utf8')).reward;
    const judge = scriptedJudge('{"category": "correct", "approach_score": 100}');
    const fn = rewardFromConfig(reward, { judgeBackend: judge });
    // an answer the judge must grade (it contains no gold, so no match shortcut); EM accepts it
    const r = await fn(ctx('Eiffel  Tower!', ['The Eiffel Tower']));
    t.same(
      Object.keys(r.parts)
        .filter((k) => k !== 'judge')
        .sort(),
      [...kinds].sort(),
      file,
    );
    t.equal(r.total, 1, file);
  }
});

t.test('rewardFromConfig: config mistakes say what was expected', async (t) => {
  t.throws(() => rewardFromConfig({ parts: [{ kind: 'subm' }] }), {
    code: 'CONFIG_INVALID',
    message: /reward\.parts\[0\]\.kind.*did you mean "subem"/,
  });
  t.throws(() => rewardFromConfig({ parts: [{ kind: 'em', wieght: 2 }] }), {
    code: 'CONFIG_UNKNOWN_KEY',
    message: /did you mean "weight"/,
  });
  t.throws(
    () => rewardFromConfig({ parts: [{ kind: 'em', max_words: 2 }] }),
    { code: 'CONFIG_UNKNOWN_KEY' },
    'format keys only on format parts',
  );
  t.throws(() => rewardFromConfig({ parts: [{ kind: 'em', weight: '1' }] }), {
    code: 'CONFIG_INVALID',
    message: /reward\.parts\[0\]\.weight: expected a number/,
  });
  t.throws(() => rewardFromConfig({ parts: [{ weight: 1 }] }), { code: 'CONFIG_INVALID', message: /"kind"/ });
  t.throws(() => rewardFromConfig({ parts: [] }), { code: 'CONFIG_INVALID' });
  t.throws(() => rewardFromConfig({ parts: [{ kind: 'judge' }], judge: { timeout: 5 } }), {
    code: 'CONFIG_UNKNOWN_KEY',
    message: /did you mean "timeout_s"/,
  });
  t.throws(() => rewardFromConfig({ parts: [{ kind: 'judge' }], judge: { correct_threshold: 7 } }), {
    code: 'CONFIG_INVALID',
    message: /correct_threshold: expected a number >= 0 and <= 1/,
  });
  t.throws(
    () => rewardFromConfig({ parts: [{ kind: 'judge' }] }),
    { code: 'CONFIG_INVALID', message: /native engine/ },
    'no base_url and no engine judge',
  );
  t.throws(() => rewardFromConfig({ parts: [{ kind: 'judge' }], judge: { backend: 'openai', base_url: 'http://127.0.0.1:1/v1' } }), {
    code: 'CONFIG_INVALID',
    message: /model/,
  });
  t.throws(
    () =>
      rewardFromConfig(
        { parts: [{ kind: 'judge' }], judge: { base_url: 'http://127.0.0.1:1/v1', model: 'm', api_key_env: 'SLM_TEST_NO_SUCH_KEY' } },
        { env: {} },
      ),
    { code: 'CONFIG_INVALID', message: /SLM_TEST_NO_SUCH_KEY/ },
  );
  t.throws(() => rewardFromConfig({ combine: 'sign_magnitude', parts: [{ kind: 'em' }] }), {
    code: 'CONFIG_INVALID',
    message: /judge_approach/,
  });
  t.throws(() => rewardFromConfig({ on_failure: 'drop' as never }), {
    code: 'CONFIG_INVALID',
    message: /reward\.on_failure: expected penalty or exclude, but found "drop"/,
  });
  t.throws(() => rewardFromConfig({ failure_value: '-1' as never }), {
    code: 'CONFIG_INVALID',
    message: /reward\.failure_value: expected a number or null/,
  });
  t.throws(() => rewardFromConfig({ parts: [{ kind: 'judge' }], judge: { format: 'json' } }), {
    code: 'CONFIG_INVALID',
    message: /reward\.judge\.format: expected one of binary, graded/,
  });
  t.throws(() => rewardFromConfig({ parts: [{ kind: 'judge' }], judge: { format: 'graded', gave_up_reward: -1.5 } }), {
    code: 'CONFIG_INVALID',
    message: /gave_up_reward: only the binary format/,
  });
  t.throws(() => rewardFromConfig({ parts: [{ kind: 'judge' }], judge: { match_shortcut: 'yes' } }), {
    code: 'CONFIG_INVALID',
    message: /match_shortcut: expected true or false/,
  });
  // an em part with no judge part never builds a judge, so no judge settings are needed
  t.doesNotThrow(() => rewardFromConfig({ parts: [{ kind: 'em' }], judge: {} }));
});

t.test('goldAnswers and the trainer adapter', async (t) => {
  t.same(goldAnswers('Paris'), ['Paris']);
  t.same(goldAnswers(['a', 1947]), ['a', '1947']);
  t.same(goldAnswers({ target: ['x', 'y'] }), ['x', 'y']);
  t.throws(() => goldAnswers(null), { code: 'DATA_INVALID' });
  t.throws(() => goldAnswers([]), { code: 'DATA_INVALID' });
  const ep = {
    answer: 'Paris',
    turns: 2,
    record: { finish: 'answer', messages: [{ role: 'user', content: 'hi' }], calls: [{ name: 'search' }] },
  };
  const c = episodeContext(ep, 'Capital of France?', ['paris']);
  t.same(c.episode, { turns: 2, finish: 'answer', messages: [{ role: 'user', content: 'hi' }], calls: [{ name: 'search' }] });
  const reward = trainerReward(rewardFromConfig(), (q: { question: string; answer: string }) => ({
    question: q.question,
    golds: goldAnswers(q.answer),
  }));
  const full = { ...ep, ids: new Int32Array(1), lossMask: new Uint8Array(1), logprobs: new Float32Array(1), temperature: 1 };
  t.equal((await reward(full, { question: 'Capital of France?', answer: 'Paris.' })).total, 1);
  t.equal((await reward(full, { question: 'Capital of Italy?', answer: 'Rome' })).total, 0);
});

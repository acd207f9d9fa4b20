// Search-R1's question layouts load directly (issue 10, item 1): the raw FlashRAG rows
// {id, question, golden_answers: [...]}, its processed rows (data_source, prompt, ability,
// reward_model.ground_truth.target: [...], extra_info) in Parquet with nested lists and structs as
// written by a Parquet writer, and JSONL; exact match and F1 count against any of the gold answers.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { answerMetrics } from '../lib/rewards/metrics.js';
import { loadQuestions } from '../lib/train/session.js';
import { writeParquet } from './helpers/parquet.js';

const tmp = t.testdir();
const template = (q: string) => `Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get new information. ... Question: ${q}\n`;
const ROWS = [
  { id: 'test_0', question: 'who wrote hamlet', golden_answers: ['Shakespeare', 'William Shakespeare'], data_source: 'nq' },
  { id: 'test_1', question: 'what is the capital of france', golden_answers: ['Paris'], data_source: 'hotpotqa' },
];
const processed = ROWS.map((r, i) => ({
  ...r,
  prompt: [{ role: 'user', content: template(r.question) }],
  ability: 'fact-reasoning',
  reward_model: { style: 'rule', ground_truth: { target: r.golden_answers } },
  extra_info: { split: 'test', index: i },
}));

t.test('Search-R1 processed Parquet (nested lists and structs) and JSONL', async (t) => {
  const file = join(tmp, 'test.parquet');
  writeParquet(file, processed);
  writeFileSync(join(tmp, 'test.jsonl'), processed.map((r) => JSON.stringify(r)).join('\n') + '\n');
  for (const f of ['test.parquet', 'test.jsonl']) {
    const qs = await loadQuestions(join(tmp, f));
    t.same(
      qs.map((q) => ({ id: q.id, question: q.question, golds: q.golds, data_source: q.data_source })),
      ROWS.map((r) => ({ id: r.id, question: r.question, golds: r.golden_answers, data_source: r.data_source })),
      f,
    );
  }
});

t.test('only reward_model.ground_truth.target and the prompt: golds from the target, the question from the prompt', async (t) => {
  const f = join(tmp, 'processed-only.jsonl');
  writeFileSync(f, processed.map(({ question: _q, golden_answers: _g, ...rest }) => JSON.stringify(rest)).join('\n') + '\n');
  const qs = await loadQuestions(f);
  t.same(qs.map((q) => q.question), ROWS.map((r) => r.question));
  t.same(qs.map((q) => q.golds), ROWS.map((r) => r.golden_answers));
  const bad = join(tmp, 'no-question.jsonl');
  writeFileSync(bad, JSON.stringify({ golden_answers: ['x'], prompt: [{ role: 'user', content: 'no marker here' }] }) + '\n');
  await t.rejects(loadQuestions(bad), { code: 'DATA_INVALID', message: /row 1 needs a non-empty string "question"/ });
});

t.test('EM and F1 count against any of the gold answers, after Search-R1 normalisation', async (t) => {
  const [hamlet] = await loadQuestions(join(tmp, 'test.jsonl'));
  t.equal(answerMetrics('William Shakespeare', hamlet.golds).em, 1);
  t.equal(answerMetrics('shakespeare.', hamlet.golds).em, 1, 'case and punctuation');
  t.equal(answerMetrics('the Shakespeare', hamlet.golds).em, 1, 'articles');
  t.equal(answerMetrics('Marlowe', hamlet.golds).em, 0);
  const f1 = answerMetrics('Shakespeare wrote it', hamlet.golds).f1;
  t.ok(Math.abs(f1 - 0.5) < 1e-9, `F1 is the best over golds: 2·(1/3·1)/(1/3+1) = 0.5 against "Shakespeare", found ${f1}`);
});

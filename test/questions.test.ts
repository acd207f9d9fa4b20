// Search-R1's question layouts load directly (issue 10, item 1): the raw FlashRAG rows
// {id, question, golden_answers: [...]}, its processed rows (data_source, prompt, ability,
// reward_model.ground_truth.target: [...], extra_info) in Parquet with nested lists and structs as
// written by a Parquet writer, and JSONL; exact match and F1 count against any of the gold answers.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { readFileSync } from 'node:fs';
import { validateConfig } from '../lib/config/load.js';
import type { GenerateRequest, GenerateResult, TextGenerator } from '../lib/engine/types.js';
import { tagsProtocol } from '../lib/episodes/index.js';
import { ChatFormatter } from '../lib/model/chat.js';
import { packagedQwen3Config, qwen3Tokenizer } from '../lib/model/tokenizer.js';
import { answerMetrics } from '../lib/rewards/metrics.js';
import { loadQuestions } from '../lib/train/data.js';
import type { Agent, Environment } from '../lib/train/environment.js';
import { evaluate } from '../lib/train/evaluation.js';
import { rolloutFn } from '../lib/train/stages.js';
import { writeParquet } from './helpers/parquet.js';

const tmp = t.testdir();
const template = (q: string) =>
  `Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get new information. ... Question: ${q}\n`;
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
  t.same(
    qs.map((q) => q.question),
    ROWS.map((r) => r.question),
  );
  t.same(
    qs.map((q) => q.golds),
    ROWS.map((r) => r.golden_answers),
  );
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

t.test('a chat-format prompt is kept as it is (Question.prompt); other rows have none', async (t) => {
  for (const f of ['test.parquet', 'test.jsonl']) {
    const qs = await loadQuestions(join(tmp, f));
    t.same(
      qs.map((q) => q.prompt),
      processed.map((r) => r.prompt),
      f,
    );
  }
  const raw = join(tmp, 'raw.jsonl');
  writeFileSync(
    raw,
    [...ROWS, { question: 'q', answer: 'a', prompt: 'a plain-text prompt is not a chat prompt' }].map((r) => JSON.stringify(r)).join('\n') +
      '\n',
  );
  t.ok((await loadQuestions(raw)).every((q) => q.prompt === undefined));
  const bad = join(tmp, 'bad-prompt.jsonl');
  writeFileSync(
    bad,
    JSON.stringify({
      question: 'q',
      answer: 'a',
      prompt: [
        { role: 'user', content: 'ok' },
        { role: 'narrator', content: 'x' },
      ],
    }) + '\n',
  );
  await t.rejects(loadQuestions(bad), {
    code: 'DATA_INVALID',
    message: /row 1: "prompt" is a list, so it must be chat messages .* item 2 is/,
  });
});

/** Answers every prompt with `<answer> x </answer>` and keeps the prompts it was sent, decoded. */
class RecordingGenerator implements TextGenerator {
  prompts: string[] = [];
  async generate(req: GenerateRequest): Promise<GenerateResult> {
    const tok = qwen3Tokenizer();
    const ids = Int32Array.from(tok.encode('<answer> x </answer>'));
    this.prompts.push(...req.prompts.map((p) => tok.decode(p)));
    return {
      tokens: req.prompts.map(() => ids),
      logprobs: req.prompts.map(() => new Float32Array(ids.length).fill(-0.5)),
      finishReasons: req.prompts.map(() => 'stop_string' as const),
    };
  }
}

t.test("rollouts and evaluation start from a Search-R1 row's own prompt, rendered with the chat template", async (t) => {
  const qs = await loadQuestions(join(tmp, 'test.parquet'));
  // a second prompt unlike the default template, so that a re-wrap would show
  qs[1] = {
    ...qs[1],
    prompt: [
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'My own wording. Question: what is the capital of france\n' },
    ],
  };
  const formatter = new ChatFormatter(packagedQwen3Config().chat_template as string, { eosToken: '<|im_end|>' });
  const cfg = validateConfig(
    {
      stage: 'ppo',
      model: { path: '/m' },
      data: { questions: '/q.jsonl', corpus: '/c.jsonl' },
      protocol: { kind: 'tags', max_turns: 1, max_new_tokens: 16 },
    },
    'test',
  );
  const env: Environment = { protocol: tagsProtocol({ search: { searchPassages: () => [] } }), describe: 'tags', close: async () => {} };
  const expected = qs.map((q) => formatter.prompt(q.prompt!));
  const agentWith = (gen: TextGenerator) => ({ model: gen, tokenizer: qwen3Tokenizer(), formatter }) as unknown as Agent;

  const rollGen = new RecordingGenerator();
  const eps = await rolloutFn(cfg, agentWith(rollGen), env)(qs.map((q, i) => ({ question: q, temperature: 1, seed: i })));
  t.same(rollGen.prompts, expected, "rollouts: the rows' prompts as they are");
  t.same(
    eps.map((e) => (e.record as { messages: unknown[] }).messages.slice(0, -1)),
    qs.map((q) => q.prompt),
  );

  const evalGen = new RecordingGenerator();
  const dir = join(tmp, 'eval');
  await evaluate(cfg, agentWith(evalGen), env, {}, qs, { label: 'base', adapter: null, dir, log: () => {} });
  t.same(evalGen.prompts, expected, "evaluation: the rows' prompts as they are");
  const rows = readFileSync(join(dir, 'trajectories.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
  t.same(
    rows.map((r) => r.question),
    ROWS.map((r) => r.question),
    'the question (logs, rewards) still comes from the row',
  );
  t.same(
    rows.map((r) => r.messages.slice(0, -1)),
    qs.map((q) => q.prompt),
  );
  // use_data_prompt: false wraps the question in protocol.instruction instead
  const wrap = new RecordingGenerator();
  const off = { ...env, protocol: tagsProtocol({ search: { searchPassages: () => [] }, usePrompt: false, instruction: 'Q: {question}' }) };
  await rolloutFn(cfg, agentWith(wrap), off)(qs.map((q, i) => ({ question: q, temperature: 1, seed: i })));
  t.same(
    wrap.prompts,
    qs.map((q) => formatter.prompt([{ role: 'user', content: `Q: ${q.question}` }])),
  );
});

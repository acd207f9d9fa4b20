// The embedded demo's parts: the byte-level BPE tokenizer it learns (a real Hugging Face
// tokenizer.json, read back by the same loader as any model's), the scripted expert (its programs run
// in the real Python sandbox and its answers are the gold ones), and the whole pipeline at a small
// scale (every stage runs, the table and the run folder are written). The full-size demo is the
// README's main command; its numbers are in the README.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import yargs, { type Argv } from 'yargs';
import { demoCommand, demoOptions, type Args } from '../lib/cli/demo.js';
import { loadConfig } from '../lib/config/load.js';
import { trainByteLevelBpe } from '../lib/demo/bpe.js';
import { DEMO_SYSTEM_PROMPT, expertProgram, expertTrajectories } from '../lib/demo/expert.js';
import { DEMONSTRATED_PHRASINGS, runDemo } from '../lib/demo/pipeline.js';
import { codeProtocol } from '../lib/episodes/protocol.js';
import { loadTokenizer } from '../lib/model/tokenizer.js';
import { Corpus } from '../lib/retrieval/corpus.js';
import { SearchIndex } from '../lib/retrieval/index.js';
import { PHRASINGS, syntheticCorpus } from '../lib/retrieval/synthetic.js';
import { createPythonPool } from '../lib/sandbox/python.js';

const gen = syntheticCorpus({ pages: 12, seed: 5, phrasings: true });

t.test('phrasings change how a question is asked, never the pages or the answers', async (t) => {
  const plain = syntheticCorpus({ pages: 40, seed: 5 });
  const varied = syntheticCorpus({ pages: 40, seed: 5, phrasings: true });
  t.same(varied.pages, plain.pages, 'the same pages');
  t.same(
    varied.questions.map((q) => [q.id, q.answer, q.kind, q.page_id]),
    plain.questions.map((q) => [q.id, q.answer, q.kind, q.page_id]),
    'the same facts asked',
  );
  t.ok(
    plain.questions.every((q) => q.phrasing === 0),
    'without the option, phrasing 0',
  );
  for (const q of varied.questions) {
    const page = varied.pages.find((p) => p.id === q.page_id)!;
    t.equal(q.question, PHRASINGS[q.kind][q.phrasing](page.title, /known in old chronicles as (the [^.]+)\./.exec(page.content)![1]));
    if (q.by_alias) t.notOk(q.question.includes(page.title), 'an alias question does not name the town');
  }
  for (const kind of Object.keys(PHRASINGS) as Array<keyof typeof PHRASINGS>) {
    const used = new Set(varied.questions.filter((q) => q.kind === kind).map((q) => q.phrasing));
    t.equal(used.size, PHRASINGS[kind].length, `${kind}: every phrasing occurs in 40 pages`);
  }
});

t.test('the learned BPE tokenizer round-trips text and is read by the Hugging Face loader', async (t) => {
  const dir = join(t.testdir(), 'tok');
  mkdirSync(dir);
  const special = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'];
  const added = ['<python>', '</python>'];
  const tj = trainByteLevelBpe(
    gen.pages.map((p) => p.content),
    { merges: 300, special, added },
  );
  const model = tj.model as { vocab: Record<string, number>; merges: string[] };
  t.equal(model.merges.length, 300);
  t.equal(Object.keys(model.vocab).length, 256 + 300, '256 bytes + one piece per merge');
  writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(tj));
  writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify({ eos_token: '<|im_end|>' }));
  const tok = loadTokenizer(dir);
  t.equal(tok.vocabSize, 556 + 5);
  t.same(tok.stopTokenIds.sort(), [556, 558].sort(), '<|im_end|> and <|endoftext|> stop');
  const texts = [
    gen.pages[3].content,
    '<|im_start|>user\nQuestion: héllo wörld 😀 1234<|im_end|>\n<python>\nprint("x")\n</python>',
    '  spaces\n\n\ttabs  ',
  ];
  for (const s of texts) {
    const ids = tok.encode(s);
    t.equal(tok.decode(ids), s, `round trip of ${JSON.stringify(s.slice(0, 30))}`);
    const bytes = tok.tokenBytes();
    t.equal(Buffer.concat(ids.map((i) => Buffer.from(bytes[i]))).toString('utf8'), s, 'token bytes concatenate to the text');
  }
  t.equal(tok.encode('<python>').length, 1, 'an added tag is one token');
  const corpusText = gen.pages.map((p) => p.content).join('\n');
  t.ok(tok.encode(corpusText).length < Buffer.byteLength(corpusText) / 3, 'merges compress the text they were learned from');
});

t.test('the scripted expert answers with the gold answer through the real sandbox', async (t) => {
  const index = await SearchIndex.build(new Corpus(gen.pages));
  const pool = await createPythonPool({ tools: index, size: 2, timeoutMs: 5000 });
  t.teardown(() => pool.close());
  t.match(
    expertProgram(gen.questions[0]),
    /^hits = search_pages\(question\)\ntext = read_section\(hits\[0\]\["page_id"\] \+ ":full"\)\nfinal_answer\(re\.search/,
  );
  // As the demo runs it: the question in a variable, the program answers with final_answer().
  const protocol = codeProtocol({ executor: pool, systemPrompt: DEMO_SYSTEM_PROMPT, questionVariable: 'question', finalAnswer: true });
  const { rows, rejected } = await expertTrajectories(gen.questions, protocol);
  t.equal(rows.length + rejected, gen.questions.length);
  t.ok(rows.length >= gen.questions.length * 0.8, `${rows.length} of ${gen.questions.length} accepted`);
  for (const r of rows) {
    t.same(
      r.messages.map((m) => m.role),
      ['system', 'user', 'assistant'],
      'one turn: the program answers',
    );
    t.equal(r.messages[0].content, DEMO_SYSTEM_PROMPT);
    t.equal(r.messages[1].content, `Question: ${r.question}`, 'the program does not contain the question; the prompt does');
    t.notOk(r.messages[2].content.includes(r.question), 'the program does not copy the question');
  }
  // Without final_answer(): the program prints the fact, a second turn answers with it.
  const printing = codeProtocol({ executor: pool, systemPrompt: DEMO_SYSTEM_PROMPT, questionVariable: 'question' });
  const two = await expertTrajectories(gen.questions, printing, { answer: 'print' });
  t.same(
    two.rows.map((r) => r.question),
    rows.map((r) => r.question),
    'the same questions are accepted either way',
  );
  for (const r of two.rows) {
    t.same(
      r.messages.map((m) => m.role),
      ['system', 'user', 'assistant', 'user', 'user', 'assistant'],
      'program, output, final-turn notice, answer',
    );
    t.match(r.messages[3].content, /^<python_output>\n[\s\S]+\n<\/python_output>$/);
    t.equal(r.messages[5].content, `<answer>${r.answer}</answer>`);
  }
});

t.test('the demo pipeline runs every stage at a small scale and writes its run folder', async (t) => {
  const out = join(t.testdir(), 'demo');
  const lines: string[] = [];
  const r = await runDemo({ out, pages: 10, sftEpochs: 1, grpoSteps: 1, log: (s) => lines.push(s) });
  t.same(
    r.stages.map((s) => s.stage),
    ['baseline', 'sft', 'grpo'],
  );
  t.same(
    r.stages.map((s) => s.sampled_episodes),
    [0, 0, 8 * 8],
    'GRPO: 1 step of 8 questions x 8 episodes',
  );
  for (const s of r.stages) {
    t.equal(s.summary.questions, 10, `${s.stage}: the 10 held-out questions`);
    // the summary is the mean over its episodes, recomputed here from the trajectories
    const eps = readFileSync(join(out, 'runs', 'evals', s.stage, 'trajectories.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    t.equal(eps.length, 10);
    t.ok(
      Math.abs(s.summary.accuracy - eps.filter((e) => e.correct).length / 10) < 1e-9,
      `${s.stage}: accuracy ${s.summary.accuracy} = correct episodes / 10`,
    );
    t.ok(Math.abs(s.summary.f1 - eps.reduce((a, e) => a + e.f1, 0) / 10) < 1e-9, `${s.stage}: f1 = the episodes' mean`);
  }
  t.ok(r.expert.accepted > 20, `${r.expert.accepted} expert trajectories`);
  t.equal(r.expert.rejected, 0, 'with BM25 over made-up names every expert program finds its page and fact');
  const tok = loadTokenizer(join(out, 'model'));
  // Learned from the texts as the model sees them (the system prompt once per question), the prompt
  // is mostly whole words; learned once, it took 197 tokens at the full size.
  t.ok(tok.encode(DEMO_SYSTEM_PROMPT).length < 150, `the system prompt is ${tok.encode(DEMO_SYSTEM_PROMPT).length} tokens`);
  t.match(
    r.table,
    /\| stage \| accuracy % \(10\) \| demonstrated phrasings % \(\d+\) \| undemonstrated phrasings % \(\d+\) \|[\s\S]*\| baseline \|[\s\S]*\| sft \|[\s\S]*\| grpo \|/,
  );
  t.match(readFileSync(join(out, 'report.md'), 'utf8'), /\| grpo \|/);
  for (const f of [
    'model/tokenizer.json',
    'model/chat_template.jinja',
    'data/expert.jsonl',
    'index/manifest.json',
    'runs/sft/adapter/adapter_config.json',
    'runs/grpo/adapter/adapter_config.json',
    'runs/evals/comparison.md',
  ])
    t.ok(existsSync(join(out, f)), f);
  const grpo = loadConfig(join(out, 'configs', 'grpo.yaml'));
  t.equal(grpo.model.adapter, join(out, 'runs', 'sft', 'adapter'), 'GRPO starts from the SFT adapter');
  t.equal(grpo.protocol.question_variable, 'question', 'programs find the question in a variable');
  t.equal(grpo.protocol.final_answer, true, 'programs answer with final_answer()');
  t.equal(grpo.retrieval.kind, 'bm25');
  const expert = readFileSync(join(out, 'data', 'expert.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
  // A consistent expert: one turn whose program answers with final_answer(), and only questions
  // asked in the demonstrated phrasings (the others reach the model only through RL and evaluation).
  const qs = new Map(
    readFileSync(join(out, 'data', 'questions.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l))
      .map((q) => [q.question, q]),
  );
  t.ok(
    expert.every((r) => r.messages.length === 3 && /final_answer\(/.test(r.messages[2].content) && !/print\(/.test(r.messages[2].content)),
    'every row: one turn, answered in the program',
  );
  t.ok(
    expert.every((r) => DEMONSTRATED_PHRASINGS.includes(qs.get(r.question).phrasing) && qs.get(r.question).demonstrated === true),
    'every row in a demonstrated phrasing',
  );
  t.ok(
    [...qs.values()].some((q) => q.demonstrated === false),
    'the questions include undemonstrated phrasings',
  );
  t.ok(expert.length <= 40, 'SFT sees at most the sampled share of the 40 training questions');
  for (const s of r.stages) {
    const sc = s.scores;
    t.equal(sc.demonstrated.questions + sc.undemonstrated.questions, 10, `${s.stage}: the groups split the held-out questions`);
    t.ok(Math.abs(sc.all.accuracy - s.summary.accuracy) < 1e-9, `${s.stage}: the groups' overall accuracy is the evaluation's`);
    t.equal(sc.all.pass_at_k, undefined, 'no pass@k without compare or passK');
  }
  t.match(lines.join('\n'), /expert: \d+ trajectories/);
});

t.test('--compare adds SFT trained longer and RFT with as many sampled episodes as GRPO, and pass@k', async (t) => {
  const out = join(t.testdir(), 'demo');
  const r = await runDemo({
    out,
    pages: 10,
    sftEpochs: 1,
    grpoSteps: 2,
    compare: true,
    passK: 2,
    overrides: { grpo: { rollout: { k: 2 } }, rft: { rollout: { k: 2 } } },
  });
  t.same(
    r.stages.map((s) => s.stage),
    ['baseline', 'sft', 'grpo', 'sft-long', 'rft'],
  );
  const by = Object.fromEntries(r.stages.map((s) => [s.stage, s]));
  t.equal(by.grpo.sampled_episodes, 2 * 8 * 2, 'GRPO: 2 steps x 8 questions x k 2');
  t.equal(by.rft.sampled_episodes, by.grpo.sampled_episodes, 'RFT samples as many episodes as GRPO');
  const rft = loadConfig(join(out, 'configs', 'rft.yaml'));
  t.equal(rft.stage, 'rft');
  t.equal(rft.model.adapter, join(out, 'runs', 'sft', 'adapter'), 'RFT starts from the SFT adapter');
  const grpo = loadConfig(join(out, 'configs', 'grpo.yaml'));
  const sampling = (c: typeof rft) => [c.rollout.k, c.rollout.batch_questions, c.rollout.temperature, c.rollout.top_p];
  t.same(sampling(rft), sampling(grpo), "GRPO's rollout settings (k, questions per batch, temperature, top-p)");
  // Both counts from what the stages recorded, not from the table's formula.
  const recorded = (stage: string) =>
    readFileSync(join(out, 'runs', stage, 'trajectories.jsonl'), 'utf8')
      .trim()
      .split('\n').length;
  t.equal(recorded('grpo'), by.grpo.sampled_episodes, 'GRPO recorded as many episodes as the table says');
  // The sampled episodes RFT recorded: as many as the table says, and it trained on the kept ones only.
  const eps = readFileSync(join(out, 'runs', 'rft', 'trajectories.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
  t.equal(eps.length, by.rft.sampled_episodes);
  t.ok(
    eps.every((e) => e.kept === false || e.reward === 1),
    'only correct episodes kept',
  );
  const long = loadConfig(join(out, 'configs', 'sft-long.yaml'));
  t.ok(long.train.epochs! > 1, `SFT trained longer: ${long.train.epochs} epochs`);
  t.equal(long.data.sft, loadConfig(join(out, 'configs', 'sft.yaml')).data.sft, 'on the same trajectories');
  for (const s of r.stages) {
    t.equal(s.summary.pass_k?.k, 2, `${s.stage}: pass@2 measured`);
    const rows = readFileSync(join(out, 'runs', 'evals', s.stage, 'pass_k.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    t.equal(rows.length, 10);
    t.ok(
      Math.abs(s.scores.all.pass_at_k! - rows.filter((x) => x.correct > 0).length / 10) < 1e-9,
      `${s.stage}: pass@2 = questions with a correct sample / 10`,
    );
  }
  t.match(r.table, /pass@2 % \|/);
  const res = JSON.parse(readFileSync(join(out, 'results.json'), 'utf8'));
  t.same(
    res.stages.map((s: { stage: string }) => s.stage),
    ['baseline', 'sft', 'grpo', 'sft-long', 'rft'],
  );
});

t.test("the demo's command line reaches runDemo", async (t) => {
  const y = (demoCommand.builder as (y: Argv) => Argv)(yargs([]).strict());
  const a = (await y.parse([
    '--compare',
    '--pass-k',
    '4',
    '--sft-examples',
    '50',
    '--seed',
    '2',
    '--grpo-steps',
    '3',
    '--sft-epochs',
    '5',
    '--pages',
    '20',
  ])) as Args;
  t.same(demoOptions(a, '/o'), { out: '/o', pages: 20, sftExamples: 50, sftEpochs: 5, grpoSteps: 3, seed: 2, compare: true, passK: 4 });
  const none = (await (demoCommand.builder as (y: Argv) => Argv)(yargs([])).parse([])) as Args;
  t.same(JSON.parse(JSON.stringify(demoOptions(none, '/o'))), { out: '/o' }, "without flags, runDemo's defaults");
});

// The embedded demo's parts: the byte-level BPE tokenizer it learns (a real Hugging Face
// tokenizer.json, read back by the same loader as any model's), the scripted expert (its programs run
// in the real Python sandbox and its answers are the gold ones), and the whole pipeline at a small
// scale (every stage runs, the table and the run folder are written). The full-size demo is the
// README's main command; its numbers are in the README.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { loadConfig } from '../lib/config/load.js';
import { trainByteLevelBpe } from '../lib/demo/bpe.js';
import { DEMO_SYSTEM_PROMPT, expertProgram, expertTrajectories } from '../lib/demo/expert.js';
import { PRINTING_KINDS, runDemo } from '../lib/demo/pipeline.js';
import { codeProtocol } from '../lib/episodes/protocol.js';
import { loadTokenizer } from '../lib/model/tokenizer.js';
import { Corpus } from '../lib/retrieval/corpus.js';
import { SearchIndex } from '../lib/retrieval/index.js';
import { syntheticCorpus } from '../lib/retrieval/synthetic.js';
import { createPythonPool } from '../lib/sandbox/python.js';

const gen = syntheticCorpus({ pages: 12, seed: 5 });

t.test('the learned BPE tokenizer round-trips text and is read by the Hugging Face loader', async (t) => {
  const dir = join(t.testdir(), 'tok');
  mkdirSync(dir);
  const special = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'];
  const added = ['<python>', '</python>'];
  const tj = trainByteLevelBpe(gen.pages.map((p) => p.content), { merges: 300, special, added });
  const model = tj.model as { vocab: Record<string, number>; merges: string[] };
  t.equal(model.merges.length, 300);
  t.equal(Object.keys(model.vocab).length, 256 + 300, '256 bytes + one piece per merge');
  writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(tj));
  writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify({ eos_token: '<|im_end|>' }));
  const tok = loadTokenizer(dir);
  t.equal(tok.vocabSize, 556 + 5);
  t.same(tok.stopTokenIds.sort(), [556, 558].sort(), '<|im_end|> and <|endoftext|> stop');
  const texts = [gen.pages[3].content, '<|im_start|>user\nQuestion: héllo wörld 😀 1234<|im_end|>\n<python>\nprint("x")\n</python>', '  spaces\n\n\ttabs  '];
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
  t.match(expertProgram(gen.questions[0]), /^hits = search_pages\(question\)\ntext = read_section\(hits\[0\]\["page_id"\] \+ ":history"\)\nfinal_answer\(re\.search/);
  // As the demo runs it: the question in a variable, the program answers with final_answer().
  const protocol = codeProtocol({ executor: pool, systemPrompt: DEMO_SYSTEM_PROMPT, questionVariable: 'question', finalAnswer: true });
  const { rows, rejected } = await expertTrajectories(gen.questions, protocol);
  t.equal(rows.length + rejected, gen.questions.length);
  t.ok(rows.length >= gen.questions.length * 0.8, `${rows.length} of ${gen.questions.length} accepted`);
  for (const r of rows) {
    t.same(r.messages.map((m) => m.role), ['system', 'user', 'assistant'], 'one turn: the program answers');
    t.equal(r.messages[0].content, DEMO_SYSTEM_PROMPT);
    t.equal(r.messages[1].content, `Question: ${r.question}`, 'the program does not contain the question; the prompt does');
    t.notOk(r.messages[2].content.includes(r.question), 'the program does not copy the question');
  }
  // Without final_answer(): the program prints the fact, a second turn answers with it.
  const printing = codeProtocol({ executor: pool, systemPrompt: DEMO_SYSTEM_PROMPT, questionVariable: 'question' });
  const two = await expertTrajectories(gen.questions, printing, { answer: 'print' });
  t.same(two.rows.map((r) => r.question), rows.map((r) => r.question), 'the same questions are accepted either way');
  for (const r of two.rows) {
    t.same(r.messages.map((m) => m.role), ['system', 'user', 'assistant', 'user', 'user', 'assistant'], 'program, output, final-turn notice, answer');
    t.match(r.messages[3].content, /^<python_output>\n[\s\S]+\n<\/python_output>$/);
    t.equal(r.messages[5].content, `<answer>${r.answer}</answer>`);
  }
});

t.test('the demo pipeline runs every stage at a small scale and writes its run folder', async (t) => {
  const out = join(t.testdir(), 'demo');
  const lines: string[] = [];
  const r = await runDemo({ out, pages: 10, sftEpochs: 1, grpoSteps: 1, log: (s) => lines.push(s) });
  t.same(r.stages.map((s) => s.stage), ['baseline', 'sft', 'grpo']);
  for (const s of r.stages) {
    t.equal(s.summary.questions, 10, `${s.stage}: the 10 held-out questions`);
    // the summary is the mean over its episodes, recomputed here from the trajectories
    const eps = readFileSync(join(out, 'runs', 'evals', s.stage, 'trajectories.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    t.equal(eps.length, 10);
    t.ok(Math.abs(s.summary.accuracy - eps.filter((e) => e.correct).length / 10) < 1e-9, `${s.stage}: accuracy ${s.summary.accuracy} = correct episodes / 10`);
    t.ok(Math.abs(s.summary.f1 - eps.reduce((a, e) => a + e.f1, 0) / 10) < 1e-9, `${s.stage}: f1 = the episodes' mean`);
  }
  t.ok(r.expert.accepted > 20, `${r.expert.accepted} expert trajectories`);
  t.equal(r.expert.rejected, 0, 'with BM25 over made-up names every expert program finds its page and fact');
  t.ok(r.expert.printing > 0 && r.expert.printing < r.expert.accepted, `${r.expert.printing} of them in the two-turn style`);
  const tok = loadTokenizer(join(out, 'model'));
  // Learned from the texts as the model sees them (the system prompt once per question), the prompt
  // is mostly whole words; learned once, it took 197 tokens at the full size.
  t.ok(tok.encode(DEMO_SYSTEM_PROMPT).length < 150, `the system prompt is ${tok.encode(DEMO_SYSTEM_PROMPT).length} tokens`);
  t.match(r.table, /\| stage \| accuracy % \|[\s\S]*\| baseline \|[\s\S]*\| sft \|[\s\S]*\| grpo \|/);
  t.match(readFileSync(join(out, 'report.md'), 'utf8'), /\| grpo \|/);
  for (const f of ['model/tokenizer.json', 'model/chat_template.jinja', 'data/expert.jsonl', 'index/manifest.json', 'runs/sft/adapter/adapter_config.json', 'runs/grpo/adapter/adapter_config.json', 'runs/evals/comparison.md'])
    t.ok(existsSync(join(out, f)), f);
  const grpo = loadConfig(join(out, 'configs', 'grpo.yaml'));
  t.equal(grpo.model.adapter, join(out, 'runs', 'sft', 'adapter'), 'GRPO starts from the SFT adapter');
  t.equal(grpo.protocol.question_variable, 'question', 'programs find the question in a variable');
  t.equal(grpo.protocol.final_answer, true, 'programs answer with final_answer()');
  t.equal(grpo.retrieval.kind, 'bm25');
  const expert = readFileSync(join(out, 'data', 'expert.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
  // The expert's habit: questions about founders and fairs mostly in two turns (print, then
  // <answer>), every other question in one turn whose program answers with final_answer().
  const kinds = new Map(readFileSync(join(out, 'data', 'questions.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l)).map((q) => [q.question, q.kind]));
  const two = expert.filter((r) => r.messages.length === 6);
  t.equal(two.length, r.expert.printing);
  t.ok(two.every((r) => PRINTING_KINDS.includes(kinds.get(r.question)) && /print\(/.test(r.messages[2].content) && r.messages[5].content === `<answer>${r.answer}</answer>`), 'two-turn rows: founders and fairs, printed then answered');
  t.ok(expert.filter((r) => r.messages.length !== 6).every((r) => r.messages.length === 3 && /final_answer\(/.test(r.messages[2].content)), 'the others are one-turn programs that answer');
  t.ok(expert.length <= 40, 'SFT sees at most the sampled share of the 40 training questions');
  t.match(lines.join('\n'), /expert: \d+ trajectories/);
});

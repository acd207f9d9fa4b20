// scripts/real-run.mjs (issue 32 item 4), the plumbing only, not the 30-minute run: the whole chain
// (corpus from the shared wiki excerpts, the scripted expert through the real sandbox, baseline ->
// SFT -> GRPO -> RFT with an evaluation after each, the table) at toy scale on a tiny random model,
// with configs/real-smollm2-*.yaml and --set overrides. Checked: the configs load and their values
// reach the runs (the system prompt, the expert program, the adapters each stage starts from), each
// --set reaches the stage it names and no other, the results and the table hold every stage, --table
// combines runs, and bad arguments are refused.
import { spawn } from 'node:child_process';
import { copyFileSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import YAML from 'yaml';
import { loadConfig } from '../lib/config/load.js';
import { normalizeId } from '../lib/retrieval/corpus.js';
import { initModel } from '../lib/model/init.js';
import { dataFile, fixture, haveShared, needs, repoRoot } from './helpers/shared.js';

const script = join(repoRoot, 'scripts', 'real-run.mjs');
const jsonl = (f: string) =>
  readFileSync(f, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l));

function node(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((done) => {
    const p = spawn(process.execPath, [script, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (c) => (stdout += c));
    p.stderr.on('data', (c) => (stderr += c));
    p.on('close', (code) => done({ code, stdout, stderr }));
  });
}

t.test('the three configs load as the stages they name, with one protocol', async (t) => {
  const cfgs = ['sft', 'grpo', 'rft'].map((s) => loadConfig(join(repoRoot, 'configs', `real-smollm2-${s}.yaml`)));
  t.same(
    cfgs.map((c) => c.stage),
    ['sft', 'grpo', 'rft'],
  );
  for (const c of cfgs) {
    t.match(c.protocol, { kind: 'code', question_variable: 'question', max_turns: 2, tool_output_chars: 1000 });
    t.equal(c.protocol.system_prompt, cfgs[0].protocol.system_prompt, `${c.stage}: the same system prompt as SFT`);
    t.same(c.reward.parts, cfgs[0].reward.parts, `${c.stage}: the same reward`);
    t.match(c.eval, { pass_k: 2, max_questions: 32 }, `${c.stage}: every evaluation asks 32 held-out questions, pass@2`);
  }
  t.equal(
    cfgs[1].model.adapter,
    join(repoRoot, 'runs', 'real-smollm2', 'runs', 'real-smollm2-sft', 'adapter'),
    'GRPO starts from the SFT adapter (where real-smollm2-sft.yaml, run alone, writes it)',
  );
  t.equal(cfgs[2].model.adapter, cfgs[1].model.adapter, 'RFT starts from the same adapter');
  t.match(cfgs[0], { optim: { lr: 1e-3 }, train: { epochs: 1, batch_size: 4 } }, 'SFT: 1 epoch, 4 conversations a step, lr 1e-3');
  const [grpo, rft] = [cfgs[1], cfgs[2]];
  const sampled = [
    grpo.train.steps! * grpo.rollout.batch_questions * grpo.rollout.k,
    rft.rft.rounds * rft.rft.questions_per_round! * rft.rollout.k,
  ];
  t.same(sampled, [64, 64], 'GRPO and RFT sample as many episodes (64)');
  t.equal(cfgs[1].optim.lr, cfgs[2].optim.lr, 'GRPO and RFT at the same rate');
});

const skip = needs(!haveShared && 'the shared data (../shared/data)', t);
t.test('the whole chain at toy scale on a tiny random model', { skip, timeout: 900_000 }, async (t) => {
  const root = t.testdir();
  const model = join(root, 'model');
  initModel({ preset: 'tiny', out: model, seed: 1 });
  copyFileSync(fixture('qwen3-tokenizer', 'chat_template.jinja'), join(model, 'chat_template.jinja'));
  const out = join(root, 'out');
  const tiny = [
    '--set',
    'eval.max_questions=3',
    '--set',
    'eval.pass_k=2',
    '--set',
    'rollout.k=2',
    '--set',
    'protocol.max_new_tokens=8',
    '--set',
    'lora.r=4',
    '--set',
    'sandbox.workers=1',
  ];
  const perStage = [
    '--set',
    'sft:train.steps=2',
    '--set',
    'sft:optim.warmup_steps=0',
    '--set',
    'grpo:train.steps=1',
    '--set',
    'rft:rft.questions_per_round=2',
    '--set',
    'grpo:optim.lr=3e-5',
  ];
  const r = await node(['--out', out, '--model', model, '--seed', '3', ...tiny, ...perStage]);
  t.equal(r.code, 0, `real-run exits 0${r.code ? `\n${r.stderr.slice(-3000)}` : ''}`);

  // The corpus: one page per titled page of the excerpts, its distinct fragments.
  const excerpts = jsonl(dataFile('wiki-excerpts', 'page_excerpts.jsonl')) as Array<{ page_title: string | null; fragment: string | null }>;
  const pages = jsonl(join(out, 'data', 'corpus.jsonl'));
  const titled = excerpts.filter((e) => e.page_title && e.fragment);
  t.equal(
    pages.length,
    new Set(titled.map((e) => normalizeId(e.page_title!))).size,
    'a page per titled excerpt page (titles with the same id are one page)',
  );
  t.ok(
    pages.every((p) => p.id && p.title && p.content),
    'rows {id, title, content}',
  );
  const byId = new Map(pages.map((p) => [p.id, p.content as string]));
  t.ok(
    titled.every((e) => byId.get(normalizeId(e.page_title!))?.includes(e.fragment!)),
    "every titled fragment is in its page's content",
  );

  // The expert: the config's system prompt, the fixed program, an answer that the output holds.
  const sftCfg = loadConfig(join(repoRoot, 'configs', 'real-smollm2-sft.yaml'));
  const expert = jsonl(join(out, 'data', 'expert.jsonl'));
  const results = JSON.parse(readFileSync(join(out, 'results.json'), 'utf8'));
  t.equal(expert.length, results.expert.kept);
  t.ok(expert.length > 20 && expert.length < 382, `some training questions kept (${expert.length} of 382)`);
  for (const e of expert.slice(0, 5)) {
    t.same(e.messages[0], { role: 'system', content: sftCfg.protocol.system_prompt });
    t.match(e.messages[2].content, /^<python>\nws = \[w for w in re\.findall[\s\S]*search_pages\(question\)/);
    t.equal(e.messages.at(-1).content, `<answer>${e.answer}</answer>`);
    t.match(
      e.messages[3].content.toLowerCase(),
      e.answer.toLowerCase().split(/\W+/).filter(Boolean)[0],
      'the answer is in the printed output',
    );
  }
  t.ok(results.ceiling.answer_in_output > 0 && results.ceiling.answer_in_output < 1);

  // Every stage, evaluated on the 3 held-out questions with pass@2; the options reached their stage.
  t.same(
    results.stages.map((s: { stage: string }) => s.stage),
    ['baseline', 'sft', 'grpo', 'rft'],
  );
  for (const s of results.stages) t.match(s, { questions: 3, pass_k: { k: 2 } });
  t.same(
    results.stages.map((s: { sampled_episodes: number }) => s.sampled_episodes),
    [0, 0, 1 * 2 * 2, 1 * 2 * 2],
    'GRPO: 1 step x 2 questions x 2 rollouts; RFT: 1 round x 2 questions x 2',
  );
  const resolved = (stage: string) => YAML.parse(readFileSync(join(out, 'runs', stage, 'config.yaml'), 'utf8'));
  const [sft, grpo, rft] = ['sft', 'grpo', 'rft'].map(resolved);
  t.match(sft, { stage: 'sft', train: { steps: 2, seed: 3 }, model: { path: model }, data: { sft: join(out, 'data', 'expert.jsonl') } });
  t.match(grpo, {
    stage: 'grpo',
    train: { steps: 1, seed: 3 },
    optim: { lr: 3e-5 },
    model: { adapter: join(out, 'runs', 'sft', 'adapter') },
  });
  t.match(rft, {
    stage: 'rft',
    rft: { questions_per_round: 2 },
    optim: { lr: 3e-4 },
    model: { adapter: join(out, 'runs', 'sft', 'adapter') },
  });
  t.equal(sft.optim.lr, 1e-3, 'grpo:optim.lr reached GRPO only');
  for (const c of [sft, grpo, rft]) t.match(c, { lora: { r: 4 }, protocol: { max_new_tokens: 8 }, rollout: { k: 2 } });
  const evalSummary = JSON.parse(readFileSync(join(out, 'runs', 'evals', 'grpo', 'summary.json'), 'utf8'));
  t.match(evalSummary, { label: 'grpo', adapter: join(out, 'runs', 'grpo', 'adapter'), questions: 3, max_new_tokens: 8 });

  // The table: on stdout, in report.md, and over two runs with --table.
  t.match(r.stdout, /^\| stage \| EM % \| SubEM % \| F1 % \| pass@2 \(EM\) % \|/);
  t.match(r.stdout, /\n\| rft \| [\d.]+ \|/);
  t.match(readFileSync(join(out, 'report.md'), 'utf8'), r.stdout.trim());
  const two = await node(['--table', out, out]);
  t.equal(two.code, 0);
  t.match(two.stdout, /\| baseline \| ([\d.]+) \/ \1 \|/, 'one cell per run');
});

t.test('bad arguments are refused with what was expected', async (t) => {
  const r = await node(['--set', 'train.steps']);
  t.equal(r.code, 2);
  t.match(r.stderr, /--set: expected \[STAGE:\]KEY=VALUE .*found "train\.steps"/);
  const s = await node(['--seed', '-1']);
  t.equal(s.code, 2);
  t.match(s.stderr, /--seed: expected a non-negative integer/);
});

// End to end through the command line, at tiny scale, with the shipped configs and key=value
// overrides (issue 5, item 10): SFT on the reference's expert trajectories, GRPO with the code
// protocol in the Python sandbox scored by an LLM judge on a loopback OpenAI-compatible server, PPO
// with Search-R1 tags, --resume, and eval of the base model and the SFT adapter with the comparison
// table. The tiny model is random, so what is checked is the wiring and the files, not learning
// (test/grpo.test.ts and test/ppo.test.ts show learning).
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { copyFileSync, existsSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { initModel } from '../lib/model/init.js';
import { syntheticCorpus } from '../lib/retrieval/synthetic.js';
import { runCliAsync } from './helpers/cli.js';
import { dataFile, fixture, repoRoot } from './helpers/shared.js';

const root = t.testdir();
const model = join(root, 'model');
const runs = join(root, 'runs');
const cfg = (name: string) => join(repoRoot, 'configs', name);
const jsonl = (f: string) =>
  readFileSync(f, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l));

t.before(() => {
  initModel({ preset: 'tiny', out: model, seed: 1 });
  // Qwen3's template as Hugging Face ships it with the tokenizer (the packaged hybrid-thinking one
  // re-renders earlier turns, which SFT on multi-turn conversations cannot use).
  copyFileSync(fixture('qwen3-tokenizer', 'chat_template.jinja'), join(model, 'chat_template.jinja'));
  const { pages, questions } = syntheticCorpus({ pages: 40, seed: 2 });
  writeFileSync(join(root, 'corpus.jsonl'), pages.map((p) => JSON.stringify(p)).join('\n') + '\n');
  writeFileSync(
    join(root, 'questions.jsonl'),
    questions
      .slice(0, 20)
      .map((q) => JSON.stringify({ id: q.id, question: q.question, answer: q.answer }))
      .join('\n') + '\n',
  );
});

const common = () => [
  `model.path=${model}`,
  'model.dtype=float32',
  'model.device=cpu',
  `data.questions=${join(root, 'questions.jsonl')}`,
  `data.corpus=${join(root, 'corpus.jsonl')}`,
  `run.dir=${runs}`,
  'lora.r=4',
  'lora.alpha=8',
];

async function cli(t: Test, args: string[], expect = 0) {
  const r = await runCliAsync(args, { cwd: root });
  t.equal(
    r.code,
    expect,
    `slm-train ${args.slice(0, 3).join(' ')} exits ${expect}${r.code !== expect ? `\n${r.stderr.slice(-3000)}` : ''}`,
  );
  return r;
}

t.test('SFT (configs/code-sft.yaml) on the reference trajectories, then eval of base and SFT', async (t) => {
  const r = await cli(t, [
    'train',
    '--config',
    cfg('code-sft.yaml'),
    ...common(),
    `data.sft=${dataFile('seed-sft', 'trajectories.jsonl')}`,
    'train.steps=2',
    'optim.warmup_steps=0',
    'train.batch_size=2',
    'protocol.max_context=4096',
    '--json',
  ]);
  const out = JSON.parse(r.stdout);
  const dir = join(runs, 'code-sft');
  t.match(out, { stage: 'sft', steps: 2, dir, adapter: join(dir, 'adapter') });
  t.match(r.stderr, /dropped \d+ of 81 rows marked in_test_split/, 'eval questions are not trained on');
  const metrics = jsonl(join(dir, 'metrics.jsonl'));
  t.equal(metrics.length, 2);
  t.ok(
    metrics.every((m) => Number.isFinite(m.loss) && m.loss > 0 && m.mask_coverage > 0 && m.mask_coverage < 1),
    'finite loss on assistant tokens only',
  );
  t.ok(existsSync(join(dir, 'checkpoints', 'step-2', 'adapter', 'adapter_model.safetensors')));
  t.match(JSON.parse(readFileSync(join(dir, 'adapter', 'adapter_config.json'), 'utf8')), { peft_type: 'LORA', r: 4, lora_alpha: 8 });
  t.match(readFileSync(join(dir, 'config.yaml'), 'utf8'), /stage: sft[\s\S]*r: 4/, 'the resolved config is in the run folder');

  const again = await cli(
    t,
    ['train', '--config', cfg('code-sft.yaml'), ...common(), `data.sft=${dataFile('seed-sft', 'trajectories.jsonl')}`],
    2,
  );
  t.match(again.stderr, /error RUN_EXISTS: .*--resume/, 'an existing run is not overwritten');

  const evalArgs = [
    'eval',
    '--config',
    cfg('code-sft.yaml'),
    ...common(),
    `data.sft=${dataFile('seed-sft', 'trajectories.jsonl')}`,
    'eval.max_questions=3',
    'protocol.max_new_tokens=16',
    'sandbox.workers=1',
    '--json',
  ];
  const base = JSON.parse((await cli(t, evalArgs)).stdout);
  t.match(base, { label: 'base', adapter: null, split: 'eval', questions: 3, accuracy_by: 'em' });
  const sft = JSON.parse((await cli(t, [...evalArgs, '--adapter', join(dir, 'adapter')])).stdout);
  t.match(sft, { label: 'code-sft', adapter: join(dir, 'adapter'), questions: 3 });
  for (const s of [base, sft])
    for (const k of ['accuracy', 'em', 'f1', 'rouge_l', 'avg_turns']) t.ok(Number.isFinite(s[k]), `${s.label}: ${k}`);
  const rows = jsonl(join(runs, 'evals', 'code-sft', 'trajectories.jsonl'));
  t.equal(rows.length, 3);
  // The summary is the mean of its episodes' scores, recomputed here from the trajectories.
  const mean = (k: string, xs = rows) => xs.reduce((a, x) => a + Number(x[k]), 0) / xs.length;
  for (const [k, e] of [
    ['accuracy', 'correct'],
    ['em', 'em'],
    ['f1', 'f1'],
    ['rouge_l', 'rouge_l'],
    ['avg_turns', 'turns'],
  ])
    t.ok(Math.abs(sft[k] - mean(e)) < 1e-9, `code-sft: ${k} ${sft[k]} = the mean of the episodes' ${e} (${mean(e)})`);
  const baseRows = jsonl(join(runs, 'evals', 'base', 'trajectories.jsonl'));
  t.ok(Math.abs(base.f1 - mean('f1', baseRows)) < 1e-9 && Math.abs(base.avg_turns - mean('turns', baseRows)) < 1e-9, 'base: likewise');
  // The eval split is the last 20 % by index: questions 16-19 of the 20.
  const ids = jsonl(join(root, 'questions.jsonl')).map((q) => q.id);
  t.same(
    rows.map((x) => x.id),
    ids.slice(16, 19),
  );
  t.ok(rows.every((x) => Array.isArray(x.messages) && x.messages[0].role === 'system' && 'em' in x && 'f1' in x));
  const table = readFileSync(join(runs, 'evals', 'comparison.md'), 'utf8');
  t.match(table, /\| run \| split \| n \| accuracy %/);
  t.match(table, /\| base \| eval \| 3 \|[\s\S]*\| code-sft \| eval \| 3 \|/, 'one row per evaluation, in order');
});

t.test('GRPO (configs/code-grpo.yaml): Python sandbox, judge on a loopback endpoint, resume', async (t) => {
  let calls = 0;
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      calls++;
      // correct / incorrect alternately (the groups have variance), in the reference's binary format
      const category = calls % 2 ? 'correct' : 'incorrect';
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          choices: [
            {
              index: 0,
              message: { role: 'assistant', content: `Reasoning...\n{"category": "${category}", "approach_score": 40}` },
              finish_reason: 'stop',
            },
          ],
        }),
      );
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
  const args = (steps: number) => [
    'train',
    '--config',
    cfg('code-grpo.yaml'),
    ...common(),
    'rollout.k=2',
    'rollout.batch_questions=2',
    'protocol.max_new_tokens=24',
    'sandbox.workers=2',
    `train.steps=${steps}`,
    'train.checkpoint_every=1',
    `reward.judge.base_url=${url}`,
    'reward.judge.model=fake-judge',
    'reward.judge.skip_without_answer=false',
    `data.sft=${dataFile('seed-sft', 'trajectories.jsonl')}`,
  ];
  await cli(t, args(1));
  const r = await cli(t, [...args(2), '--resume']);
  t.match(r.stderr, /environment: protocol code, python sandbox \(2 workers, 10 s, 512 MB, isolation (bwrap|unshare|rlimits-only)\)/);
  const dir = join(runs, 'code-grpo');
  const metrics = jsonl(join(dir, 'metrics.jsonl'));
  t.same(
    metrics.map((m) => m.step),
    [1, 2],
    'the resumed run continues at step 2',
  );
  t.same(
    readdirSync(join(dir, 'checkpoints'))
      .filter((d) => d.startsWith('step-'))
      .sort(),
    ['step-1', 'step-2'],
  );
  const traj = jsonl(join(dir, 'trajectories.jsonl'));
  t.equal(traj.length, 8, '2 steps x 2 questions x 2 rollouts');
  t.equal(calls, 8, 'the judge was asked once per episode');
  t.ok(
    traj.every((x) => (x.parts.judge_correctness === 1 || x.parts.judge_correctness === 0) && x.parts.judge_approach === 0.4),
    'judge verdicts reach the reward parts',
  );
  // The reference's sign x magnitude: correct +0.4, wrong -(1 - 0.4) = -0.6.
  t.ok(
    traj.every((x) => Math.abs(x.reward - (x.parts.judge_correctness === 1 ? 0.4 : -0.6)) < 1e-9),
    'reward = +approach when correct, -(1 - approach) when wrong',
  );
  t.ok(
    traj.every((x) => x.messages[0].content.startsWith('Answer questions using Python code to search Wikipedia.')),
    "episodes start from the SFT trajectories' system prompt",
  );
  t.ok(
    traj.every(
      (x) =>
        x.turns >= 1 &&
        x.turns <= 2 &&
        Array.isArray(x.messages) &&
        typeof x.temperature === 'number' &&
        x.temperature >= 0.7 &&
        x.temperature <= 1.15,
    ),
  );
  t.ok(
    traj.some((x) => x.advantage !== null),
    'groups with mixed grades get advantages',
  );
});

t.test('PPO (configs/search-r1-ppo.yaml): tags protocol, index saved and reused', async (t) => {
  const index = join(root, 'index');
  // The config validates on Search-R1's test file (data.eval_questions): here the same small questions file.
  const args = [
    'train',
    '--config',
    cfg('search-r1-ppo.yaml'),
    ...common(),
    `data.eval_questions=${join(root, 'questions.jsonl')}`,
    `data.index=${index}`,
    'rollout.batch_questions=2',
    'protocol.max_new_tokens=24',
    'train.steps=2',
    'train.eval_every=2',
    'eval.max_questions=2',
    '--json',
  ];
  const r = await cli(t, args);
  t.match(JSON.parse(r.stdout), { stage: 'ppo', steps: 2 }, 'stdout holds only the JSON result');
  // Progress on stderr, as plain lines (stderr is a pipe here): counts, rate, ETA, live reward.
  t.match(r.stderr, /^\[progress\] index embed: \d+ chunks$/m, 'indexing progress');
  t.match(r.stderr, /^\[progress\] ppo: 2 steps$/m, 'the training phase starts with its count');
  t.match(
    r.stderr,
    /^\[progress\] ppo: 1\/2 steps \(50 %\), [\d.]+ (s\/step|steps\/s), elapsed [^,]+, ETA [\dms.h ]+, reward -?[\d.]+(, acc [\d.]+ %)?$/m,
    'a line at half way with count, rate, ETA and reward',
  );
  t.match(
    r.stderr,
    /^\[progress\] ppo: 2\/2 steps \(100 %\), [\d.]+ (s\/step|steps\/s), elapsed [^,]+, reward -?[\d.]+(, acc [\d.]+ %)?, done$/m,
    'and a final line',
  );
  t.match(
    r.stderr,
    /^\[progress\] eval search-r1-ppo@step-2: 2\/2 questions \(100 %\), .*reward -?[\d.]+, acc [\d.]+ %, done$/m,
    'the evaluation during training has its own progress',
  );
  // biome-ignore lint/suspicious/noControlCharactersInRegex: ESC (\x1b) starts the terminal escape codes looked for here.
  t.notMatch(r.stderr, /\r|\x1b\[/, 'no bar redraws in a non-interactive stderr');
  t.notMatch(r.stdout, /\[progress\]/);
  t.ok(existsSync(join(index, 'manifest.json')), 'the index built from the corpus is saved to data.index');
  const dir = join(runs, 'search-r1-ppo');
  const all = jsonl(join(dir, 'metrics.jsonl'));
  const metrics = all.filter((m) => m.kind !== 'eval');
  t.equal(metrics.length, 2);
  t.ok(
    metrics.every((m) => Number.isFinite(m.vf_loss) && Number.isFinite(m.values_mean)),
    'critic metrics logged',
  );
  // train.eval_every 2: the model is evaluated at step 2, as it trains.
  const evals = all.filter((m) => m.kind === 'eval');
  t.same(
    evals.map((m) => m.step),
    [2],
  );
  t.ok(Number.isFinite(evals[0].eval_f1) && Number.isFinite(evals[0].eval_avg_turns));
  t.match(JSON.parse(readFileSync(join(dir, 'evals', 'step-2', 'summary.json'), 'utf8')), {
    label: 'search-r1-ppo@step-2',
    questions: 2,
    max_turns: 2,
  });
  t.match(r.stderr, /eval at step 2: accuracy/);
  t.ok(existsSync(join(dir, 'adapter', 'value_head.safetensors')), 'the value head is saved beside the adapter');
  t.ok(
    metrics.every((m) => ['reward_mean', 'answered', 'response_tokens_max', 'tool_turns_mean', 'time_step_s'].every((k) => k in m)),
    'rollout metrics in every row',
  );
  t.equal(readdirSync(join(dir, 'tb')).filter((f) => /^events\.out\.tfevents\.\d+\./.test(f)).length, 1, 'a TensorBoard event file');
  t.match(
    readFileSync(join(dir, 'report.html'), 'utf8'),
    /<h1>slm-train run search-r1-ppo<\/h1>[\s\S]*id="report-data"/,
    'the HTML report is written at the end',
  );
  t.match(r.stderr, new RegExp(`report: ${join(dir, 'report.html').replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}`));
  const traj = jsonl(join(dir, 'trajectories.jsonl'));
  t.equal(traj.length, 4);
  t.ok(
    traj.every((x) => x.messages[0].role === 'user' && /<search>/.test(x.messages[0].content)),
    'Search-R1 instruction',
  );
  const ev = await cli(t, [
    'eval',
    '--config',
    cfg('search-r1-ppo.yaml'),
    ...common(),
    `data.eval_questions=${join(root, 'questions.jsonl')}`,
    `data.index=${index}`,
    'eval.max_questions=2',
    'protocol.max_new_tokens=16',
    '--adapter',
    join(dir, 'adapter'),
    '--json',
  ]);
  t.match(ev.stderr, /index: .*\/index \(40 pages/, 'eval loads the saved index');
  t.match(JSON.parse(ev.stdout), { label: 'search-r1-ppo', max_turns: 2, questions: 2 });
});

t.test('eval with the judge on the native engine (reward.judge.model_path): a failed grade is recorded, never a silent zero', async (t) => {
  const r = await cli(t, [
    'eval',
    '--config',
    cfg('code-grpo.yaml'),
    ...common(),
    `data.sft=${dataFile('seed-sft', 'trajectories.jsonl')}`,
    `reward.judge.model_path=${model}`,
    'reward.judge.max_new_tokens=8',
    'reward.judge.skip_without_answer=false',
    'eval.max_questions=2',
    'protocol.max_new_tokens=8',
    'sandbox.workers=1',
    '--label',
    'engine-judge',
    '--json',
  ]);
  t.match(r.stderr, /judge: .*model on the native engine/);
  t.match(JSON.parse(r.stdout), { label: 'engine-judge', accuracy_by: 'judge', questions: 2, accuracy: 0 });
  const rows = jsonl(join(runs, 'evals', 'engine-judge', 'trajectories.jsonl'));
  t.equal(rows.length, 2);
  for (const x of rows) {
    t.equal(x.parts.judge_correctness, null, 'an unreadable reply leaves the part empty');
    t.equal(x.parts.judge_error, 1);
    t.equal(x.reward, -1, "the reference's -1 for a failed judge call, recorded as a failure");
    t.match(x.reward_errors.judge, /engine judge: Expected the judge's reply to end with a JSON object/, 'and says why');
  }
});

t.test('config errors are clear and name the key', async (t) => {
  const r = await cli(t, ['train', '--config', cfg('code-grpo.yaml'), ...common(), 'rollout.kk=3'], 2);
  t.match(r.stderr, /error CONFIG_UNKNOWN_KEY: .*rollout\.kk.*did you mean rollout\.k\?/);
  const m = await cli(t, ['train', '--config', cfg('code-grpo.yaml'), ...common(), `data.questions=${join(root, 'nope.jsonl')}`], 2);
  t.match(m.stderr, /error FILE_NOT_FOUND: .*data\.questions: .*nope\.jsonl/);
});

t.test("the SFT+PPO report's evaluation (configs/search-r1-eval.yaml) against slm-train serve-retriever", async (t) => {
  // Our index behind Search-R1's retrieval API, read by retrieval.kind http.
  const { SearchIndex } = await import('../lib/retrieval/index.js');
  const { Corpus } = await import('../lib/retrieval/corpus.js');
  const { RetrieverServer } = await import('../lib/retrieval/server.js');
  const server = new RetrieverServer({ index: await SearchIndex.build(await Corpus.load(join(root, 'corpus.jsonl'))), port: 0 });
  const url = `http://127.0.0.1:${await server.listen()}/retrieve`;
  t.teardown(() => server.close());
  const dir = join(root, 'report-runs');
  // Search-R1's layout: golden_answers lists and a data_source per row.
  const qfile = join(root, 'report-questions.jsonl');
  writeFileSync(
    qfile,
    jsonl(join(root, 'questions.jsonl'))
      .slice(0, 3)
      .map((q, i) =>
        JSON.stringify({ id: q.id, question: q.question, golden_answers: [q.answer, 'x'], data_source: i % 2 ? 'hotpotqa' : 'nq' }),
      )
      .join('\n') + '\n',
  );
  const args = (label: string) => [
    'eval',
    '--config',
    cfg('search-r1-eval.yaml'),
    `model.path=${model}`,
    'model.dtype=float32',
    'model.device=cpu',
    `data.questions=${qfile}`,
    'data.corpus=null',
    'data.index=null',
    'retrieval.kind=http',
    `retrieval.url=${url}`,
    `run.dir=${dir}`,
    'eval.max_questions=3',
    'protocol.max_new_tokens=24',
    '--label',
    label,
  ];
  await cli(t, args('Base'));
  const r = await cli(t, args('SFT+PPO'));
  const table = r.stdout.split('\n').filter((l) => l.startsWith('|'));
  t.same(table.slice(0, 2), ['| configuration | EM | ROUGE-L |', '|---|---:|---:|'], "the report's table shape");
  t.match(table[2], /^\| Base \| \d\.\d{3} \| \d\.\d{3} \|$/);
  t.match(table[3], /^\| SFT\+PPO \| \d\.\d{3} \| \d\.\d{3} \|$/);
  t.match(r.stderr, /retrieval server http:\/\/127\.0\.0\.1:\d+\/retrieve/, 'searches go to the server');
  const s = JSON.parse(readFileSync(join(dir, 'evals', 'SFT+PPO', 'summary.json'), 'utf8'));
  t.match(s.by_source, { nq: { questions: 2 }, hotpotqa: { questions: 1 } }, 'EM/F1/ROUGE-L per data_source');
  t.match(
    s,
    { questions: 3, split: 'all', max_turns: 5, temperature: 0.7, top_p: 0.9, top_k: 3, max_new_tokens: 24 },
    "the report's sampling settings (max_new_tokens overridden here for time)",
  );
});

t.test('the no-search baseline: the same PPO config trains and evaluates with protocol.kind=direct, no corpus needed', async (t) => {
  const dir = join(root, 'direct-runs');
  const over = [
    'protocol.kind=direct',
    'data.corpus=null',
    'data.index=null',
    `data.eval_questions=${join(root, 'questions.jsonl')}`,
    `run.dir=${dir}`,
    'rollout.batch_questions=2',
    'protocol.max_new_tokens=16',
  ];
  const common0 = common().filter((a) => !a.startsWith('data.corpus=') && !a.startsWith('run.dir='));
  const r = await cli(t, [
    'train',
    '--config',
    cfg('search-r1-ppo.yaml'),
    ...common0,
    ...over,
    'train.steps=1',
    'train.eval_every=0',
    '--json',
  ]);
  t.match(JSON.parse(r.stdout), { stage: 'ppo', steps: 1 });
  t.match(r.stderr, /protocol direct \(no search\)/);
  const traj = jsonl(join(dir, 'search-r1-ppo', 'trajectories.jsonl'));
  t.equal(traj.length, 2);
  t.ok(
    traj.every(
      (x) =>
        /^Answer the given question\. You should first have a reasoning process in mind/.test(x.messages[0].content) &&
        !/<search>/.test(x.messages[0].content),
    ),
    "Search-R1's no-search instruction (nq.py), no search tags",
  );
  t.ok(
    traj.every((x) => !x.messages.some((m: { content: string }) => /<information>/.test(m.content))),
    'no passages in any episode',
  );
  const ev = await cli(t, [
    'eval',
    '--config',
    cfg('search-r1-ppo.yaml'),
    ...common0,
    ...over,
    'eval.max_questions=2',
    '--adapter',
    join(dir, 'search-r1-ppo', 'adapter'),
    '--json',
  ]);
  t.match(JSON.parse(ev.stdout), { questions: 2 });
  const rows = jsonl(join(dir, 'evals', 'search-r1-ppo', 'trajectories.jsonl'));
  t.ok(
    rows.every((x) => Array.isArray(x.calls) && x.calls.length === 0),
    'no tool calls in evaluation',
  );
});

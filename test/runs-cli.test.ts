// Runs as a practitioner manages them (issue 36, item 7): train.save_total_limit keeps the newest N
// checkpoints (never the one a resume loads); --resume onto another learning-rate schedule is
// RESUME_SCHEDULE_CHANGED unless --allow-schedule-change; a step that trained nothing says why on the
// console; --version; --model given an adapter folder points to --adapter. Through the built CLI on
// the tiny preset.
import { mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { initModel } from '../lib/model/init.js';
import { RunFolder } from '../lib/train/run.js';
import { learningRate } from '../lib/train/schedule.js';
import { nothingTrained } from '../lib/train/session.js';
import { repoRoot } from './helpers/shared.js';
import { runCliAsync } from './helpers/cli.js';

const root = t.testdir();
const model = join(root, 'model');
const jsonl = (f: string) =>
  readFileSync(f, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Record<string, unknown>);
const steps = (dir: string) =>
  readdirSync(join(dir, 'checkpoints'))
    .filter((d) => /^step-\d+$/.test(d))
    .sort();

t.before(() => {
  initModel({ preset: 'tiny', out: model, seed: 1 });
  const rows = Array.from({ length: 4 }, (_, i) => ({
    messages: [
      { role: 'user', content: `Q${i}?` },
      { role: 'assistant', content: `A${i}.` },
    ],
  }));
  writeFileSync(join(root, 'sft.jsonl'), rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
  const common = ['model:', '  path: model', '  dtype: float32', 'lora:', '  r: 2', '  alpha: 4', 'run:', '  dir: runs', ''];
  writeFileSync(
    join(root, 'sft.yaml'),
    [
      'stage: sft',
      'data:',
      '  sft: sft.jsonl',
      'train:',
      '  epochs: 4',
      '  steps: 4',
      '  batch_size: 1',
      '  checkpoint_every: 1',
      '  save_total_limit: 2',
      'optim:',
      '  lr: 1.0e-3',
      '  schedule: linear',
      '  warmup_steps: 0',
      ...common,
    ].join('\n'),
  );
  // GRPO whose every group gets the same reward (a reward module that returns 0): no step trains.
  writeFileSync(
    join(root, 'questions.jsonl'),
    ['{"question": "What is 1+1?", "answer": "2"}', '{"question": "What is 2+2?", "answer": "4"}'].join('\n') + '\n',
  );
  writeFileSync(join(root, 'zero.mjs'), 'export function reward() { return 0; }\n');
  writeFileSync(
    join(root, 'grpo.yaml'),
    [
      'stage: grpo',
      'data:',
      '  questions: questions.jsonl',
      '  split: { train_fraction: 1.0 }',
      'protocol:',
      '  kind: direct',
      '  max_new_tokens: 3',
      'rollout:',
      '  k: 2',
      '  batch_questions: 1',
      'reward:',
      '  module: zero.mjs',
      '  parts: [{ kind: module }]',
      'train:',
      '  steps: 1',
      ...common,
    ].join('\n'),
  );
});

const cli = (args: string[]) => runCliAsync(args, { cwd: root });

t.test('save_total_limit keeps the newest N; a resume onto a changed schedule is refused unless --allow-schedule-change', async (t) => {
  const dir = join(root, 'runs', 'sft');
  const first = await cli(['train', '--config', 'sft.yaml']);
  t.equal(first.code, 0, `trains 4 steps${first.code ? `\n${first.stderr.slice(-2000)}` : ''}`);
  t.same(steps(dir), ['step-3', 'step-4'], 'train.save_total_limit 2: the newest two of four checkpoints');
  t.match(first.stderr, /checkpoints: removed step-1 \(train\.save_total_limit 2\)/, 'the log says which were removed');
  t.match(
    JSON.parse(readFileSync(join(dir, 'checkpoints', 'step-4', 'state.json'), 'utf8')),
    { step: 4, schedule: { kind: 'linear', lr: 1e-3, warmupSteps: 0, totalSteps: 4 } },
    'the schedule is recorded with the checkpoint',
  );

  const refused = await cli(['train', '--config', 'sft.yaml', '--resume', 'train.steps=8']);
  t.equal(refused.code, 2, 'a coded error');
  t.match(
    refused.stderr,
    /error RESUME_SCHEDULE_CHANGED: --resume: the learning-rate schedule differs from the one .*step-4 was trained on \(total steps \(train\.steps, or train\.epochs x the batches of an epoch\): 4 -> 8\), so the learning rate of step 5 would be 0\.0005 instead of 0\. .*--allow-schedule-change/,
  );
  t.same(steps(dir), ['step-3', 'step-4'], 'nothing of the run changed');
  t.equal(jsonl(join(dir, 'metrics.jsonl')).length, 4, 'its metrics neither');

  const lrRefused = await cli(['train', '--config', 'sft.yaml', '--resume', 'optim.lr=2e-3']);
  t.match(lrRefused.stderr, /RESUME_SCHEDULE_CHANGED: .*\(optim\.lr: 0\.001 -> 0\.002\)/, 'a changed optim.lr too');

  const allowed = await cli(['train', '--config', 'sft.yaml', '--resume', 'train.steps=8', '--allow-schedule-change', '--json']);
  t.equal(allowed.code, 0, `continues with the flag${allowed.code ? `\n${allowed.stderr.slice(-2000)}` : ''}`);
  t.match(
    allowed.stderr,
    /resume: the learning-rate schedule changed since .*step-4 \(total steps .*: 4 -> 8\): the learning rate of step 5 would be 0\.0005 instead of 0; continuing on the new schedule \(--allow-schedule-change\)/,
  );
  t.match(JSON.parse(allowed.stdout), { steps: 8 });
  const rows = jsonl(join(dir, 'metrics.jsonl'));
  t.same(
    rows.map((r) => r.step),
    [1, 2, 3, 4, 5, 6, 7, 8],
  );
  t.ok(
    Math.abs((rows[4]!.lr as number) - learningRate({ kind: 'linear', lr: 1e-3, warmupSteps: 0, totalSteps: 8 }, 4)) < 1e-12,
    `step 5 on the new schedule (lr ${rows[4]!.lr})`,
  );
  t.same(steps(dir), ['step-7', 'step-8'], 'the limit holds across the resume');

  const same = await cli(['train', '--config', 'sft.yaml', '--resume', 'train.steps=8']);
  t.equal(same.code, 0, 'a resume on the schedule of its checkpoint (now 8 steps) is not refused');
});

t.test('pruning never removes the checkpoint just written, nor counts a damaged one', async (t) => {
  const dir = join(root, 'prune');
  const run = new RunFolder(dir);
  const make = (s: number, complete = true) => {
    const d = join(dir, 'checkpoints', `step-${s}`);
    mkdirSync(join(d, 'adapter'), { recursive: true });
    writeFileSync(join(d, 'adapter', 'adapter_model.safetensors'), '');
    if (complete) writeFileSync(join(d, 'optimizer.safetensors'), '');
    writeFileSync(join(d, 'state.json'), JSON.stringify({ step: s, epoch: 0, batchInEpoch: 0, seed: 0 }));
    return d;
  };
  for (const s of [1, 2, 3, 4]) make(s);
  make(5, false);
  t.same(
    run.pruneCheckpoints(2).map((d) => d.slice(d.lastIndexOf('step-'))),
    ['step-2', 'step-1'],
  );
  t.same(steps(dir), ['step-3', 'step-4', 'step-5'], 'the damaged step-5 is neither counted nor removed');
  t.same(
    run.pruneCheckpoints(1, join(dir, 'checkpoints', 'step-3')),
    [],
    'the one just written stays even when older (a resume from an older checkpoint)',
  );
  t.same(steps(dir), ['step-3', 'step-4', 'step-5']);
});

t.test('a step that trained nothing says why on the console', async (t) => {
  const r = await cli(['train', '--config', 'grpo.yaml']);
  t.equal(r.code, 0, `runs${r.code ? `\n${r.stderr.slice(-2000)}` : ''}`);
  t.match(
    r.stderr,
    /\[slm-train\] step 1: .* -- trained nothing: all 1 group\(s\) skipped \((zero_variance|all_failed): /,
    'the step line says every group was skipped, and why',
  );
  // A constant schedule (the default) does not depend on the step total: more steps resume freely.
  const more = await cli(['train', '--config', 'grpo.yaml', '--resume', 'train.steps=2']);
  t.equal(more.code, 0, `a constant schedule resumes onto more steps${more.code ? `\n${more.stderr.slice(-2000)}` : ''}`);
  t.match(more.stderr, /\[slm-train\] step 2: .* -- trained nothing: all 1 group\(s\) skipped/);
  t.equal(nothingTrained({ step: 3, episodes_trained: 4, loss: 0.1 }), '', 'a step that trained says nothing more');
  t.match(nothingTrained({ step: 3, loss: 1, skipped: true, skip_reason: 'non-finite gradient' }), /update skipped: non-finite gradient/);
});

t.test("--version prints package.json's version", async (t) => {
  const r = await cli(['--version']);
  t.equal(r.code, 0);
  t.equal(r.stdout.trim(), (JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')) as { version: string }).version);
});

t.test('--model given an adapter folder says to use --adapter', async (t) => {
  const adapter = join(root, 'runs', 'sft', 'adapter');
  const r = await cli(['generate', '--model', adapter, '--prompt', 'hi']);
  t.equal(r.code, 2);
  t.match(
    r.stderr,
    /error MODEL_CONFIG_INVALID: .*adapter has no config\.json: it is a PEFT adapter folder \(adapter_config\.json\), not a model\. Pass it with --adapter .*and the base model \(.*model, its base_model_name_or_path\) with --model/,
  );
});

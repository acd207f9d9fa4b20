// Publishing (issue 36, item 3): `slm-train export --merged` writes a Hugging Face folder whose
// logits are those of base + adapter, and `slm-train push` uploads a run's adapter with a generated
// model card to the stand-in hub (test/helpers/hub-server.ts), through @huggingface/hub's createRepo
// and commit (preupload, LFS batch + PUT, NDJSON commit). The pushed repository is then loaded back
// as `--adapter hf:OWNER/NAME` through the download path.
import { copyFileSync, existsSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import YAML from 'yaml';
import { Model } from '../lib/engine/model.js';
import { initModel } from '../lib/model/init.js';
import { syntheticCorpus } from '../lib/retrieval/synthetic.js';
import { modelCard, pushSource } from '../lib/hub/push.js';
import { runCliAsync } from './helpers/cli.js';
import { FakeHub } from './helpers/hub-server.js';
import { dataFile, fixture, repoRoot } from './helpers/shared.js';

const root = t.testdir();
const base = fixture('qwen3', 'tiny-qwen3-f32');
const lora = fixture('qwen3', 'tiny-lora');
const probe = [[1, 5, 9, 42, 7, 3, 100, 11]];
const maxDiff = (a: Float32Array, b: Float32Array) => a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i])), 0);

const hub = new FakeHub();
hub.writeToken = 'hf_writer';
t.before(() => hub.start());
t.teardown(() => hub.stop());
const hubEnv = () => ({ HF_ENDPOINT: hub.url, HF_TOKEN: 'hf_writer', HF_HUB_CACHE: join(root, 'hub-cache') });

t.test('export --merged: a Hugging Face folder whose logits equal base + adapter', async (t) => {
  const out = join(root, 'merged');
  const r = await runCliAsync(['export', '--merged', '--model', base, '--adapter', lora, '--out', out, '--json']);
  t.equal(r.code, 0, r.stderr);
  const res = JSON.parse(r.stdout);
  t.match(res, { out, dtype: 'float32', adapter: lora });
  t.same(res.files, ['config.json', 'model.safetensors']);
  const cfg = JSON.parse(readFileSync(join(out, 'config.json'), 'utf8'));
  const baseCfg = JSON.parse(readFileSync(join(base, 'config.json'), 'utf8'));
  t.match(cfg, { ...baseCfg, torch_dtype: 'float32' }, "the base's config, torch_dtype the written dtype");

  const withAdapter = await Model.load(base, { adapter: lora });
  t.teardown(() => withAdapter.dispose());
  const merged = await Model.load(out);
  t.teardown(() => merged.dispose());
  const bare = await Model.load(base);
  t.teardown(() => bare.dispose());
  t.notOk(merged.lora, 'the merged folder loads as a plain model');
  const want = (await withAdapter.logits(probe)).data;
  const d = maxDiff(want, (await merged.logits(probe)).data);
  t.ok(d < 1e-5, `merged vs base + adapter: max |diff| ${d.toExponential(2)} < 1e-5`);
  t.ok(maxDiff(want, (await bare.logits(probe)).data) > 1e-3, 'and the adapter does change the logits (the check has teeth)');

  // bfloat16 weights: the dtype is recorded and the logits stay close.
  const out16 = join(root, 'merged-bf16');
  const r16 = await runCliAsync(['export', '--merged', '--model', base, '--adapter', lora, '--out', out16, '--out-dtype', 'bfloat16']);
  t.equal(r16.code, 0, r16.stderr);
  t.match(r16.stdout, /merged .*tiny-lora into .*tiny-qwen3-f32: .*merged-bf16 \(config\.json, model\.safetensors; bfloat16\)/);
  t.equal(JSON.parse(readFileSync(join(out16, 'config.json'), 'utf8')).torch_dtype, 'bfloat16');
  const m16 = await Model.load(out16);
  t.teardown(() => m16.dispose());
  const d16 = maxDiff(want, (await m16.logits(probe)).data);
  t.ok(d16 < 0.1, `bf16 merged export: max |diff| ${d16.toExponential(2)}`);
});

t.test('export: the tokenizer and chat template of the base are copied; wrong uses are refused with a reason', async (t) => {
  const model = join(root, 'tok-model');
  initModel({ preset: 'tiny', out: model, seed: 3 });
  copyFileSync(fixture('qwen3-tokenizer', 'chat_template.jinja'), join(model, 'chat_template.jinja'));
  const adapter = join(root, 'tok-adapter');
  const m = await Model.load(model);
  m.attachLora({ r: 2, alpha: 4, dropout: 0, rslora: false, targets: ['q_proj', 'up_proj'] }, 5);
  await m.saveAdapter(adapter);
  m.dispose();
  const out = join(root, 'tok-merged');
  const r = await runCliAsync(['export', '--merged', '--model', model, '--adapter', adapter, '--out', out, '--json']);
  t.equal(r.code, 0, r.stderr);
  const have = readdirSync(model).filter((f) => f !== 'model.safetensors' && f !== 'config.json');
  t.ok(have.length > 0);
  for (const f of have) t.same(readFileSync(join(out, f)), readFileSync(join(model, f)), `${f} copied as is`);

  const noMerged = await runCliAsync(['export', '--model', base, '--adapter', lora, '--out', join(root, 'x')]);
  t.equal(noMerged.code, 2);
  t.match(noMerged.stderr, /error ARGUMENT_INVALID: export writes a merged model: pass --merged/);
  const noAdapter = await runCliAsync(['export', '--merged', '--model', base, '--out', join(root, 'x')]);
  t.match(noAdapter.stderr, /error ARGUMENT_INVALID: export --merged needs --adapter/);
  const notEmpty = await runCliAsync(['export', '--merged', '--model', base, '--adapter', lora, '--out', out]);
  t.equal(notEmpty.code, 2);
  t.match(notEmpty.stderr, /error ARGUMENT_INVALID: --out .*tok-merged is not empty.*--force/);
});

/** A real tiny SFT run through the CLI, with an evaluation at step 2 (its table goes into the card). */
async function tinyRun(): Promise<string> {
  const model = join(root, 'run-model');
  initModel({ preset: 'tiny', out: model, seed: 1 });
  copyFileSync(fixture('qwen3-tokenizer', 'chat_template.jinja'), join(model, 'chat_template.jinja'));
  const { pages, questions: qs } = syntheticCorpus({ pages: 20, seed: 2 });
  writeFileSync(join(root, 'corpus.jsonl'), pages.map((p) => JSON.stringify(p)).join('\n') + '\n');
  const questions = join(root, 'questions.jsonl');
  writeFileSync(
    questions,
    qs
      .slice(0, 5)
      .map((q) => JSON.stringify({ id: q.id, question: q.question, answer: q.answer }))
      .join('\n') + '\n',
  );
  const r = await runCliAsync(
    [
      'train',
      '--config',
      join(repoRoot, 'configs', 'code-sft.yaml'),
      `model.path=${model}`,
      'model.device=cpu',
      'model.dtype=float32',
      `data.sft=${dataFile('seed-sft', 'trajectories.jsonl')}`,
      `data.questions=${questions}`,
      `data.corpus=${join(root, 'corpus.jsonl')}`,
      `run.dir=${join(root, 'runs')}`,
      'run.name=tiny-sft',
      'train.steps=2',
      'train.batch_size=2',
      'train.eval_every=2',
      'eval.max_questions=2',
      'optim.warmup_steps=0',
      'lora.r=4',
      'lora.alpha=8',
      'protocol.max_context=4096',
      'protocol.max_new_tokens=8',
      'protocol.max_turns=1',
      'sandbox.workers=1',
      '--json',
    ],
    { cwd: root },
  );
  if (r.code !== 0) throw new Error(`tiny run failed: ${r.stderr.slice(-3000)}`);
  return JSON.parse(r.stdout).dir as string;
}

t.test(
  'push: a run folder to the hub: the adapter files arrive as they are, with a model card holding the config, the data and the eval table',
  async (t) => {
    const run = await tinyRun();
    t.ok(existsSync(join(run, 'evals', 'step-2', 'summary.json')), 'the run evaluated at step 2');

    // Without a token: refused before any upload.
    const before = hub.requests.length;
    const noToken = await runCliAsync(['push', run, '--repo', 'me/tiny-sft'], { env: { ...hubEnv(), HF_TOKEN: '' } });
    t.equal(noToken.code, 2);
    t.match(noToken.stderr, /error HUB_AUTH_REQUIRED: push: uploading to .* needs an access token with write access: set HF_TOKEN/);
    t.equal(hub.requests.length, before, 'no request without a token');
    const badToken = await runCliAsync(['push', run, '--repo', 'me/tiny-sft'], { env: { ...hubEnv(), HF_TOKEN: 'hf_reader' } });
    t.match(badToken.stderr, /error HUB_AUTH_REQUIRED: push: creating me\/tiny-sft: the hub at .* answered 403/);

    const r = await runCliAsync(['push', run, '--repo', 'me/tiny-sft', '--json'], { env: hubEnv() });
    t.equal(r.code, 0, r.stderr);
    const out = JSON.parse(r.stdout);
    t.match(out, { repo: 'me/tiny-sft', url: `${hub.url}/me/tiny-sft`, commit: /^[0-9a-f]{40}$/ });
    t.same(out.files, ['adapter_config.json', 'adapter_model.safetensors', 'training/config.yaml', 'training/metrics.jsonl', 'README.md']);
    const files = hub.files('model', 'me/tiny-sft')!;
    t.ok(files, 'the repository was created');
    for (const f of ['adapter_config.json', 'adapter_model.safetensors'])
      t.same(files[f], readFileSync(join(run, 'adapter', f)), `${f}: the same bytes`);
    t.same(files['training/config.yaml'], readFileSync(join(run, 'config.yaml')));
    t.ok(
      hub.requests.some((q) => q.method === 'PUT' && q.url.startsWith('/lfs-upload/')),
      'the weights went as an LFS object',
    );
    t.match(hub.commits.at(-1), { repo: 'me/tiny-sft', title: 'Upload adapter trained with slm-train' });

    const card = files['README.md'].toString('utf8');
    const front = /^---\n([\s\S]*?)\n---\n/.exec(card);
    t.ok(front, 'YAML front matter');
    t.match(YAML.parse(front![1]), { library_name: 'peft', tags: ['slm-train', 'lora', 'sft'] });
    t.match(
      card,
      /A LoRA adapter \(PEFT format: r=4, lora_alpha=8, target_modules .*\) for `.*run-model`, trained with .*stage `sft`, 2 steps/,
    );
    t.match(card, /## Data\n\n- `data\.questions`: `questions\.jsonl` \(5 rows\)\n/);
    t.match(card, /\n- `data\.corpus`: `corpus\.jsonl` \(20 rows\)\n/);
    const sftRows = readFileSync(dataFile('seed-sft', 'trajectories.jsonl'), 'utf8')
      .split('\n')
      .filter((l) => l.trim()).length;
    t.ok(card.includes(`\n- \`data.sft\`: \`trajectories.jsonl\` (${sftRows} rows)\n`), 'data.sft with its row count');
    // The eval table: the run's evaluation summary, its numbers as percentages.
    const summary = JSON.parse(readFileSync(join(run, 'evals', 'step-2', 'summary.json'), 'utf8'));
    t.match(card, /## Evaluation\n\n\| run \| split \| n \| accuracy % \|/);
    t.equal(summary.label, 'tiny-sft@step-2');
    t.ok(
      card.includes(
        `| ${summary.label} | ${summary.split} | ${summary.questions} | ${(100 * summary.accuracy).toFixed(1)} | ${summary.accuracy_by} | ${(100 * summary.em).toFixed(1)} | ${(100 * summary.f1).toFixed(1)} |`,
      ),
      'the eval row of step 2',
    );
    // The config: the run's resolved config.yaml verbatim, which parses back to the run's settings.
    const yaml = /## Training configuration\n\n.*\n\n```yaml\n([\s\S]*?)\n```/.exec(card);
    t.ok(yaml, 'a yaml block');
    t.equal(yaml![1] + '\n', readFileSync(join(run, 'config.yaml'), 'utf8'));
    t.match(YAML.parse(yaml![1]), { stage: 'sft', lora: { r: 4, alpha: 8 }, train: { steps: 2, eval_every: 2 } });

    // The pushed repository is a working adapter: loaded back from the hub by the download path, it
    // gives the logits the local adapter gives.
    const model = join(root, 'run-model');
    const local = await runCliAsync(['logits', '--model', model, '--adapter', join(run, 'adapter'), '--ids', '1,2,3', '--json']);
    const pulled = await runCliAsync(['logits', '--model', model, '--adapter', 'hf:me/tiny-sft', '--ids', '1,2,3', '--json'], {
      env: hubEnv(),
    });
    t.equal(pulled.code, 0, pulled.stderr);
    t.equal(pulled.stdout, local.stdout, 'hf:me/tiny-sft gives the same logits as the local adapter');

    // A second push to the same repository: createRepo's 409 is taken as "exists", a new commit lands.
    const again = await runCliAsync(
      ['push', join(run, 'checkpoints', 'step-2', 'adapter'), '--repo', 'me/tiny-sft', '--message', 'step 2 checkpoint'],
      { env: hubEnv() },
    );
    t.equal(again.code, 0, again.stderr);
    t.match(
      again.stdout,
      /^pushed to .*\/me\/tiny-sft \(commit [0-9a-f]{40}\): adapter_config\.json, adapter_model\.safetensors, training\/config\.yaml, training\/metrics\.jsonl, README\.md/,
    );
    t.match(hub.commits.at(-1), { title: 'step 2 checkpoint' });
    t.equal(hub.commits.length, 2);
  },
);

t.test(
  'push: an adapter folder alone gets a card without run details; --dry-run uploads nothing; bad paths and names are refused',
  async (t) => {
    t.same(pushSource(lora), { adapter: lora });
    const card = modelCard({ adapter: lora }, 'me/lora');
    t.match(card, /^---\nlibrary_name: peft\n/, 'no base_model: tiny-qwen3-f32 is not a hub id');
    t.match(card, /for `tiny-qwen3-f32`/);
    t.match(card, /Not recorded \(the adapter was pushed without its run folder\)/);
    t.match(card, /No evaluation was recorded/);
    t.notMatch(card, /## Training configuration/);
    const withBase = join(root, 'hub-base-lora');
    const { mkdirSync } = await import('node:fs');
    mkdirSync(withBase);
    writeFileSync(
      join(withBase, 'adapter_config.json'),
      readFileSync(join(lora, 'adapter_config.json'), 'utf8').replace('"tiny-qwen3-f32"', '"Qwen/Qwen3-0.6B"'),
    );
    t.match(
      modelCard({ adapter: withBase }, 'me/x'),
      /^---\nbase_model: Qwen\/Qwen3-0\.6B\n/,
      'a hub id as base_model_name_or_path becomes base_model',
    );

    const n = hub.requests.length;
    const dry = await runCliAsync(['push', lora, '--repo', 'me/dry', '--dry-run', '--card', join(root, 'card.md')], { env: hubEnv() });
    t.equal(dry.code, 0, dry.stderr);
    t.match(dry.stdout, /would upload to .*\/me\/dry: adapter_config\.json, adapter_model\.safetensors, README\.md/);
    t.equal(readFileSync(join(root, 'card.md'), 'utf8'), modelCard({ adapter: lora }, 'me/dry'), '--card writes the card');
    t.ok(dry.stdout.includes(modelCard({ adapter: lora }, 'me/dry')), 'and the dry run prints it');
    t.equal(hub.requests.length, n, 'a dry run makes no request');
    // A PPO adapter folder: its value head and separate critic are published beside the adapter.
    const ppo = join(root, 'hub-ppo-lora');
    mkdirSync(ppo);
    for (const f of ['adapter_config.json', 'adapter_model.safetensors']) writeFileSync(join(ppo, f), readFileSync(join(lora, f)));
    for (const f of ['value_head.safetensors', 'critic_adapter.safetensors']) writeFileSync(join(ppo, f), 'x');
    const dryPpo = await runCliAsync(['push', ppo, '--repo', 'me/ppo', '--dry-run'], { env: hubEnv() });
    t.match(
      dryPpo.stdout,
      /would upload to .*\/me\/ppo: adapter_config\.json, adapter_model\.safetensors, value_head\.safetensors, critic_adapter\.safetensors, README\.md/,
      'the value head and the separate critic go too',
    );

    const priv = await runCliAsync(['push', lora, '--repo', 'me/private-lora', '--private'], { env: hubEnv() });
    t.equal(priv.code, 0, priv.stderr);
    t.same(hub.created.at(-1), { name: 'me/private-lora', visibility: 'private' }, '--private creates the repository private');
    t.ok(hub.files('model', 'me/private-lora')?.['adapter_model.safetensors'], 'and the files arrive');

    const missing = await runCliAsync(['push', join(root, 'nope'), '--repo', 'me/x'], { env: hubEnv() });
    t.match(missing.stderr, /error FILE_NOT_FOUND: push: .*nope does not exist/);
    const notAdapter = await runCliAsync(['push', root, '--repo', 'me/x'], { env: hubEnv() });
    t.match(notAdapter.stderr, /error ADAPTER_NOT_FOUND: push: .* has no adapter_config\.json/);
    const badRepo = await runCliAsync(['push', lora, '--repo', 'just-a-name'], { env: hubEnv() });
    t.match(badRepo.stderr, /error ARGUMENT_INVALID: push: --repo must be OWNER\/NAME/);
  },
);

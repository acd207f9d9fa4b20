// Experiment tracking to MLflow (issue 36, item 2): a real MLflow tracking server (the `mlflow`
// package in the repository's .venv, scripts/setup-venv.sh) is started on loopback with a SQLite
// store; a tiny SFT run through the CLI with `log.report_to=[tensorboard,mlflow]` logs into it over
// the REST API; the test then reads the run back through the same REST API: its status, name, the
// resolved config as params, and a metric history per key (train/loss, eval/accuracy, ...) equal to
// metrics.jsonl. --resume continues the same MLflow run. Under CI=true a missing mlflow fails
// (helpers/shared.ts needs()); elsewhere the tests skip, saying why.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { copyFileSync, existsSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { freePort } from '../lib/distributed/launch.js';
import { initModel } from '../lib/model/init.js';
import { syntheticCorpus } from '../lib/retrieval/synthetic.js';
import { configParams, MlflowTracker } from '../lib/train/report/tracking.js';
import { loadConfig } from '../lib/config/load.js';
import { runCliAsync } from './helpers/cli.js';
import { dataFile, fixture, needs, repoRoot } from './helpers/shared.js';

const root = t.testdir();
const python = join(repoRoot, '.venv', 'bin', 'python');

function missingMlflow(): string | false {
  if (!existsSync(python)) return `no ${python}: run \`bash scripts/setup-venv.sh\` (it installs mlflow into .venv)`;
  const r = spawnSync(python, ['-c', 'import mlflow.server, mlflow; print(mlflow.__version__)'], { encoding: 'utf8', timeout: 120_000 });
  return r.status === 0
    ? false
    : `the mlflow package is not installed in .venv (${(r.stderr || '').trim().split('\n').at(-1)}): run \`bash scripts/setup-venv.sh\``;
}

let server: ChildProcess | undefined;
let uri = '';
let serverLog = '';

const skip = needs(missingMlflow(), t);

async function startServer(): Promise<void> {
  if (server) return;
  const port = await freePort();
  uri = `http://127.0.0.1:${port}`;
  server = spawn(
    python,
    [
      '-m',
      'mlflow',
      'server',
      '--host',
      '127.0.0.1',
      '--port',
      String(port),
      '--backend-store-uri',
      `sqlite:///${join(root, 'mlflow.db')}`,
      '--default-artifact-root',
      join(root, 'mlartifacts'),
      '--workers',
      '1',
    ],
    {
      cwd: root,
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, MLFLOW_TRACKING_URI: '' },
    },
  );
  server.stdout!.on('data', (c) => (serverLog += c));
  server.stderr!.on('data', (c) => (serverLog += c));
  const deadline = Date.now() + 180_000;
  while (Date.now() < deadline) {
    if (server.exitCode !== null) throw new Error(`mlflow server exited ${server.exitCode}: ${serverLog.slice(-2000)}`);
    try {
      if ((await fetch(`${uri}/health`, { signal: AbortSignal.timeout(2000) })).ok) return;
    } catch {
      /* not up yet */
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
  throw new Error(`mlflow server did not answer /health within 180 s: ${serverLog.slice(-2000)}`);
}

t.teardown(async () => {
  // The server runs uvicorn in child processes: end its whole process group (SIGKILL if SIGTERM has
  // not ended it within 10 s: its shutdown can hang on a worker).
  const s = server;
  if (!s?.pid || s.exitCode !== null) return;
  const group = (sig: NodeJS.Signals) => {
    try {
      process.kill(-s.pid!, sig);
    } catch {
      /* gone */
    }
  };
  const exited = new Promise<void>((r) => s.once('exit', () => r()));
  group('SIGTERM');
  const timer = setTimeout(() => group('SIGKILL'), 10_000);
  await exited;
  clearTimeout(timer);
  group('SIGKILL'); // any worker left behind
});

const api = async (path: string, body?: unknown) => {
  const r = await fetch(
    `${uri}/api/2.0/mlflow/${path}`,
    body ? { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) } : {},
  );
  if (!r.ok) throw new Error(`${path}: ${r.status} ${await r.text()}`);
  return (await r.json()) as Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any
};
const history = async (runId: string, key: string) =>
  ((await api(`metrics/get-history?run_id=${runId}&metric_key=${encodeURIComponent(key)}`)).metrics ?? []).map(
    (m: { step?: string; value?: number }) => [Number(m.step ?? 0), m.value ?? 0],
  ); // proto3 JSON leaves out zeros.sort((a: number[], b: number[]) => a[0] - b[0]);
const jsonl = (f: string) =>
  readFileSync(f, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l));

const model = join(root, 'model');
function setup() {
  initModel({ preset: 'tiny', out: model, seed: 1 });
  copyFileSync(fixture('qwen3-tokenizer', 'chat_template.jinja'), join(model, 'chat_template.jinja'));
  const { pages, questions } = syntheticCorpus({ pages: 20, seed: 2 });
  writeFileSync(join(root, 'corpus.jsonl'), pages.map((p) => JSON.stringify(p)).join('\n') + '\n');
  writeFileSync(
    join(root, 'questions.jsonl'),
    questions
      .slice(0, 5)
      .map((q) => JSON.stringify({ id: q.id, question: q.question, answer: q.answer }))
      .join('\n') + '\n',
  );
}

const trainArgs = (name: string, steps: number, extra: string[] = []) => [
  'train',
  '--config',
  join(repoRoot, 'configs', 'code-sft.yaml'),
  `model.path=${model}`,
  'model.device=cpu',
  'model.dtype=float32',
  `data.sft=${dataFile('seed-sft', 'trajectories.jsonl')}`,
  `data.questions=${join(root, 'questions.jsonl')}`,
  `data.corpus=${join(root, 'corpus.jsonl')}`,
  `run.dir=${join(root, 'runs')}`,
  `run.name=${name}`,
  `train.steps=${steps}`,
  'train.batch_size=2',
  'train.checkpoint_every=1',
  'optim.warmup_steps=0',
  'lora.r=4',
  'lora.alpha=8',
  'protocol.max_context=4096',
  'protocol.max_new_tokens=8',
  'protocol.max_turns=1',
  'sandbox.workers=1',
  'eval.max_questions=2',
  'log.report_to=[tensorboard, mlflow]',
  'log.mlflow_experiment=slm-train-test',
  ...extra,
  '--json',
];

t.test('configParams: the resolved config as section.key strings', async (t) => {
  const cfg = loadConfig(join(repoRoot, 'configs', 'code-sft.yaml'), [
    `model.path=${fixture('qwen3', 'tiny-qwen3-f32')}`,
    'model.device=cpu',
    'lora.r=4',
    'log.report_to=[mlflow]',
  ]);
  const p = configParams(cfg);
  t.equal(p['lora.r'], '4');
  t.equal(p.stage, 'sft');
  t.equal(p['lora.targets'], JSON.stringify(cfg.lora.targets), 'lists as JSON');
  t.equal(p['log.report_to'], '["mlflow"]');
  t.equal(p['run.name'], 'code-sft');
  t.ok(Object.values(p).every((v) => typeof v === 'string' && v.length <= 6000));
});

t.test('mlflow in report_to without a server named, or a server that is not there: refused before training', async (t) => {
  setup();
  const none = await runCliAsync(trainArgs('no-uri', 1), { cwd: root, env: { MLFLOW_TRACKING_URI: '' } });
  t.equal(none.code, 2);
  t.match(
    none.stderr,
    /error CONFIG_INVALID: log\.report_to has mlflow, but no tracking server is named: set log\.mlflow_tracking_uri \(or \$MLFLOW_TRACKING_URI\)/,
  );
  const port = await freePort();
  const down = await runCliAsync(trainArgs('down', 1, [`log.mlflow_tracking_uri=http://127.0.0.1:${port}`]), { cwd: root });
  t.equal(down.code, 2);
  t.match(
    down.stderr,
    new RegExp(
      `error TRACKING_FAILED: MLflow at http://127\\.0\\.0\\.1:${port}: GET experiments/get-by-name\\?experiment_name=slm-train-test: ECONNREFUSED \\(after 3 tries\\)`,
    ),
  );
  t.notOk(existsSync(join(root, 'runs', 'down', 'checkpoints', 'step-1')), 'nothing was trained');
  const file = await runCliAsync(trainArgs('file-uri', 1, ['log.mlflow_tracking_uri=file:///tmp/mlruns']), { cwd: root });
  t.match(file.stderr, /error CONFIG_INVALID: .*"file:\/\/\/tmp\/mlruns" is not an http\(s\) address of an MLflow tracking server/);
});

t.test(
  'a training run logs into a real MLflow tracking server: params, metric histories, status; --resume continues the same run',
  { skip },
  async (t) => {
    await startServer();

    // 2 steps with an evaluation at step 2, then --resume to 3 steps.
    const r = await runCliAsync(trainArgs('tracked', 2, ['train.eval_every=2', `log.mlflow_tracking_uri=${uri}`]), { cwd: root });
    t.equal(r.code, 0, r.stderr.slice(-3000));
    const dir = join(root, 'runs', 'tracked');
    t.match(r.stderr, /mlflow: logging to run [0-9a-f]{32} at http:\/\/127\.0\.0\.1:\d+ \(experiment \d+\)/);
    const tracking = JSON.parse(readFileSync(join(dir, 'tracking.json'), 'utf8'));
    t.match(tracking, { mlflow: { tracking_uri: uri, run_id: /^[0-9a-f]{32}$/ } });
    const runId = tracking.mlflow.run_id as string;

    const exp = (await api('experiments/get-by-name?experiment_name=slm-train-test')).experiment;
    t.equal(exp.experiment_id, tracking.mlflow.experiment_id, 'the experiment was created by name');
    const found = await api('runs/search', { experiment_ids: [exp.experiment_id] });
    t.equal(found.runs.length, 1, 'one MLflow run');
    const run = (await api(`runs/get?run_id=${runId}`)).run;
    t.match(run.info, { run_id: runId, run_name: 'tracked', status: 'FINISHED' });
    t.ok(Number(run.info.end_time) >= Number(run.info.start_time));
    const params = Object.fromEntries(run.data.params.map((p: { key: string; value: string }) => [p.key, p.value]));
    t.match(params, {
      stage: 'sft',
      'lora.r': '4',
      'lora.alpha': '8',
      'train.steps': '2',
      'train.eval_every': '2',
      'model.path': model,
      'log.report_to': '["tensorboard","mlflow"]',
    });
    const resolved = loadConfig(join(dir, 'config.yaml'));
    t.equal(
      Object.keys(params).length,
      Object.keys(configParams(resolved)).length,
      'every key of the resolved config is a param (more than one log-batch of 100)',
    );
    const tags = Object.fromEntries(run.data.tags.map((p: { key: string; value: string }) => [p.key, p.value]));
    t.match(tags, { 'mlflow.runName': 'tracked', 'mlflow.source.name': 'slm-train', 'slm-train.stage': 'sft', 'slm-train.run_dir': dir });

    // Metric histories: one point per step, the values of metrics.jsonl, grouped names.
    const rows = jsonl(join(dir, 'metrics.jsonl'));
    const steps = rows.filter((x) => x.kind !== 'eval');
    const evals = rows.filter((x) => x.kind === 'eval');
    t.equal(steps.length, 2);
    t.equal(evals.length, 1);
    t.same(
      await history(runId, 'train/loss'),
      steps.map((x) => [x.step, x.loss]),
      'train/loss: every step, the exact values',
    );
    t.same(
      await history(runId, 'train/lr'),
      steps.map((x) => [x.step, x.lr]),
    );
    t.same(await history(runId, 'eval/accuracy'), [[2, evals[0].eval_accuracy]], 'eval/accuracy at step 2');
    t.same(await history(runId, 'eval/f1'), [[2, evals[0].eval_f1]]);
    t.same(await history(runId, 'loss'), [], 'no flat (ungrouped) keys');
    const latest = Object.fromEntries(run.data.metrics.map((m: { key: string; value: number }) => [m.key, m.value]));
    t.ok(
      Object.keys(latest).every((k) => /^(train|eval)\//.test(k)),
      `every metric key grouped: ${Object.keys(latest).join(', ')}`,
    );
    t.equal(readdirSync(join(dir, 'tb')).length, 1, 'tensorboard was asked for too: its event file is there');

    // --resume: the same MLflow run is reopened (RUNNING, then FINISHED again), no second run. The run
    // had reached its last step, so nothing is re-logged.
    const again = await runCliAsync([...trainArgs('tracked', 2, ['train.eval_every=2', `log.mlflow_tracking_uri=${uri}`]), '--resume'], {
      cwd: root,
    });
    t.equal(again.code, 0, again.stderr.slice(-3000));
    t.match(again.stderr, new RegExp(`mlflow: continuing run ${runId} at `));
    t.equal((await api('runs/search', { experiment_ids: [exp.experiment_id] })).runs.length, 1, 'still one MLflow run');
    t.equal((await api(`runs/get?run_id=${runId}`)).run.info.status, 'FINISHED');
    t.same(
      await history(runId, 'train/loss'),
      steps.map((x) => [x.step, x.loss]),
      'the history as it was',
    );
  },
);

t.test('a failed run is marked FAILED in MLflow; metrics that cannot be sent are said once', { skip }, async (t) => {
  await startServer();
  const tracker = await MlflowTracker.open({
    uri,
    experiment: 'slm-train-test',
    runName: 'will-fail',
    params: { a: '1' },
    tags: {},
    log: () => {},
  });
  tracker.log(1, { 'train/loss': 0.5 }, Date.now());
  await tracker.finish('FAILED');
  const run = (await api(`runs/get?run_id=${tracker.runId}`)).run;
  t.match(run.info, { run_name: 'will-fail', status: 'FAILED' });
  t.same(await history(tracker.runId, 'train/loss'), [[1, 0.5]]);
  // Metrics that cannot be sent later are said once and do not stop anything.
  const lines: string[] = [];
  const t2 = await MlflowTracker.open({
    uri,
    experiment: null,
    runName: 'lost',
    params: {},
    tags: {},
    log: (l) => lines.push(l),
    attempts: 1,
  });
  t.equal(t2.experimentId, '0', "no experiment named: MLflow's Default");
  (t2 as unknown as { uri: string }).uri = 'http://127.0.0.1:9';
  t2.log(1, { 'train/loss': 1 }, Date.now());
  t2.log(2, { 'train/loss': 2 }, Date.now());
  await t2.finish('FINISHED');
  t.equal(lines.filter((l) => /metrics of step 1 not sent/.test(l)).length, 1, 'said once');
  t.ok(lines.some((l) => /mlflow: 2 metric values were not sent/.test(l)));
});

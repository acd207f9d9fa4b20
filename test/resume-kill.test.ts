// `slm-train train --resume` after the process was killed with SIGKILL in the middle of the run: the
// resumed run ends byte for byte where an uninterrupted one does (adapter, optimizer state, metrics);
// and when the newest checkpoint is damaged, it says so and resumes from the one before.
import t from 'tap';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, truncateSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { initModel } from '../lib/model/init.js';
import { runCliAsync } from './helpers/cli.js';
import { repoRoot } from './helpers/shared.js';

const dir = mkdtempSync(join(tmpdir(), 'slm-kill-'));
const children = new Set<ReturnType<typeof spawn>>();
t.teardown(() => {
  for (const p of children) p.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});
const model = join(dir, 'model');
initModel({ preset: 'tiny', out: model, seed: 4 });
const sft = join(dir, 'sft.jsonl');
const words = ['river', 'mountain', 'lake', 'forest', 'desert', 'island', 'valley', 'glacier', 'harbour', 'canyon'];
writeFileSync(
  sft,
  words
    .map((w, i) =>
      JSON.stringify({
        messages: [
          { role: 'user', content: `Name a ${w}.` },
          { role: 'assistant', content: `<answer>The ${w} of ${'north '.repeat(i % 4)}${i}</answer>` },
        ],
      }),
    )
    .join('\n') + '\n',
);
const runs = join(dir, 'runs');
const STEPS = 40;
// Dropout on: the resumed run must also restore the random stream of every step.
const args = (name: string) => [
  'train',
  '--config',
  join(repoRoot, 'configs', 'code-sft.yaml'),
  `model.path=${model}`,
  'model.device=cpu',
  'model.threads=1',
  `data.sft=${sft}`,
  `run.dir=${runs}`,
  `run.name=${name}`,
  `train.steps=${STEPS}`,
  'train.epochs=100',
  'train.batch_size=2',
  'train.checkpoint_every=1',
  'optim.warmup_steps=3',
  'optim.lr=0.002',
  'lora.r=4',
  'lora.alpha=8',
  'lora.dropout=0.1',
  '--json',
];
const metricRows = (name: string) => {
  const f = join(runs, name, 'metrics.jsonl');
  return existsSync(f) ? readFileSync(f, 'utf8').split('\n').filter(Boolean) : [];
};

/** Starts a run and kills it with SIGKILL once it has logged `after` steps; resolves with the exit signal. */
function killAfter(name: string, after: number): Promise<{ signal: NodeJS.Signals | null; rows: number }> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [join(repoRoot, 'bin', 'slm-train.js'), ...args(name)], { cwd: dir, stdio: 'ignore' });
    children.add(p);
    const timer = setInterval(() => {
      if (metricRows(name).length >= after) {
        clearInterval(timer);
        p.kill('SIGKILL');
      }
    }, 5);
    p.on('exit', (_code, signal) => {
      clearInterval(timer);
      children.delete(p);
      resolve({ signal, rows: metricRows(name).length });
    });
  });
}

// Metrics rows without their timings (wall-clock seconds differ between runs).
const comparable = (rows: string[]) =>
  rows.map((l) =>
    JSON.stringify(
      Object.fromEntries(Object.entries(JSON.parse(l)).filter(([k]) => !k.startsWith('time') && k !== 'tokens_per_s' && k !== 'wall_s')),
    ),
  );

t.test('SIGKILL mid-run, then --resume: the adapter, the optimizer and the metrics equal an uninterrupted run byte for byte', async (t) => {
  const full = await runCliAsync(args('full'), { cwd: dir });
  t.equal(full.code, 0, `the uninterrupted run exits 0${full.code ? full.stderr.slice(-2000) : ''}`);
  const fullFiles = (f: string) => readFileSync(join(runs, 'full', f));

  const killed = await killAfter('killed', 12);
  t.equal(killed.signal, 'SIGKILL', 'the run was killed');
  t.ok(killed.rows < STEPS, `it was killed mid-run (after ${killed.rows} of ${STEPS} steps)`);
  t.notOk(existsSync(join(runs, 'killed', 'adapter', 'adapter_model.safetensors')), 'no final adapter yet');
  const resumed = await runCliAsync([...args('killed'), '--resume'], { cwd: dir });
  t.equal(resumed.code, 0, `--resume exits 0${resumed.code ? resumed.stderr.slice(-2000) : ''}`);
  t.ok(
    readFileSync(join(runs, 'killed', 'adapter', 'adapter_model.safetensors')).equals(fullFiles('adapter/adapter_model.safetensors')),
    'the final adapter equals the uninterrupted run, byte for byte',
  );
  t.ok(
    readFileSync(join(runs, 'killed', 'checkpoints', `step-${STEPS}`, 'optimizer.safetensors')).equals(
      fullFiles(`checkpoints/step-${STEPS}/optimizer.safetensors`),
    ),
    'the optimizer state too',
  );
  t.same(comparable(metricRows('killed')), comparable(metricRows('full')), 'the metrics, one row per step, the same losses');
  // The adapter did train (lora_B starts at 0): a run that did nothing would also compare equal.
  t.notOk(
    fullFiles('adapter/adapter_model.safetensors').equals(
      readFileSync(join(runs, 'full', 'checkpoints', 'step-1', 'adapter', 'adapter_model.safetensors')),
    ),
    'the adapter moved after step 1',
  );
});

t.test(
  'a damaged newest checkpoint: --resume says so, continues from the one before, and still ends where the uninterrupted run does',
  async (t) => {
    const killed = await killAfter('damaged', 10);
    t.equal(killed.signal, 'SIGKILL');
    const steps = readdirSync(join(runs, 'damaged', 'checkpoints'))
      .map((d) => /^step-(\d+)$/.exec(d))
      .filter((m) => m)
      .map((m) => Number(m![1]))
      .sort((a, b) => b - a);
    t.ok(steps.length >= 2, `checkpoints ${steps.join(', ')}`);
    const [newest, previous] = steps;
    // A weights file cut short (a disk that filled up while saving on another system, a partial copy).
    const file = join(runs, 'damaged', 'checkpoints', `step-${newest}`, 'adapter', 'adapter_model.safetensors');
    truncateSync(file, statSync(file).size >> 1);
    const r = await runCliAsync([...args('damaged'), '--resume'], { cwd: dir });
    t.equal(r.code, 0, `--resume exits 0${r.code ? r.stderr.slice(-2000) : ''}`);
    t.match(
      r.stderr,
      new RegExp(`resume: checkpoint \\S+step-${newest} cannot be loaded \\(\\w+: .*\\); trying an older one`),
      'it says which checkpoint is damaged and why',
    );
    t.match(r.stderr, new RegExp(`resume: continuing from \\S+step-${previous} \\(step ${previous}\\) instead`));
    t.ok(
      readFileSync(join(runs, 'damaged', 'adapter', 'adapter_model.safetensors')).equals(
        readFileSync(join(runs, 'full', 'adapter', 'adapter_model.safetensors')),
      ),
      'the final adapter equals the uninterrupted run, byte for byte',
    );
    t.same(comparable(metricRows('damaged')), comparable(metricRows('full')), 'the metrics too');
  },
);

t.test('no checkpoint loads: CHECKPOINT_INVALID naming each one and why', async (t) => {
  const killed = await killAfter('broken', 3);
  t.equal(killed.signal, 'SIGKILL');
  for (const d of readdirSync(join(runs, 'broken', 'checkpoints')).filter((d) => /^step-\d+$/.test(d)))
    writeFileSync(join(runs, 'broken', 'checkpoints', d, 'optimizer.safetensors'), 'not a safetensors file');
  const r = await runCliAsync([...args('broken'), '--resume'], { cwd: dir });
  t.equal(r.code, 2);
  t.match(
    r.stderr,
    /error CHECKPOINT_INVALID: --resume: no checkpoint could be loaded: .*step-\d+: \w+: .*Start the run again without --resume/,
  );
});

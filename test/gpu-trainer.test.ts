// slm-train on a GPU machine without Node.js or network (issue 35, item 3), exercised on CPU:
// scripts/gpu-trainer.sh --stage packs this machine's node binary, the compiled CLI, the production
// node_modules, the nlohmann-json CMake package and the run's data; --run unpacks them, builds the addon
// with plain cmake against the .venv's pip PyTorch (not build/, which the other tests use), writes a
// random Qwen3 model (--shape tiny here; 4b on a GPU) and runs a GRPO step of configs/code-grpo.yaml
// with the carried node, then writes the timings as JSON. The staging folder and the build folder are
// cached in os.tmpdir() (SLM_TRAIN_CACHE), one per checkout and python, so only a checkout's first run
// compresses node and compiles the addon.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { haveShared, needs, repoRoot, sharedDir } from './helpers/shared.js';

const python = [process.env.SLM_TRAIN_HF_PYTHON, join(repoRoot, '.venv', 'bin', 'python')].find(
  (p) =>
    p &&
    existsSync(p) &&
    spawnSync(p, ['-c', 'import torch, safetensors; torch.utils.cmake_prefix_path'], { encoding: 'utf8' }).status === 0,
);
const has = (cmd: string, ...args: string[]) => spawnSync(cmd, args, { encoding: 'utf8' }).status === 0;
const missing = !python
  ? 'no python with a pip PyTorch and safetensors (.venv/bin/python: bash scripts/setup-venv.sh, or set SLM_TRAIN_HF_PYTHON)'
  : !has('cmake', '--version')
    ? 'no cmake'
    : !has('npm', '--version') || !has('xz', '--version')
      ? 'no npm or xz (the staging step needs both)'
      : !haveShared
        ? 'no ../shared/data'
        : false;
const skip = needs(missing, t);

interface Step {
  step: number;
  episodes: number;
  time_rollout_s: number;
  per_rollout_s: number;
  time_train_s: number;
  time_step_s: number;
  response_tokens_mean: number;
}
interface Report {
  device: string;
  shape: string;
  k: number;
  torch: string;
  node: string;
  addon_build_s: number;
  steps: Step[];
  model: { parameters: number; shape: string };
}

const script = join(repoRoot, 'scripts', 'gpu-trainer.sh');
const key = createHash('sha1').update(`${repoRoot}\0${python}`).digest('hex').slice(0, 12);
const cache = process.env.SLM_TRAIN_CACHE ?? join(tmpdir(), 'slm-train-cache');
const stageDir = join(cache, `gpu-trainer-stage-${key}`);
const build = join(cache, `gpu-trainer-build-${key}`);
const env = { ...process.env, PYTHON: python ?? 'python3', JOBS: process.env.JOBS ?? '2', SLM_SHARED_DIR: sharedDir };
const sh = (...args: string[]) => spawnSync('bash', [script, ...args], { encoding: 'utf8', env, maxBuffer: 1 << 26 });

t.test(
  'gpu-trainer.sh --stage, then --run --device cpu --shape tiny with the carried node',
  { skip: skip || false, timeout: 3_600_000 },
  (t) => {
    const st = sh('--stage', '--dir', stageDir);
    t.equal(st.status, 0, `--stage exits 0\n${st.stderr.slice(-4000)}`);
    for (const f of ['node.xz', 'bundle.tar.xz', 'MANIFEST.txt']) t.ok(existsSync(join(stageDir, f)), `staged ${f}`);
    const staged = ['node.xz', 'bundle.tar.xz'].reduce(
      (a, f) => a + (existsSync(join(stageDir, f)) ? statSync(join(stageDir, f)).size : 0),
      0,
    );
    t.ok(
      staged > 10 * 2 ** 20 && staged < 40 * 2 ** 20,
      `the staged files are ${(staged / 2 ** 20).toFixed(1)} MiB (under 40 MiB, carried within 64 MiB with the checkout)`,
    );
    t.match(st.stderr, /staged CLI loads: tokenizer ok .*hnswlib-node ok/, 'the staged CLI loads its native and data dependencies');
    if (st.status !== 0) return t.end();

    const out = mkdtempSync(join(tmpdir(), 'gpu-trainer-'));
    t.teardown(() => rmSync(out, { recursive: true, force: true }));
    const r = sh(
      '--run',
      '--device',
      'cpu',
      '--shape',
      'tiny',
      '--steps',
      '1',
      '--k',
      '4',
      '--max-new-tokens',
      '24',
      '--dir',
      stageDir,
      '--build',
      build,
      '--out',
      out,
    );
    const log = existsSync(join(out, 'gpu-trainer.log')) ? readFileSync(join(out, 'gpu-trainer.log'), 'utf8') : '';
    t.equal(r.status, 0, `--run exits 0\n${(log || r.stdout + r.stderr).slice(-8000)}`);
    t.match(log, /node v\d+\.\d+\.\d+ \(\S*\/run\/node\/bin\/node\)/, 'the carried node (unpacked from node.xz) runs the CLI');
    t.match(log, /addon loaded from .*\/run\/app\/build\/Release\/slm_train\.node/, 'the addon built here is the one loaded');
    t.match(log, /PyTorch 2\.\d+/, "built against the pip PyTorch's libtorch 2.x");
    t.ok(existsSync(join(out, 'doctor.txt')), 'doctor.txt written');
    const json = join(out, 'gpu-trainer.json');
    t.ok(existsSync(json), 'gpu-trainer.json written');
    if (!existsSync(json)) return t.end();
    const rep = JSON.parse(readFileSync(json, 'utf8')) as Report;
    t.equal(rep.device, 'cpu');
    t.equal(rep.shape, 'tiny');
    t.equal(rep.model.shape, 'tiny');
    t.match(rep.torch, /^2\./);
    t.equal(rep.steps.length, 1, 'one step logged');
    const s = rep.steps[0];
    t.equal(s.episodes, 4, 'K = 4 rollouts in the step');
    t.ok(
      s.time_rollout_s > 0 && Math.abs(s.per_rollout_s - s.time_rollout_s / 4) < 1e-9,
      `per-rollout latency = rollout time / K (${s.per_rollout_s.toFixed(3)} s)`,
    );
    t.ok(s.time_train_s > 0 && s.time_step_s >= s.time_train_s, `train-step time logged (${s.time_train_s.toFixed(2)} s)`);
    t.ok(s.response_tokens_mean > 0, 'the rollouts generated tokens');
    t.ok(existsSync(join(out, 'grpo-tiny-cpu', 'metrics.jsonl')), 'the run folder lands in --out');
    t.end();
  },
);

t.test('gpu-trainer.sh refuses what it must not do', { skip: skip || false }, async (t) => {
  const empty = mkdtempSync(join(tmpdir(), 'gpu-trainer-empty-'));
  t.teardown(() => rmSync(empty, { recursive: true, force: true }));
  const r = sh('--run', '--device', 'cpu', '--dir', empty);
  t.equal(r.status, 2, '--run without a staged folder: exit 2');
  t.match(r.stderr, /run --stage first/);
  t.equal(sh('--shape', 'huge', '--run').status, 2, 'an unknown shape: exit 2');
  if (existsSync(join(stageDir, 'bundle.tar.xz'))) {
    const out = mkdtempSync(join(tmpdir(), 'gpu-trainer-'));
    t.teardown(() => rmSync(out, { recursive: true, force: true }));
    const b = sh('--run', '--device', 'cpu', '--shape', 'tiny', '--dir', stageDir, '--build', join(repoRoot, 'build'), '--out', out);
    t.equal(b.status, 2, '--build build/: exit 2');
    t.match(
      readFileSync(join(out, 'gpu-trainer.log'), 'utf8'),
      /refusing --build .*build\/ holds the addon/,
      'says why, before configuring anything there',
    );
  }
});

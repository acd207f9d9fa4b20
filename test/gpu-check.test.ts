// The GPU check (issue 35, item 1) on CPU: scripts/gpu-check.sh builds slm_core and native/check/gpu_check.cc
// against the .venv's pip PyTorch (libtorch 2.x; the addon in build/ uses Debian's 1.13), with no
// Node.js in the check itself, and runs the forward parity checks on device cpu: the fixtures' golden
// logits in float32 and bfloat16, and transformers' forward on the same checkpoints. The build folder
// is cached in os.tmpdir() (SLM_TRAIN_CACHE), one per checkout and python, so only the first run of a
// checkout compiles everything.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fixture, haveShared, needs, repoRoot } from './helpers/shared.js';

const python = [process.env.SLM_TRAIN_HF_PYTHON, join(repoRoot, '.venv', 'bin', 'python')].find(
  (p) => p && existsSync(p) && spawnSync(p, ['-c', 'import torch; torch.utils.cmake_prefix_path'], { encoding: 'utf8' }).status === 0,
);
const cmake = spawnSync('cmake', ['--version'], { encoding: 'utf8' }).status === 0;
const missing = !python
  ? 'no python with a pip PyTorch (.venv/bin/python: bash scripts/setup-venv.sh, or set SLM_TRAIN_HF_PYTHON)'
  : !cmake
    ? 'no cmake'
    : !haveShared
      ? 'no ../shared/fixtures'
      : false;

interface CheckRow {
  check: string;
  model: string;
  dtype: string;
  case: string;
  positions: number;
  max_abs: number;
  tol: number;
  pass: boolean;
  note: string;
}
interface BenchRow {
  step_ms: number;
  generated: number;
  batch: number;
  new_tokens: number;
  ms: number;
  tokens: number;
  loss: number;
  tokens_per_s: number;
  waves: number;
  joined: number;
}
interface Bench {
  shape: string;
  layers: number;
  copy_gb_s: number;
  matmul_tflops: number;
  decode_b1: BenchRow;
  decode_batch: BenchRow;
  session_at_once: BenchRow;
  session_waves: BenchRow;
  prefill_long: BenchRow;
  lora_step: BenchRow;
}
interface Report {
  torch: string;
  device: string;
  failed: number;
  checks: CheckRow[];
  not_checked: string[];
  bench?: Bench;
  peer?: { decode_b1: BenchRow; decode_batch: BenchRow; lora_step?: BenchRow };
}

// The check's CPU runs use the AVX2 kernels on every machine (SLM_TRAIN_CPU_ISA caps the level): its
// greedy generation compares batched rows with solo ones and its bfloat16 rows use the tolerance
// measured on AVX2; the kernels themselves are tested at every level the CPU has elsewhere
// (test/helpers/isa.ts atEachLevel).
const checkEnv = { ...process.env, PYTHON: python, JOBS: process.env.JOBS ?? '2', SLM_TRAIN_CPU_ISA: 'avx2' };

// Outside CI a missing dependency skips, saying why; under CI=true it fails (helpers/shared.ts needs()).
const skip = needs(missing, t);

t.test('scripts/gpu-check.sh on cpu against the pip libtorch', { skip: skip || false, timeout: 3_600_000 }, (t) => {
  // One cached build per checkout and python: CMake refuses a build folder configured from another
  // source folder (two checkouts on one machine shared it, and the second one's check failed).
  const key = createHash('sha1').update(`${repoRoot}\0${python}`).digest('hex').slice(0, 12);
  const build = join(process.env.SLM_TRAIN_CACHE ?? join(tmpdir(), 'slm-train-cache'), `gpu-check-build-${key}`);
  const out = mkdtempSync(join(tmpdir(), 'gpu-check-'));
  t.teardown(() => rmSync(out, { recursive: true, force: true }));
  const json = join(out, 'report.json');
  const r = spawnSync(
    'bash',
    [
      join(repoRoot, 'scripts', 'gpu-check.sh'),
      '--device',
      'cpu',
      '--build',
      build,
      '--fixtures',
      fixture(),
      '--bench',
      'tiny',
      '--json',
      json,
    ],
    {
      encoding: 'utf8',
      env: checkEnv,
      maxBuffer: 1 << 26,
    },
  );
  t.equal(r.status, 0, `gpu-check exits 0\n${r.stdout.slice(-6000)}\n${r.stderr.slice(-6000)}`);
  t.match(r.stdout, /checks, 0 failed/, 'the summary line says no check failed');
  t.ok(existsSync(json), 'the JSON report was written');
  if (!existsSync(json)) {
    t.end();
    return;
  }
  const rep = JSON.parse(readFileSync(json, 'utf8')) as Report;
  t.match(rep.torch, /^2\./, 'built against libtorch 2.x (the .venv PyTorch), not Debian 1.13');
  t.equal(rep.failed, 0);
  const golden = rep.checks.filter((c) => c.check === 'golden');
  for (const model of ['tiny-qwen3-f32', 'tiny-qwen3-bf16-sharded', 'tiny-qwen3-f32+tiny-lora'])
    for (const dtype of ['float32', 'bfloat16'])
      t.equal(
        golden.filter((c) => c.model === model && c.dtype === dtype && c.pass && c.positions > 0).length,
        4,
        `${model} ${dtype}: the 4 golden cases pass`,
      );
  t.ok(
    golden.filter((c) => c.dtype === 'float32').every((c) => c.max_abs <= 1e-4),
    'float32 within 1e-4 of the float64 reference',
  );
  const hasHf = spawnSync(python!, ['-c', 'import transformers'], { encoding: 'utf8' }).status === 0;
  const hf = rep.checks.filter((c) => c.check === 'transformers');
  if (hasHf) {
    t.ok(hf.length >= 6 && hf.every((c) => c.pass), "transformers' forward compared and equal within tolerance");
    // Qwen2 (biases, untied head) and Llama (llama3 RoPE scaling, transformers 5's rope_parameters):
    // checkpoints transformers wrote, 2 rows x 2 dtypes each.
    for (const m of ['tiny-qwen2', 'tiny-llama']) {
      const rows = hf.filter((c) => c.model === m);
      t.equal(rows.length, 4, `${m}: 2 rows in float32 and bfloat16 against transformers`);
      t.ok(
        rows.every((c) => c.pass && c.positions > 0),
        `${m}: every row within tolerance`,
      );
      t.ok(
        rows.filter((c) => c.dtype === 'float32').every((c) => c.max_abs <= 1e-4),
        `${m}: float32 within 1e-4`,
      );
    }
  } else
    t.ok(
      rep.not_checked.some((s) => /transformers/.test(s)),
      'the report says transformers was not compared',
    );
  // The LoRA step against PEFT + torch (peft_step.py on the fixture and its adapter).
  const hasPeft = spawnSync(python!, ['-c', 'import peft'], { encoding: 'utf8' }).status === 0;
  const step = rep.checks.filter((c) => c.check === 'lora-step');
  if (hasPeft) {
    t.same(
      step.map((c) => c.case),
      ['SFT loss', 'adapter gradients', 'after one AdamW step'],
      'the LoRA step: loss, gradients, one AdamW step',
    );
    t.ok(
      step.every((c) => c.pass && c.positions > 0),
      'each within its tolerance of PEFT + torch',
    );
    t.ok(
      step[1].max_abs <= step[1].tol && step[1].tol > 0,
      `adapter gradients within ${step[1].tol.toExponential(1)} (max |diff| ${step[1].max_abs.toExponential(2)})`,
    );
  } else
    t.ok(
      rep.not_checked.some((s) => /PEFT/.test(s)),
      'the report says the PEFT step was not compared',
    );
  // Greedy generation: on cpu, batched rows against the same rows generated alone.
  const gen = rep.checks.filter((c) => c.check === 'generate');
  t.ok(
    gen.length === 1 && gen[0].pass && gen[0].positions >= 60,
    `greedy generation: batched rows equal solo rows (${gen[0]?.positions} tokens)`,
  );
  // Continuous batching (the serve path): rows joining a running decode get the tokens they got alone.
  const cont = rep.checks.filter((c) => c.check === 'continuous');
  t.ok(
    cont.length === 1 && cont[0].pass && cont[0].positions === gen[0]?.positions,
    `continuous batching: rows that joined a running decode equal solo rows (${cont[0]?.positions} tokens${cont[0]?.note ? `; ${cont[0].note}` : ''})`,
  );
  // The benchmark (--bench tiny reaches the program: the tiny shape's 4 layers) and its peer.
  const b = rep.bench;
  t.ok(b, 'the benchmark ran');
  if (b) {
    t.equal(b.shape, 'tiny', 'the shape asked for');
    t.equal(b.layers, 4, "the tiny shape's 4 layers");
    for (const k of ['decode_b1', 'decode_batch'] as const)
      t.ok(
        b[k].step_ms > 0 && b[k].generated === b[k].batch * b[k].new_tokens,
        `${k}: every row generated new_tokens tokens (${b[k].generated})`,
      );
    t.equal(b.decode_batch.batch, 8, 'the decode batch is K x questions = 4 x 2');
    for (const k of ['session_at_once', 'session_waves'] as const)
      t.ok(
        b[k].generated === b.decode_batch.batch * b.decode_batch.new_tokens && b[k].tokens_per_s > 0,
        `${k}: the session generated every row's tokens (${b[k].generated})`,
      );
    t.ok(
      b.session_waves.waves > 1 && b.session_waves.joined > 0,
      `rows arriving in waves joined a running decode (${b.session_waves.joined})`,
    );
    t.ok(b.prefill_long.ms > 0 && b.prefill_long.tokens === 256, 'prefill timed at the long length');
    t.ok(Number.isFinite(b.lora_step.loss) && b.lora_step.loss > 0 && b.lora_step.ms > 0, `the LoRA step ran (loss ${b.lora_step.loss})`);
    t.ok(b.copy_gb_s > 0 && b.matmul_tflops > 0, 'the limits were measured in the same run');
  }
  const peer = rep.peer;
  if (hasHf)
    t.ok(
      // the same shape as gpu_check's own rows above: batch and new tokens per row, every row's tokens
      peer &&
        peer.decode_b1.batch === 1 &&
        peer.decode_b1.new_tokens === b?.decode_b1.new_tokens &&
        peer.decode_b1.generated === peer.decode_b1.new_tokens &&
        peer.decode_batch.batch === b?.decode_batch.batch &&
        peer.decode_batch.new_tokens === b?.decode_batch.new_tokens &&
        peer.decode_batch.generated === peer.decode_batch.batch * peer.decode_batch.new_tokens &&
        Number.isFinite(peer.decode_b1.step_ms) &&
        (!hasPeft || (peer.lora_step?.ms ?? 0) > 0),
      "transformers' peer ran on the same shape (every row's tokens generated)",
    );
  t.match(r.stdout, /benchmark: tiny model/, 'the benchmark table is printed');
  t.end();
});

// Item 2 of issue 35: the same program compiles against Debian's libtorch 1.13 (C++17; the addon's
// libtorch) as well as against pip's 2.x (above), and its checks pass there: golden parity, the LoRA
// step against PEFT (references from the .venv's python), generation, the tiny benchmark (no peer).
const debianTorch = existsSync('/usr/lib/x86_64-linux-gnu/cmake/Torch/TorchConfig.cmake');
t.test(
  "scripts/gpu-check.sh on cpu against Debian's libtorch 1.13",
  { skip: skip || (!debianTorch && 'no Debian libtorch (/usr/lib/x86_64-linux-gnu/cmake/Torch)') || false, timeout: 3_600_000 },
  (t) => {
    const key = createHash('sha1').update(`${repoRoot}\0debian`).digest('hex').slice(0, 12);
    const build = join(process.env.SLM_TRAIN_CACHE ?? join(tmpdir(), 'slm-train-cache'), `gpu-check-build-${key}`);
    const out = mkdtempSync(join(tmpdir(), 'gpu-check-deb-'));
    t.teardown(() => rmSync(out, { recursive: true, force: true }));
    const json = join(out, 'report.json');
    const args = [
      '--libtorch',
      '/usr',
      '--device',
      'cpu',
      '--build',
      build,
      '--fixtures',
      fixture(),
      '--no-transformers',
      '--bench',
      'tiny',
      '--no-peer',
      '--json',
      json,
    ];
    const r = spawnSync('bash', [join(repoRoot, 'scripts', 'gpu-check.sh'), ...args], {
      encoding: 'utf8',
      env: checkEnv,
      maxBuffer: 1 << 26,
    });
    t.equal(r.status, 0, `gpu-check exits 0\n${r.stdout.slice(-6000)}\n${r.stderr.slice(-6000)}`);
    if (!existsSync(json)) {
      t.fail('no JSON report');
      t.end();
      return;
    }
    const rep = JSON.parse(readFileSync(json, 'utf8')) as Report;
    t.match(rep.torch, /^1\.13\./, "built against Debian's libtorch 1.13");
    t.equal(rep.failed, 0, 'no check failed');
    t.equal(rep.checks.filter((c) => c.check === 'golden' && c.pass).length, 24, 'the 24 golden cases pass (3 checkpoints x 2 dtypes x 4)');
    const hasPeft = spawnSync(python!, ['-c', 'import peft'], { encoding: 'utf8' }).status === 0;
    if (hasPeft) t.equal(rep.checks.filter((c) => c.check === 'lora-step' && c.pass).length, 3, 'the LoRA step against PEFT passes');
    t.ok(rep.bench && rep.bench.lora_step.ms > 0 && rep.bench.decode_batch.generated === 8 * 32, 'the tiny benchmark ran');
    t.end();
  },
);

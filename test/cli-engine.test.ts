// The engine's commands as a user runs them: exact spellings of DESIGN §4, JSON shapes, exit codes,
// and errors without stack traces.
import t from 'tap';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { runCli } from './helpers/cli.js';
import { fixture } from './helpers/shared.js';
import { readGolden } from './helpers/golden.js';

const golden = readGolden().models['tiny-qwen3-f32'];
const tiny = fixture('qwen3', 'tiny-qwen3-f32');

t.test('logits --json prints one row of vocab-size float32 logits per position, matching the reference', async (t) => {
  const c = golden.cases.find((x) => x.name === 'seq17')!;
  const r = runCli(['logits', '--model', tiny, '--ids', c.input_ids[0].join(','), '--json']);
  t.equal(r.code, 0, r.stderr);
  const out = JSON.parse(r.stdout) as { logits: number[][] };
  t.equal(out.logits.length, 17);
  t.equal(out.logits[0].length, 512);
  let d = 0;
  out.logits.forEach((row, i) => row.forEach((x, v) => (d = Math.max(d, Math.abs(x - c.logits[0][i]![v])))));
  t.ok(d < 1e-4, `max |diff| ${d}`);
});

t.test('logits and generate with --adapter reproduce the LoRA reference', async (t) => {
  const g = readGolden().models['tiny-qwen3-f32+tiny-lora'];
  const c = g.cases.find((x) => x.name === 'seq17')!;
  const r = runCli(['logits', '--model', tiny, '--adapter', fixture('qwen3', 'tiny-lora'), '--ids', c.input_ids[0].join(','), '--json']);
  t.equal(r.code, 0, r.stderr);
  const out = JSON.parse(r.stdout) as { logits: number[][] };
  let d = 0;
  out.logits.forEach((row, i) => row.forEach((x, v) => (d = Math.max(d, Math.abs(x - c.logits[0][i]![v])))));
  t.ok(d < 1e-4, `max |diff| ${d}`);
  const gen = runCli([
    'generate',
    '--model',
    tiny,
    '--adapter',
    fixture('qwen3', 'tiny-lora'),
    '--ids',
    g.greedy.prompt.join(','),
    '--max-new-tokens',
    String(g.greedy.steps),
    '--greedy',
    '--json',
  ]);
  t.equal(gen.code, 0, gen.stderr);
  t.same(JSON.parse(gen.stdout).ids, g.greedy.tokens);
});

t.test('generate --ids --greedy --json reproduces the reference greedy decode', async (t) => {
  const r = runCli([
    'generate',
    '--model',
    tiny,
    '--ids',
    golden.greedy.prompt.join(','),
    '--max-new-tokens',
    String(golden.greedy.steps),
    '--greedy',
    '--json',
  ]);
  t.equal(r.code, 0, r.stderr);
  const out = JSON.parse(r.stdout);
  t.same(out.ids, golden.greedy.tokens);
  t.equal(out.logprobs.length, golden.greedy.tokens.length);
  t.equal(out.finish_reason, 'length');
});

t.test('init-model writes a loadable HF folder; generate --prompt goes through tokenizer and chat template', async (t) => {
  const dir = join(t.testdir(), 'tiny');
  const r = runCli(['init-model', '--preset', 'tiny', '--out', dir]);
  t.equal(r.code, 0, r.stderr);
  t.ok(existsSync(join(dir, 'model.safetensors')));
  const cfg = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8'));
  t.equal(cfg.model_type, 'qwen3');
  t.equal(cfg.vocab_size, 151936);
  const g = runCli(['generate', '--model', dir, '--prompt', 'Who founded the city?', '--max-new-tokens', '5', '--json', '--seed', '3']);
  t.equal(g.code, 0, g.stderr);
  const out = JSON.parse(g.stdout);
  t.equal(out.ids.length, 5);
  t.type(out.text, 'string');
});

t.test('init-model --model-type qwen2 | llama writes that architecture, and the engine runs it', async (t) => {
  for (const [type, vocab, tensor] of [
    ['qwen2', 151936, 'model.layers.0.self_attn.q_proj.bias'],
    ['llama', 128256, 'model.layers.0.self_attn.q_proj.weight'],
  ] as const) {
    const dir = join(t.testdir(), type);
    const r = runCli(['init-model', '--preset', 'tiny', '--model-type', type, '--out', dir]);
    t.equal(r.code, 0, r.stderr);
    t.match(r.stdout, new RegExp(`tiny ${type} model`));
    const cfg = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8'));
    t.equal(cfg.model_type, type);
    t.equal(cfg.vocab_size, vocab);
    if (type === 'llama') t.match(cfg.rope_scaling, { rope_type: 'llama3', factor: 32 });
    const { readSafetensorsHeader } = await import('../lib/model/safetensors.js');
    const names = Object.keys(readSafetensorsHeader(join(dir, 'model.safetensors')));
    t.ok(names.includes(tensor), `has ${tensor}`);
    t.notOk(
      names.some((n) => n.includes('q_norm')),
      'no q/k norms outside Qwen3',
    );
    const l = runCli(['logits', '--model', dir, '--ids', '1,2,3', '--json']);
    t.equal(l.code, 0, l.stderr);
    t.equal(JSON.parse(l.stdout).logits.length, 3);
  }
  const bad = runCli(['init-model', '--preset', 'tiny', '--model-type', 'gpt2', '--out', join(t.testdir(), 'x')]);
  t.not(bad.code, 0);
});

t.test('doctor reports libtorch, BLAS with a measured rate, threads and python3', async (t) => {
  const r = runCli(['doctor', '--json']);
  t.equal(r.code, 0, r.stderr);
  const d = JSON.parse(r.stdout);
  t.match(d.libtorch.version, /^\d+\.\d+/);
  t.ok(d.blas.matmulF32Gflops > 0);
  t.ok(d.blas.copyGBps > 0);
  t.ok(d.blas.readGBps > 0, 'the read bandwidth reaches the report');
  t.ok(d.threads.engine >= 1);
  t.match(d.python.executable, /python/);
  t.match(d.sandbox.level, /^(bwrap|unshare|rlimits-only)$/);
  t.type(d.sandbox.network, 'boolean');
});

t.test("doctor's BLAS advice: install OpenBLAS, set the core type, or measure again on an idle machine", async (t) => {
  const { blasAdvice } = await import('../lib/doctor.js');
  const idle = { loadAverage: 0.2, cores: 2 };
  t.match(
    blasAdvice({ library: 'reference BLAS (libblas.so.3)', perThreadGflops: 3, ...idle }),
    /reference BLAS.*apt-get install libopenblas0-openmp/,
  );
  t.match(
    blasAdvice({ library: 'reference BLAS (libblas.so.3)', perThreadGflops: 3, loadAverage: 4, cores: 2 }),
    /apt-get install libopenblas0-openmp/,
    'the reference BLAS is slow whatever the load',
  );
  t.match(blasAdvice({ library: 'OpenBLAS (libopenblasp-r0.3.21.so)', perThreadGflops: 10, ...idle }), /OPENBLAS_CORETYPE=SKYLAKEX/);
  const busy = blasAdvice({ library: 'OpenBLAS (libopenblasp-r0.3.21.so)', perThreadGflops: 10, loadAverage: 3.1, cores: 2 });
  t.match(busy, /load average is 3\.1 on 2 cores.*idle machine/);
  t.notMatch(busy, /apt-get install|CORETYPE/, 'no wrong fix when the cores are busy');
  t.equal(blasAdvice({ library: 'OpenBLAS (libopenblasp-r0.3.21.so)', perThreadGflops: 60, ...idle }), null);
  t.match(blasAdvice({ library: 'unknown', perThreadGflops: 5, ...idle }), /reference-BLAS speed/);
  t.equal(blasAdvice({ library: 'MKL', perThreadGflops: 50, ...idle }), null);
  const { bf16Advice } = await import('../lib/doctor.js');
  t.match(
    bf16Advice({ cuda: false, f32Gflops: 65.4, bf16Gflops: 3.7 }),
    /bfloat16 matmul runs at 3\.7 GFLOP\/s here, 18x slower than float32.*model\.dtype: float32/,
  );
  t.equal(bf16Advice({ cuda: false, f32Gflops: 153, bf16Gflops: 323 }), null, 'a CPU with a fast bf16 path gets no advice');
  t.equal(bf16Advice({ cuda: false, f32Gflops: 0, bf16Gflops: 0 }), null, 'nothing measured, nothing said');
});

t.test('bad input: clear coded errors, exit code 2, no stack trace', async (t) => {
  const cases: Array<[string[], string]> = [
    [['logits', '--model', '/nope', '--ids', '1', '--json'], 'MODEL_NOT_FOUND'],
    [['logits', '--model', tiny, '--ids', '1,x', '--json'], 'ARGUMENT_INVALID'],
    [['logits', '--model', tiny, '--ids', '1,600', '--json'], 'TOKEN_OUT_OF_RANGE'],
    [['generate', '--model', tiny, '--ids', '1', '--adapter', '/tmp/nonexistent-adapter'], 'ADAPTER_NOT_FOUND'],
    [['generate', '--model', tiny], 'ARGUMENT_INVALID'],
    [['init-model', '--preset', 'huge', '--out', '/tmp/x'], 'ARGUMENT_INVALID'],
    [['frobnicate'], 'ARGUMENT_INVALID'],
  ];
  for (const [args, code] of cases) {
    const r = runCli(args);
    t.equal(r.code, 2, `${args.join(' ')}: exit 2`);
    t.match(r.stderr, new RegExp(`error ${code}:`), `${args.join(' ')}: ${r.stderr.trim().split('\n')[0]}`);
    t.notMatch(r.stderr, /\n\s+at /, 'no stack trace');
  }
});

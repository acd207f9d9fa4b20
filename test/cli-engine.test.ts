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
  const gen = runCli(['generate', '--model', tiny, '--adapter', fixture('qwen3', 'tiny-lora'), '--ids', g.greedy.prompt.join(','), '--max-new-tokens', String(g.greedy.steps), '--greedy', '--json']);
  t.equal(gen.code, 0, gen.stderr);
  t.same(JSON.parse(gen.stdout).ids, g.greedy.tokens);
});

t.test('generate --ids --greedy --json reproduces the reference greedy decode', async (t) => {
  const r = runCli(['generate', '--model', tiny, '--ids', golden.greedy.prompt.join(','), '--max-new-tokens', String(golden.greedy.steps), '--greedy', '--json']);
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

t.test('doctor reports libtorch, BLAS with a measured rate, threads and python3', async (t) => {
  const r = runCli(['doctor', '--json']);
  t.equal(r.code, 0, r.stderr);
  const d = JSON.parse(r.stdout);
  t.match(d.libtorch.version, /^\d+\.\d+/);
  t.ok(d.blas.matmulF32Gflops > 0);
  t.ok(d.blas.copyGBps > 0);
  t.ok(d.threads.engine >= 1);
  t.match(d.python.executable, /python/);
  t.match(d.sandbox.level, /^(bwrap|unshare|rlimits-only)$/);
  t.type(d.sandbox.network, 'boolean');
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

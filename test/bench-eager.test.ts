// bench/eager_decode.py, the eager PyTorch baseline `bench engine` measures beside its decode rows:
// on a tiny random Qwen3 its greedy tokens equal the engine's (so the baseline decodes the same model
// the same way: causal prefill, q/k norms, RoPE, grouped-query attention over a growing KV cache), its
// sampling mode reports its timings, and bad input fails with exit code 2 saying what was expected.
import { spawnSync } from 'node:child_process';
import { chmodSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { Model } from '../lib/engine/model.js';
import { initModel } from '../lib/model/init.js';
import { needs, repoRoot } from './helpers/shared.js';

const PY = '/usr/bin/python3';
const haveTorch = spawnSync(PY, ['-c', 'import torch'], { encoding: 'utf8' }).status === 0;
const skip = needs(haveTorch ? false : `${PY} has no torch (apt-get install python3-torch)`, t);
const script = join(repoRoot, 'bench', 'eager_decode.py');

function eager(args: string[]) {
  return spawnSync(PY, [script, ...args], { encoding: 'utf8', timeout: 300_000 });
}

t.test('greedy tokens of the eager baseline equal Model.generate greedy tokens', { skip }, async (t) => {
  const dir = t.testdir();
  // Larger weights than HF's 0.02 make the tiny model's logits depend on attention and the MLP (with
  // 0.02 the residual stream is the last token's embedding and a wrong RoPE or mask goes unseen).
  initModel({ preset: 'tiny', out: dir, seed: 3, embedStd: 0.5, overrides: { initializer_range: 0.3 } });
  const prompts = [0, 1, 2].map((b) => Array.from({ length: 12 }, (_, i) => (((b * 131 + i) * 7919) % 100000) + 100));
  const steps = 5;
  const r = eager(['--model', dir, '--prompts', JSON.stringify(prompts), '--steps', String(steps), '--threads', '1', '--greedy']);
  t.equal(r.status, 0, r.stderr);
  const out = JSON.parse(r.stdout.trim());
  t.match(out, { batch: 3, steps, dtype: 'float32', prompt_len: 12, greedy: true, threads: 1 });
  t.equal(out.tokens.length, 3);

  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  const g = await m.generate({ prompts: prompts.map((p) => Int32Array.from(p)), maxNewTokens: steps + 1, greedy: true });
  for (let b = 0; b < 3; b++) {
    const mine = Array.from(g.tokens[b]);
    const theirs: number[] = out.tokens[b];
    t.equal(theirs.length, steps + 1, 'the prefill token and one per decode step');
    // Compare up to and including the first near tie (float32 rounding may pick either of a tie;
    // after a differing pick the continuations differ legitimately).
    let n = 0;
    while (n < theirs.length) {
      n++;
      if (out.margins[b][n - 1] < 1e-3) break;
    }
    t.ok(n >= 2, `row ${b}: at least the prefill token and one decode step are compared (margins ${out.margins[b]})`);
    t.same(mine.slice(0, n), theirs.slice(0, n), `row ${b}: the first ${n} greedy tokens`);
  }
});

t.test('sampling mode reports prefill and per-step times for the bench ids', { skip }, async (t) => {
  const dir = t.testdir();
  initModel({ preset: 'tiny', out: dir, seed: 0 });
  const r = eager(['--model', dir, '--batch', '2', '--steps', '3', '--threads', '1', '--prompt-len', '8', '--print-tokens']);
  t.equal(r.status, 0, r.stderr);
  const out = JSON.parse(r.stdout.trim());
  t.match(out, { torch: String, threads: 1, batch: 2, steps: 3, prompt_len: 8, greedy: false });
  t.ok(out.step_ms > 0 && out.prefill_ms > 0 && out.tokens_per_s > 0, `step ${out.step_ms} ms, prefill ${out.prefill_ms} ms`);
  t.equal(out.tokens.length, 2);
  for (const row of out.tokens) {
    t.equal(row.length, 4);
    for (const id of row) t.ok(Number.isInteger(id) && id >= 0 && id < 151936);
  }
  t.notOk('margins' in out, 'margins only in greedy mode');
});

t.test('bad input exits 2 saying what was expected', { skip }, async (t) => {
  const dir = t.testdir();
  let r = eager(['--model', dir]);
  t.equal(r.status, 2);
  t.match(r.stderr, /--model: expected a directory with config.json and model.safetensors/);
  r = eager(['--model', dir, '--dtype', 'float16']);
  t.equal(r.status, 2);
  t.match(r.stderr, /--dtype: expected float32 or bfloat16, found 'float16'/);
  r = eager(['--model', dir, '--steps', '0']);
  t.equal(r.status, 2);
  t.match(r.stderr, /must be >= 1/);
});

t.test('bench engine runs the baseline through runEagerDecode, or says why it skipped it', async (t) => {
  const { runEagerDecode } = await import('../bench/engine.js');
  const dir = t.testdir({ 'no-torch': '#!/bin/sh\nexit 1\n' });
  chmodSync(join(dir, 'no-torch'), 0o755);
  const model = join(dir, 'tiny');
  initModel({ preset: 'tiny', out: model, seed: 0 });
  const o = { batch: 2, steps: 2, threads: 1, timeoutS: 300 };
  t.same(runEagerDecode(model, { ...o, python: join(dir, 'no-python3') }), {
    skipped: `${join(dir, 'no-python3')} not found (apt-get install python3-torch)`,
  });
  t.same(runEagerDecode(model, { ...o, python: join(dir, 'no-torch') }), {
    skipped: `${join(dir, 'no-torch')} has no torch (apt-get install python3-torch)`,
  });
  if (skip) return;
  const r = runEagerDecode(model, o);
  t.notOk('skipped' in r, JSON.stringify(r));
  t.match(r, { batch: 2, steps: 2, threads: 1, dtype: 'float32', step_ms: Number, prefill_ms: Number });
  const qwen2 = join(dir, 'qwen2');
  initModel({ preset: 'tiny', out: qwen2, seed: 0, modelType: 'qwen2' });
  const bad = runEagerDecode(qwen2, o);
  t.match(bad, {
    skipped: /^eager PyTorch decode failed \(exit 2\): eager_decode: .*expected model_type qwen3 in config.json, found 'qwen2'/,
  });
});

// The train benchmark's GRPO peer (bench/trl_grpo.py: one step of TRL's GRPOTrainer on the bench's
// model) runs on a checkpoint of ours and reports what the table needs; figures are not asserted
// (tests never assert timings), only that it runs the step it claims: K completions of exactly the
// asked length from the given prompt, one optimizer step, a step time split into generation and
// update, and memory. Under CI a missing trl fails, as a missing peft does in test/bench-peft.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { peftPython, trlMissing } from '../bench/train.js';
import { initModel } from '../lib/model/init.js';
import { repoRoot } from './helpers/shared.js';

const py = peftPython();
const missing = trlMissing(py) ?? '';
if (missing && process.env.CI) t.fail(missing);

t.test('bench/trl_grpo.py runs one GRPOTrainer step on the tiny preset', { skip: missing || false, timeout: 240_000 }, async (t) => {
  const tmp = t.testdir();
  const dir = join(tmp, 'tiny');
  initModel({ preset: 'tiny', out: dir, seed: 1 });
  const r = spawnSync(py!, [join(repoRoot, 'bench', 'trl_grpo.py'), dir, '12', '6', '2', '0', '1'], {
    encoding: 'utf8',
    timeout: 200_000,
    env: { ...process.env, TMPDIR: tmp },
  });
  t.equal(r.status, 0, r.status === 0 ? 'the peer exits 0' : r.stderr.slice(-2000));
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!);
  t.match(out, {
    step_s: Number,
    generate_s: Number,
    update_s: Number,
    score_s: Number,
    peak_MiB: Number,
    loaded_MiB: Number,
    trl: /^\d+\./,
    torch: /^2\./,
    loss: Number,
  });
  t.equal(out.steps, 1, 'one optimizer step (reps 0: no warm-up step)');
  t.same(out.completion_tokens, [6], 'every completion has exactly the asked length (min_new_tokens = max_completion_length)');
  t.equal(out.rows, 2);
  t.equal(out.prompt_tokens, 12);
  t.ok(
    out.generate_s > 0 && out.update_s > 0 && Math.abs(out.generate_s + out.update_s - out.step_s) < 1e-6,
    `step ${out.step_s.toFixed(2)} s = generation ${out.generate_s.toFixed(2)} s + update ${out.update_s.toFixed(2)} s`,
  );
  t.ok(out.peak_MiB >= out.loaded_MiB, 'peak RSS at least the loaded model');
});

t.test('trlMissing names what is missing', async (t) => {
  t.match(trlMissing(undefined), /no python with torch 2/);
  t.match(trlMissing('/bin/false'), /no trl in \/bin\/false/);
  if (py && !missing) t.equal(trlMissing(py), undefined, 'the venv has trl');
});

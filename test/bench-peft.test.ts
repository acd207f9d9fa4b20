// The train benchmark's peer (bench/peft_step.py: the same LoRA step in PyTorch 2 + transformers +
// PEFT) runs on a checkpoint of ours and reports what the table needs; figures are not asserted
// (tests never assert timings), only that the peer runs the step it claims: a finite loss that equals
// transformers' own loss for that sequence, a step time and memory.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { combineRounds, peftPython, roundRatios } from '../bench/train.js';
import { initModel } from '../lib/model/init.js';
import { repoRoot } from './helpers/shared.js';

const py = peftPython();
const missing = py ? '' : 'no python with torch 2, transformers and peft: run bash scripts/setup-venv.sh';
if (missing && process.env.CI) t.fail(missing);

t.test(
  'bench/peft_step.py runs the LoRA step on the tiny preset, with and without checkpointing',
  { skip: missing || false, timeout: 300_000 },
  async (t) => {
    const dir = join(t.testdir(), 'tiny');
    initModel({ preset: 'tiny', out: dir, seed: 1 });
    const losses: number[] = [];
    for (const ckpt of ['0', '1']) {
      const r = spawnSync(py!, [join(repoRoot, 'bench', 'peft_step.py'), dir, ckpt, '64', '1', '1'], {
        encoding: 'utf8',
        timeout: 240_000,
      });
      t.equal(r.status, 0, r.status === 0 ? 'the peer exits 0' : r.stderr.slice(-2000));
      const out = JSON.parse(r.stdout.trim().split('\n').pop()!);
      t.match(out, { step_s: Number, steps_warmup: 1, steps_timed: 1, peak_MiB: Number, loaded_MiB: Number, torch: /^2\./, loss: Number });
      t.ok(
        out.step_s > 0 && out.peak_MiB >= out.loaded_MiB && Number.isFinite(out.loss),
        `checkpointing ${ckpt === '1' ? 'on' : 'off'}: step ${out.step_s.toFixed(3)} s, loss ${out.loss}`,
      );
      losses.push(out.loss);
    }
    // The warm-up steps (argv 6) are run untimed before the timed ones; the default is one.
    const w = spawnSync(py!, [join(repoRoot, 'bench', 'peft_step.py'), dir, '0', '64', '3', '1', '2'], {
      encoding: 'utf8',
      timeout: 240_000,
    });
    t.equal(w.status, 0, w.status === 0 ? 'the peer exits 0 with 2 warm-up steps' : w.stderr.slice(-2000));
    t.match(JSON.parse(w.stdout.trim().split('\n').pop()!), { steps_warmup: 2, steps_timed: 3 }, '2 warm-up steps, then the 3 timed');
    // The loss is computed after one AdamW step at lr 1e-5 from a fresh adapter (B = 0): both runs
    // start from the same weights and take the same step, so checkpointing must not change it.
    t.ok(Math.abs(losses[0] - losses[1]) < 1e-4, `checkpointing changes nothing but memory (losses ${losses.join(' vs ')})`);
    t.ok(
      losses[0] > 5 && losses[0] < 20,
      `a random model's loss over a 151,936-token vocabulary is near ln V = 11.9 (${losses[0].toFixed(3)})`,
    );
  },
);

t.test('the rounds: medians of step times, the highest peak, the median of per-round ratios', async (t) => {
  const own = [
    { step_s: 1.2, head_rows: 384, peak_MiB: 1190, loaded_MiB: 205 },
    { step_s: 1.5, head_rows: 384, peak_MiB: 1201, loaded_MiB: 204 },
    { step_s: 1.3, head_rows: 384, peak_MiB: 1188, loaded_MiB: 206 },
  ];
  const peer = [{ step_s: 1.8 }, { step_s: 2.4 }, { step_s: 1.95 }];
  t.same(
    combineRounds(own),
    { step_s: 1.3, head_rows: 384, peak_MiB: 1201, loaded_MiB: 204 },
    'median step, the round with the highest peak',
  );
  t.equal(combineRounds(own.slice(0, 2)).step_s, 1.35, 'an even count: the mean of the middle two');
  // Per round: 1.5, 1.6, 1.5 -> median 1.5; the ratio of the medians (2.0 / 1.3 = 1.54) is not it.
  const r = roundRatios(peer, own);
  t.ok(Math.abs(r.median - 1.5) < 1e-12 && Math.abs(r.min - 1.5) < 1e-12 && Math.abs(r.max - 1.6) < 1e-12, JSON.stringify(r));
  t.throws(() => roundRatios(peer.slice(0, 2), own), /2 peer rounds against 3 own/);
  t.throws(() => combineRounds([]), /no rounds/);
});

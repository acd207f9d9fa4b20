/**
 * The slm-train side of the train benchmark's GRPO row (its peer: bench/trl_grpo.py, TRL's
 * GRPOTrainer), in a process of its own so that its peak resident memory is its own. One GRPO step
 * through the library as lib/train/rl/grpo.ts takes it: K rollouts of one prompt (temperature 1, exactly
 * completionLen new tokens each: no stop token), a deterministic reward, group-normalized advantages,
 * one policy-gradient update (clip 0.2, token-level loss as TRL's default, no KL, old log-probs from the
 * forward as with one inner epoch, max grad norm 1, lr 1e-5, r 16 / alpha 32 LoRA on all projections,
 * per-layer checkpointing). Prints one JSON line.
 * argv: modelDir promptLen completionLen K reps
 */
import { readFileSync } from 'node:fs';
import { LORA_TARGETS } from '../lib/engine/adapter.js';
import { Model } from '../lib/engine/model.js';
import { median } from './stats.js';

const [dir, ...nums] = process.argv.slice(2);
const [P, C, K, reps] = nums.map(Number);
const mib = (k: string) => Number(new RegExp(`${k}:\\s+(\\d+) kB`).exec(readFileSync('/proc/self/status', 'utf8'))?.[1] ?? NaN) / 1024;
const m = await Model.load(dir);
m.attachLora({ r: 16, alpha: 32, dropout: 0, rslora: false, targets: [...LORA_TARGETS] }, 0);
const prompt = Int32Array.from({ length: P }, (_, i) => ((i * 7919) % 100000) + 100); // bench/trl_grpo.py's prompt
const loaded = mib('VmRSS');
const gen: number[] = [],
  upd: number[] = [],
  step: number[] = [];
const lengths = new Set<number>();
for (let r = 0; r < reps + 1; r++) {
  const t0 = performance.now();
  const out = await m.generate({ prompts: Array.from({ length: K }, () => prompt), maxNewTokens: C, temperature: 1, seed: r });
  const t1 = performance.now();
  const rewards = out.tokens.map((t) => t.reduce((a, b) => a + b, 0) % 7); // deterministic, varies across the group
  const mean = rewards.reduce((a, b) => a + b, 0) / K;
  const std = Math.sqrt(rewards.reduce((a, b) => a + (b - mean) ** 2, 0) / Math.max(1, K - 1));
  const sequences = out.tokens.map((t) => [...prompt, ...t]);
  out.tokens.forEach((t) => lengths.add(t.length));
  const masks = sequences.map((s) => s.map((_, i) => (i >= P ? 1 : 0)));
  const advantages = rewards.map((x, i) => sequences[i].map(() => (x - mean) / (std + 1e-4)));
  const t2 = performance.now();
  await m.trainStep(
    { sequences, masks, advantages, oldLogprobs: out.tokens.map((_t, i) => [...new Float32Array(P), ...out.logprobs[i]]) },
    {
      loss: 'pg',
      clipLow: 0.2,
      clipHigh: 0.2,
      tokenLevel: true,
      oldFromForward: true,
      lr: 1e-5,
      maxGradNorm: 1,
      checkpoint: true,
      seed: r,
    },
  );
  const t3 = performance.now();
  if (r > 0 || reps === 0) {
    gen.push((t1 - t0) / 1e3);
    upd.push((t3 - t2) / 1e3);
    step.push((t3 - t0) / 1e3);
  } // the first step warms up
}
process.stdout.write(
  JSON.stringify({
    step_s: median(step),
    generate_s: median(gen),
    update_s: median(upd),
    completion_tokens: [...lengths],
    rows: K,
    prompt_tokens: P,
    peak_MiB: mib('VmHWM'),
    loaded_MiB: loaded,
  }) + '\n',
);
m.dispose();

/**
 * One configuration of the train benchmark in a process of its own, so that its peak resident memory
 * (VmHWM) belongs to that configuration alone. Prints one JSON line.
 * argv: modelDir checkpoint(0|1) seqLen reps [warmup]: warmup steps (default 1) run first and are not timed; the
 * median of the next reps is printed.
 */
import { readFileSync } from 'node:fs';
import { LORA_TARGETS } from '../lib/engine/adapter.js';
import { Model } from '../lib/engine/model.js';
import { median } from './stats.js';

const [dir, ckpt, seqLen, repsArg, warmArg] = process.argv.slice(2);
const warmup = warmArg === undefined ? 1 : Number(warmArg);
const T = Number(seqLen);
const checkpoint = ckpt === '1';
const kib = (k: string) => Number(new RegExp(`${k}:\\s+(\\d+) kB`).exec(readFileSync('/proc/self/status', 'utf8'))?.[1] ?? NaN) / 1024;
const m = await Model.load(dir);
m.attachLora({ r: 16, alpha: 32, dropout: 0, rslora: false, targets: [...LORA_TARGETS] }, 0);
const seq = Array.from({ length: T }, (_, i) => ((i * 7919) % 100000) + 100);
const mask = seq.map((_, i) => (i >= T / 4 ? 1 : 0));
const batch = { sequences: [seq], masks: [mask] };
const before = kib('VmRSS');
const times: number[] = [];
let headRows = 0;
for (let r = 0; r < warmup + Number(repsArg); r++) {
  const t0 = performance.now();
  headRows = (await m.trainStep(batch, { loss: 'sft', lr: 1e-5, checkpoint })).headRows;
  if (r >= warmup) times.push((performance.now() - t0) / 1e3);
}
process.stdout.write(
  JSON.stringify({
    step_s: median(times),
    steps_warmup: warmup,
    steps_timed: times.length,
    head_rows: headRows,
    peak_MiB: kib('VmHWM'),
    loaded_MiB: before,
  }) + '\n',
);
m.dispose();

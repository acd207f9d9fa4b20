/**
 * Per-step events as an async iterator: `trainSteps(cfg, options)` runs trainFromConfig and yields
 * each training step's metrics row as it is logged (the rows `onStep` gets); the iterator's return
 * value is the stage's result, and an error of the run (an aborted signal included) is thrown from it.
 */
import type { ResolvedConfig } from '../config/types.js';
import type { TrainResult } from './stages.js';
import { trainFromConfig, type StageOptions, type StepMetrics } from './session.js';

export async function* trainSteps(cfg: ResolvedConfig, opts: StageOptions = {}): AsyncGenerator<StepMetrics, TrainResult, undefined> {
  const queue: StepMetrics[] = [];
  let wake: (() => void) | undefined;
  let settled = false;
  const run = trainFromConfig(cfg, {
    ...opts,
    onStep: async (row) => {
      await opts.onStep?.(row);
      queue.push(row);
      wake?.();
    },
  }).finally(() => {
    settled = true;
    wake?.();
  });
  run.catch(() => {}); // thrown below, where it is awaited
  for (;;) {
    while (queue.length) yield queue.shift()!;
    if (settled) break;
    await new Promise<void>((r) => {
      wake = r;
      if (queue.length || settled) r();
    });
    wake = undefined;
  }
  return await run;
}

// A native train step's stats, for tests that replace Model.trainStep with a stub and only look at
// what reached it.
import type { NativeTrainStats } from '../../lib/binding/types.js';

export function fakeTrainStats(over: Partial<NativeTrainStats> = {}): NativeTrainStats {
  return {
    loss: 0,
    pgLoss: 0,
    sftLoss: 0,
    kl: 0,
    entropy: 0,
    clipFrac: 0,
    ratio: 1,
    valueLoss: 0,
    gradNorm: 1,
    tokens: 2,
    sequences: 1,
    headRows: 2,
    headChunks: 1,
    skipped: false,
    skipReason: '',
    step: 1,
    ...over,
  } as NativeTrainStats;
}

import type { Test } from 'tap';
import { retryClock } from '../../lib/util/http-retry.js';

/**
 * Records the waits of every retry loop (lib/util/http-retry's retryClock) instead of sleeping, for
 * the rest of the test: retries are checked by counting attempts and waits, not by wall-clock time.
 */
export function recordWaits(t: Test): number[] {
  const waits: number[] = [];
  const real = retryClock.sleep;
  retryClock.sleep = async (ms: number) => {
    waits.push(ms);
  };
  t.teardown(() => {
    retryClock.sleep = real;
  });
  return waits;
}

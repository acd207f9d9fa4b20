import { existsSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** Root of the repository checkout. */
export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
/** `../shared` beside the checkout (fixtures and real data; read only, never copied into the repo). */
export const sharedDir = process.env.SLM_SHARED_DIR ?? resolve(repoRoot, '..', 'shared');
export const haveShared = existsSync(resolve(sharedDir, 'fixtures'));
export const fixture = (...p: string[]) => resolve(sharedDir, 'fixtures', ...p);
export const dataFile = (...p: string[]) => resolve(sharedDir, 'data', ...p);

/** Whether this is a CI run (CI=true, as CI services and .ci/run set it). */
export const isCi = /^(1|true|yes)$/i.test(process.env.CI ?? '');

/**
 * A test's skip reason for a missing dependency (python3-torch, chromium, ../shared...), or false.
 * Outside CI a missing dependency skips the test, saying why; under CI=true it fails the file instead
 * (a run must not pass on skipped strength), with the reason, which says what to install.
 */
export function needs(reason: string | false | undefined, t: { fail: (message: string) => void }): string | false {
  if (!reason) return false;
  if (isCi) t.fail(`CI=true, but a dependency of this test is missing: ${reason}`);
  return reason;
}

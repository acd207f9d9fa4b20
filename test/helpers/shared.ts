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

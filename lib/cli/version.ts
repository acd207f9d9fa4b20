/** The version of the slm-train package (its package.json), for `slm-train --version`. */
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** Walks up from this module (lib/cli in a checkout, dist/lib/cli when built) to the package.json named slm-train. */
export function packageVersion(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const file = join(dir, 'package.json');
    if (existsSync(file)) {
      try {
        const p = JSON.parse(readFileSync(file, 'utf8')) as { name?: unknown; version?: unknown };
        if (p.name === 'slm-train' && typeof p.version === 'string') return p.version;
      } catch {
        /* not ours: go on up */
      }
    }
    const up = dirname(dir);
    if (up === dir) return 'unknown';
    dir = up;
  }
}

#!/usr/bin/env node
// The executable: runs the compiled CLI (dist/, built by `npm install` / `npm run build:ts`).
import { existsSync } from 'node:fs';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { dirname, join } from 'node:path';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const entry = join(root, 'dist', 'lib', 'cli', 'main.js');
if (!existsSync(entry)) {
  process.stderr.write(
    `slm-train: error NOT_BUILT: the compiled CLI is missing (expected ${entry}).\n` +
      `Run \`npm install\` (or \`npm run build:ts\`) in ${root} first.\n`,
  );
  process.exit(2);
}
const { main } = await import(pathToFileURL(entry).href);
await main();

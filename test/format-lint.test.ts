// Formatting and linting as habits (issue 37): the tree passes `node scripts/format.mjs --check`
// (Biome for TypeScript and JavaScript, clang-format for native/, black and flake8 for Python), and the
// check does fail on a file that is not formatted or that a linter objects to, and the in-place mode
// fixes what a formatter can. The Debian tools (clang-format, black, flake8) are installed by .ci/run:
// under CI=true a missing one fails, elsewhere the test skips.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const root = join(import.meta.dirname, '..');
const script = join(root, 'scripts', 'format.mjs');
const missing = ['clang-format', 'black', 'flake8'].filter((tool) => spawnSync(tool, ['--version']).error);
const skip =
  missing.length && process.env.CI !== 'true' ? `${missing.join(', ')} not installed (Debian packages; .ci/run installs them)` : false;

const format = (...args: string[]) => spawnSync(process.execPath, [script, ...args], { cwd: root, encoding: 'utf8', timeout: 300_000 });

t.test('the check fails on unformatted and lint-failing files, and the in-place mode formats them', { skip }, async (t) => {
  // Probe files inside the tree (each tool reads its configuration from the repository root), never tracked.
  const probes = {
    ts: join(root, 'test', 'format-probe.tmp.ts'),
    cc: join(root, 'test', 'format-probe.tmp.cc'),
    py: join(root, 'test', 'format-probe.tmp.py'),
  };
  t.teardown(() => Object.values(probes).forEach((p) => rmSync(p, { force: true })));
  writeFileSync(probes.ts, 'export const  x = [1,2 ,3];\n');
  writeFileSync(probes.cc, 'int  f( ){return 1;}\n');
  writeFileSync(probes.py, 'x=[1,2 ,3]\n');
  const files = Object.values(probes).map((p) => p.slice(root.length + 1));
  let r = format('--check', '--files', ...files);
  t.equal(r.status, 1, 'unformatted: the check fails');
  for (const tool of ['biome', 'clang-format', 'black']) t.match(r.stderr, new RegExp(`^${tool} \\(`, 'm'), `${tool} names its failure`);
  r = format('--files', ...files);
  t.equal(r.status, 0, `in place: formatted (${r.stderr})`);
  t.equal(readFileSync(probes.py, 'utf8'), 'x = [1, 2, 3]\n', 'black wrote the Python probe in place');
  r = format('--check', '--files', ...files);
  t.equal(r.status, 0, `then the check passes (${r.stderr})`);
  // Lint errors a formatter cannot fix: a debugger statement (Biome), an unused import (pyflakes).
  writeFileSync(probes.ts, 'export function f(): number {\n  debugger;\n  return 1;\n}\n');
  writeFileSync(probes.py, 'import os\n\nx = 1\n');
  r = format('--check', '--files', ...files);
  t.equal(r.status, 1, 'lint errors: the check fails');
  t.match(r.stderr, /noDebugger/, 'Biome: the rule');
  t.match(r.stderr, /F401 'os' imported but unused/, 'flake8: the rule');
  // The in-place run above laid the C++ and Python probes out as their formatters do.
  t.equal(readFileSync(probes.cc, 'utf8'), 'int f() { return 1; }\n', 'clang-format wrote the C++ probe in place');
});

t.test('the tree is formatted and lint-clean (node scripts/format.mjs --check)', { skip }, async (t) => {
  const r = format('--check');
  t.equal(r.status, 0, `${r.stdout}${r.stderr}`.slice(0, 4000));
  t.match(r.stdout, /formatted and lint-clean/);
});

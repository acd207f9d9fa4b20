#!/usr/bin/env node
// The repository's formatters and linters, in one command (README "Formatting and linting"):
//   node scripts/format.mjs           # format in place: Biome (TypeScript, JavaScript), clang-format (native/), black (Python)
//   node scripts/format.mjs --check   # change nothing; exit 1 when a file is unformatted or a linter objects
//                                     # (Biome's linter, flake8's pyflakes checks): what CI runs (test/format-lint.test.ts)
// Configuration: biome.jsonc, .clang-format, pyproject.toml ([tool.black]), .flake8. The tools: Biome
// from npm (a dev dependency, pinned), clang-format, black and flake8 from Debian (.ci/run installs them).
// --files F... limits the check to those files (the test uses it on a file it breaks on purpose).
import { spawnSync } from 'node:child_process';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const args = process.argv.slice(2);
const check = args.includes('--check');
const only = args.includes('--files') ? args.slice(args.indexOf('--files') + 1) : null;

/** Tracked files matching the patterns (or the --files among them). */
function tracked(patterns) {
  if (only) return only.filter((f) => patterns.some((p) => f.endsWith(p.slice(p.lastIndexOf('.')))));
  const r = spawnSync('git', ['ls-files', ...patterns], { cwd: root, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`git ls-files failed: ${r.stderr}`);
  return r.stdout.split('\n').filter(Boolean);
}

const failures = [];
function run(name, cmd, argv, files) {
  if (files && !files.length) return;
  const r = spawnSync(cmd, [...argv, ...(files ?? [])], { cwd: root, encoding: 'utf8', maxBuffer: 64 << 20 });
  if (r.error?.code === 'ENOENT') {
    failures.push(`${name}: ${cmd} is not installed (Debian: apt-get install ${cmd === 'flake8' ? 'flake8' : cmd}; .ci/run installs it)`);
    return;
  }
  const out = `${r.stdout ?? ''}${r.stderr ?? ''}`.trim();
  if (r.status !== 0) failures.push(`${name} (${cmd} exited ${r.status}):\n${out.split('\n').slice(0, 60).join('\n')}`);
  else if (out && !check) process.stdout.write(`${name}: ${out.split('\n').at(-1)}\n`);
}

const biome = join(root, 'node_modules', '.bin', 'biome');
const tsjs = only ? tracked(['*.ts', '*.mjs', '*.js']) : null;
if (check) run('biome', biome, ['ci', '--reporter=summary', '--colors=off', ...(tsjs ? [] : ['.'])], tsjs);
else run('biome', biome, ['check', '--write', '--colors=off', ...(tsjs ? [] : ['.'])], tsjs);

const native = tracked(['native/*.cc', 'native/*.h', 'native/*.inc']);
run('clang-format', 'clang-format', check ? ['--dry-run', '--Werror'] : ['-i'], native);

const python = tracked(['*.py']);
run('black', 'black', check ? ['--check', '--quiet'] : ['--quiet'], python);
run('flake8', 'flake8', [], python);

if (failures.length) {
  process.stderr.write(
    `${failures.join('\n\n')}\n\n${check ? 'Run `node scripts/format.mjs` to format in place; lint errors need a hand (README "Formatting and linting").' : ''}\n`,
  );
  process.exit(1);
}
if (check) process.stdout.write('formatted and lint-clean: Biome, clang-format, black, flake8\n');

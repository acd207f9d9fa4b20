// The README's library example (issue 36, items 6 and 8) compiled in a fresh project against the
// built dist (`npx tsc -p tsconfig.build.json` first) under `strict` and `noUncheckedIndexedAccess`,
// with no `types` of its own: Node's types come only from the package's reference to them (its
// .d.ts use Buffer and NodeJS), and the project's `import 'node:fs'` resolves through it too.
// test/package.test.ts also runs the example, from an installed tarball (a 15-minute test).
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { repoRoot } from './helpers/shared.js';

t.test("the README's library example type-checks under strict + noUncheckedIndexedAccess against dist", async (t) => {
  t.ok(existsSync(join(repoRoot, 'dist', 'lib', 'index.d.ts')), 'dist is built');
  t.match(
    readFileSync(join(repoRoot, 'dist', 'lib', 'index.d.ts'), 'utf8'),
    /^\/\/\/ <reference types="node" preserve="true" \/>/m,
    "the entry's types reference Node's",
  );
  const app = t.testdir();
  mkdirSync(join(app, 'node_modules'));
  symlinkSync(repoRoot, join(app, 'node_modules', 'slm-train'), 'dir');
  const readme = readFileSync(join(repoRoot, 'README.md'), 'utf8');
  const block = /<!-- library-example:start -->\s*```ts\n([\s\S]*?)```\s*<!-- library-example:end -->/.exec(readme);
  t.ok(block, 'the README has the library example');
  writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'app', version: '1.0.0', private: true, type: 'module' }));
  writeFileSync(join(app, 'example.ts'), block![1]!);
  const compilerOptions = {
    target: 'ES2022',
    module: 'NodeNext',
    moduleResolution: 'NodeNext',
    strict: true,
    noUncheckedIndexedAccess: true,
    exactOptionalPropertyTypes: false,
    types: [],
    noEmit: true,
  };
  writeFileSync(join(app, 'tsconfig.json'), JSON.stringify({ compilerOptions, files: ['example.ts'] }));
  const tsc = spawnSync(process.execPath, [join(repoRoot, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', app], {
    cwd: app,
    encoding: 'utf8',
    timeout: 300_000,
  });
  t.equal(tsc.status, 0, `tsc: ${tsc.stdout}${tsc.stderr}`);
});

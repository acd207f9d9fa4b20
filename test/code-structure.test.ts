// The shape of the code a newcomer meets: one concept per file (no TypeScript file in lib/, native or
// Python source over 500 lines, as the formatters lay them out: Biome and clang-format at 140 columns,
// black; lib/'s cap was 400 lines before the tree was formatted, which made lib/ 18 % longer in lines
// and native/ 4 %) and no import cycles in lib/ (type-only imports included: madge follows them).
import t from 'tap';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import madge from 'madge';

const root = join(import.meta.dirname, '..');

function files(dir: string, ext: RegExp): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) return name === '__pycache__' ? [] : files(p, ext);
    return ext.test(name) ? [p] : [];
  });
}

const lines = (p: string) => readFileSync(p, 'utf8').split('\n').length - 1;

for (const [dir, ext, limit] of [
  ['lib', /\.ts$/, 500],
  ['native', /\.(cc|h)$/, 500],
  ['python', /\.py$/, 500],
] as const) {
  t.test(`no file in ${dir}/ over ${limit} lines`, async (t) => {
    const all = files(join(root, dir), ext);
    t.ok(all.length > 5, `found the ${dir} sources (${all.length})`);
    const over = all.map((p) => [relative(root, p), lines(p)] as const).filter(([, n]) => n > limit);
    t.same(over, [], over.map(([p, n]) => `${p}: ${n} lines`).join(', ') || 'none');
  });
}

t.test('no import cycles in lib/', async (t) => {
  const res = await madge(join(root, 'lib'), { fileExtensions: ['ts'], tsConfig: join(root, 'tsconfig.json') });
  t.ok(Object.keys(res.obj()).length > 100, 'madge saw the modules');
  t.same(res.circular(), [], 'circular imports');
});

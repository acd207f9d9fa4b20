import t from 'tap';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { candidates, loadBinding, loadFrom } from '../lib/binding/index.js';

t.test('the loader prefers a prebuilt binary, then the local build', async (t) => {
  const c = candidates();
  const kinds = c.map((x) => x.kind).filter((k) => k !== 'env');
  t.equal(kinds[0], 'prebuilt');
  t.equal(kinds[kinds.length - 1], 'local-build');
  t.match(c[c.length - 1].path, /build\/Release\/slm_train\.node$/);
  const b = loadBinding();
  t.type(b.addon.version().torch, 'string');
});

t.test('when nothing loads, one error lists every attempt and the commands that fix it', async (t) => {
  const dir = t.testdir();
  const bogus = join(dir, 'broken.node');
  writeFileSync(bogus, 'not an ELF file');
  try {
    loadFrom([
      { path: join(dir, 'missing.node'), kind: 'prebuilt' },
      { path: bogus, kind: 'local-build' },
    ]);
    t.fail('should throw');
  } catch (e) {
    const err = e as Error & { code: string };
    t.equal(err.code, 'NATIVE_BINARY_MISSING');
    t.match(err.message, /missing\.node: not found/);
    t.match(err.message, /broken\.node: .+/);
    t.match(err.message, /apt-get install -y .*libtorch-dev/);
    t.match(err.message, /npm run build:native/);
  }
});

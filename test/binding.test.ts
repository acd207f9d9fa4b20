import t from 'tap';
import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { candidates, loadBinding, loadFrom } from '../lib/binding/index.js';

t.test('the loader prefers a prebuilt binary, then the local build', async (t) => {
  const c = candidates();
  const kinds = c.map((x) => x.kind).filter((k) => k !== 'env');
  t.ok(kinds.includes('prebuilt') && kinds.includes('local-build'));
  t.ok(c.some((x) => /build\/Release\/slm_train\.node$/.test(x.path)));
  const b = loadBinding();
  t.type(b.addon.version().torch, 'string');
});

t.test('a matching prebuilt comes before the local build unless the local build is newer', async (t) => {
  const root = t.testdir({
    prebuilds: {
      [`${process.platform}-${process.arch}`]: {
        'slm_train.torch-1.13.0.cpu.napi8.node': 'x',
        'slm_train.torch-1.13.0.cuda.napi8.node': 'x',
      },
    },
    build: { Release: {} },
  });
  let c = candidates(root).filter((x) => x.kind !== 'env');
  t.equal(c[0].kind, 'prebuilt');
  const gpu = existsSync('/dev/nvidia0') || existsSync('/dev/nvidiactl');
  t.match(c[0].path, gpu ? /\.cuda\./ : /\.cpu\./, "the build for this machine's device first");
  t.equal(c[c.length - 1].kind, 'local-build');
  const { utimesSync } = await import('node:fs');
  writeFileSync(join(root, 'build', 'Release', 'slm_train.node'), 'x');
  const future = new Date(Date.now() + 60_000);
  utimesSync(join(root, 'build', 'Release', 'slm_train.node'), future, future);
  c = candidates(root).filter((x) => x.kind !== 'env');
  t.equal(c[0].kind, 'local-build', 'a fresher local build wins');
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
    t.match(err.message, 'sudo apt-get install -y libtorch1.13 libopenblas0-openmp', 'the runtime-only fix for a prebuilt binary');
    t.match(err.message, /npm run build:native/);
  }
});

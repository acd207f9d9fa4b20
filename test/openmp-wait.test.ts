// How long libgomp's idle threads spin (lib/engine/runtime.ts, tuneOpenMP): unless the user set
// OMP_WAIT_POLICY or GOMP_SPINCOUNT, the addon's libgomp loads with active waiting and a spin count
// of 1,000; the user's settings win; and ours leave process.env once the addon is loaded, so child
// processes see the user's environment. What libgomp took is read from libgomp itself
// (OMP_DISPLAY_ENV=verbose prints its settings when it initialises), in a fresh process each time.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const repoRoot = fileURLToPath(new URL('..', import.meta.url));
const runtime = join(repoRoot, 'dist', 'lib', 'engine', 'runtime.js');

function load(env: Record<string, string>): { libgomp: Record<string, string>; after: Record<string, string | null> } {
  const base = { ...process.env };
  delete base.OMP_WAIT_POLICY;
  delete base.GOMP_SPINCOUNT;
  const script = `const { native } = await import(${JSON.stringify(runtime)}); native();
    console.log(JSON.stringify({ OMP_WAIT_POLICY: process.env.OMP_WAIT_POLICY ?? null, GOMP_SPINCOUNT: process.env.GOMP_SPINCOUNT ?? null }));`;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
    env: { ...base, OMP_DISPLAY_ENV: 'verbose', ...env },
    encoding: 'utf8',
    timeout: 120_000,
  });
  if (r.status !== 0) throw new Error(`the child failed: ${r.stderr}`);
  const libgomp: Record<string, string> = {};
  for (const m of r.stderr.matchAll(/^\s*(OMP_WAIT_POLICY|GOMP_SPINCOUNT) = '([^']*)'/gm)) libgomp[m[1]] = m[2];
  return { libgomp, after: JSON.parse(r.stdout.trim().split('\n').pop()!) };
}

const skip = existsSync(runtime) ? false : 'dist/ is not built (npm run build:ts)';

t.test('by default libgomp loads with active waiting and 1,000 spins, and the variables leave process.env after', { skip }, async (t) => {
  const r = load({});
  t.equal(r.libgomp.OMP_WAIT_POLICY, 'ACTIVE', 'libgomp waits actively');
  t.equal(r.libgomp.GOMP_SPINCOUNT, '1000', 'for 1,000 spins');
  t.same(r.after, { OMP_WAIT_POLICY: null, GOMP_SPINCOUNT: null }, 'child processes see neither');
});

t.test("the user's OMP_WAIT_POLICY wins and stays", { skip }, async (t) => {
  const r = load({ OMP_WAIT_POLICY: 'passive' });
  t.equal(r.libgomp.OMP_WAIT_POLICY, 'PASSIVE');
  t.same(r.after, { OMP_WAIT_POLICY: 'passive', GOMP_SPINCOUNT: null }, 'no spin count added');
});

t.test("the user's GOMP_SPINCOUNT wins and stays", { skip }, async (t) => {
  const r = load({ GOMP_SPINCOUNT: '5' });
  t.equal(r.libgomp.GOMP_SPINCOUNT, '5');
  t.equal(r.libgomp.OMP_WAIT_POLICY, 'PASSIVE', 'no wait policy added (libgomp reports its default, PASSIVE)');
  t.same(r.after, { OMP_WAIT_POLICY: null, GOMP_SPINCOUNT: '5' });
});

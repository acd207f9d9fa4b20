// glibc malloc's thresholds (native/addon/workers.h, tune_malloc): when the addon loads it keeps large
// blocks below 32 MiB on malloc's heap and up to 256 MiB of freed heap mapped, so a forward reuses the
// pages the previous one freed instead of faulting in fresh zeroed ones; the user's own
// MALLOC_*_THRESHOLD_ or glibc.malloc tunables win. Checked in fresh processes by what they report
// and by the page faults of repeated identical forwards (process.resourceUsage), against a process
// whose (harmless) glibc.malloc tunable leaves glibc's defaults in place. The tensors' caching allocator
// (core/cpu_cache.h, test/cpu-cache.test.ts) is off in these children: it would hide malloc's thresholds.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { fixture } from './helpers/shared.js';

const repoRoot = fileURLToPath(new URL('..', import.meta.url));
const dist = (p: string) => JSON.stringify(join(repoRoot, 'dist', 'lib', ...p.split('/')));
const skip = existsSync(join(repoRoot, 'dist', 'lib', 'engine', 'model.js')) ? false : 'dist/ is not built (npm run build:ts)';

/** Minor page faults of each of `calls` identical 512-token forwards of the tiny fixture, in a fresh process. */
function faults(env: Record<string, string>, calls = 8): { malloc: string; faults: number[] } {
  const base = { ...process.env };
  for (const k of ['GLIBC_TUNABLES', 'MALLOC_MMAP_THRESHOLD_', 'MALLOC_TRIM_THRESHOLD_']) delete base[k];
  const script = `const { Model } = await import(${dist('engine/model.js')});
    const { native } = await import(${dist('engine/runtime.js')});
    const m = await Model.load(${JSON.stringify(fixture('qwen3', 'tiny-qwen3-f32'))});
    const seq = Array.from({ length: 512 }, (_, i) => (i * 37) % 500);
    const f = [];
    for (let i = 0; i < ${calls}; i++) { const f0 = process.resourceUsage().minorPageFault; await m.sequenceLogprobs([seq]); f.push(process.resourceUsage().minorPageFault - f0); }
    console.log(JSON.stringify({ malloc: native().version().malloc, faults: f }));`;
  // One libuv pool thread: every call allocates from the same malloc arena.
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
    env: { ...base, UV_THREADPOOL_SIZE: '1', SLM_TRAIN_CPU_CACHE: '0', ...env },
    encoding: 'utf8',
    timeout: 120_000,
  });
  if (r.status !== 0) throw new Error(`the child failed: ${r.stderr}`);
  return JSON.parse(r.stdout.trim().split('\n').pop()!);
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

t.test('by default the addon sets the thresholds, and repeated forwards stop faulting in pages', { skip }, async (t) => {
  const tuned = faults({});
  t.equal(tuned.malloc, 'mmap threshold 32 MiB, trim threshold 256 MiB');
  const glibc = faults({ GLIBC_TUNABLES: 'glibc.malloc.perturb=0' });
  t.match(glibc.malloc, /the user's/, 'a glibc.malloc tunable of the user leaves glibc alone');
  // The first calls warm the heap up; compare the later ones.
  const a = median(tuned.faults.slice(2)),
    b = median(glibc.faults.slice(2));
  t.ok(b > 2000, `glibc's defaults fault in pages on every forward (median ${b}), else this test proves nothing`);
  t.ok(a * 4 < b, `with the thresholds a repeated forward faults ${a} pages, against ${b} with glibc's defaults`);
});

t.test("the user's MALLOC_TRIM_THRESHOLD_ or MALLOC_MMAP_THRESHOLD_ wins", { skip }, async (t) => {
  // The user's small thresholds stay in force: repeated forwards keep faulting in pages, which the
  // addon's thresholds would have stopped (the first test).
  for (const env of [{ MALLOC_TRIM_THRESHOLD_: '131072' }, { MALLOC_MMAP_THRESHOLD_: '131072' }] as Array<Record<string, string>>) {
    const r = faults(env);
    t.match(r.malloc, /the user's/, `${Object.keys(env)[0]}: reported as the user's`);
    const f = median(r.faults.slice(2));
    t.ok(f > 2000, `${Object.keys(env)[0]}: a repeated forward still faults ${f} pages (not overridden)`);
  }
});

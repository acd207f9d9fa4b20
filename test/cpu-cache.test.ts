// The CPU tensors' caching allocator (native/core/cpu_cache.h): installed when the addon loads, it keeps
// freed blocks of 64 KiB or more in one pool for every thread, so a call that lands on another libuv
// pool thread than the previous one reuses the previous call's pages instead of faulting in fresh ones
// from its own malloc arena (or a fresh mmap, for a block over 32 MiB). Checked in fresh processes (the
// allocator is chosen at load) on LoRA train steps of the `tiny` preset (its 151,936-row vocabulary head:
// ~233 MB of logits for its 384 trained rows, one chunk of the head), on the default pool of four threads: what each reports,
// the page faults of repeated identical steps with the cache and without it (SLM_TRAIN_CPU_CACHE=0),
// that no block stays in use after a step (live bytes return to where they were), that the cached bytes
// stay under the cap, and that release frees them.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { NativeCpuCacheStats } from '../lib/binding/types.js';
import { initModel } from '../lib/model/init.js';

const repoRoot = fileURLToPath(new URL('..', import.meta.url));
const dist = (p: string) => JSON.stringify(join(repoRoot, 'dist', 'lib', ...p.split('/')));
const skip = existsSync(join(repoRoot, 'dist', 'lib', 'engine', 'model.js')) ? false : 'dist/ is not built (npm run build:ts)';

interface Report {
  cpuCache: string;
  faults: number[];
  live: number[];
  cached: number[];
  losses: number[];
  before: NativeCpuCacheStats;
  after: NativeCpuCacheStats;
  released: NativeCpuCacheStats;
}

const dir = mkdtempSync(join(tmpdir(), 'slm-cpu-cache-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
initModel({ preset: 'tiny', out: dir, seed: 0 });

/** `calls` identical LoRA train steps (512 tokens, the last 3/4 trained) of the tiny preset in a fresh process. */
function run(env: Record<string, string>, calls = 6): Report {
  const base = { ...process.env };
  for (const k of ['SLM_TRAIN_CPU_CACHE', 'UV_THREADPOOL_SIZE', 'MALLOC_ARENA_MAX', 'GLIBC_TUNABLES']) delete base[k];
  const script = `const { Model } = await import(${dist('engine/model.js')});
    const { native } = await import(${dist('engine/runtime.js')});
    const a = native();
    const m = await Model.load(${JSON.stringify(dir)});
    m.attachLora({ r: 8, alpha: 16, dropout: 0, rslora: false, targets: ['q_proj', 'v_proj'] }, 0);
    const seq = Array.from({ length: 512 }, (_, i) => ((i * 7919) % 100000) + 100);
    const batch = { sequences: [seq], masks: [seq.map((_, i) => (i >= 128 ? 1 : 0))] };
    const step = () => m.trainStep(batch, { loss: 'sft', lr: 1e-5 });
    await step();
    const before = a.cpuCacheStats();
    const faults = [], live = [], cached = [], losses = [];
    for (let i = 0; i < ${calls}; i++) {
      const f0 = process.resourceUsage().minorPageFault;
      const st = await step();
      losses.push(st.loss, st.gradNorm);
      faults.push(process.resourceUsage().minorPageFault - f0);
      live.push(a.cpuCacheStats().liveBytes);
      cached.push(a.cpuCacheStats().cachedBytes);
    }
    const after = a.cpuCacheStats();
    console.log(JSON.stringify({ cpuCache: a.version().cpuCache, faults, live, cached, losses, before, after, released: a.cpuCacheStats({ release: true }) }));`;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
    env: { ...base, ...env },
    encoding: 'utf8',
    timeout: 120_000,
  });
  if (r.status !== 0) throw new Error(`the child failed: ${r.stderr}`);
  return JSON.parse(r.stdout.trim().split('\n').pop()!);
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

t.test('the cache is installed by default and reused across pool threads; SLM_TRAIN_CPU_CACHE=0 leaves ATen alone', { skip }, async (t) => {
  const on = run({});
  t.match(on.cpuCache, /^caching blocks >= 64 KiB, at most \d+ MiB cached$/);
  t.ok(on.before.installed && on.after.installed);
  t.ok(on.after.hits > on.before.hits, `blocks were reused (${on.after.hits - on.before.hits} hits)`);
  t.ok(
    on.after.cachedBytes > 0 && on.after.cachedBytes <= on.after.capBytes,
    `cached ${on.after.cachedBytes} bytes, cap ${on.after.capBytes}`,
  );
  // Nothing of the calls stays in use: the model's own tensors were allocated before the first stats.
  // Nothing of a step stays in use but what the first step created for good (the optimizer's state).
  t.same(
    on.live,
    on.live.map(() => on.before.liveBytes),
    'live bytes return to where they were after every step',
  );
  t.equal(on.released.cachedBytes, 0, 'release frees every cached block');
  t.equal(on.released.liveBytes, on.before.liveBytes, 'release leaves live blocks alone');

  const off = run({ SLM_TRAIN_CPU_CACHE: '0' });
  t.equal(off.cpuCache, "SLM_TRAIN_CPU_CACHE=0: ATen's CPU allocator");
  t.notOk(off.after.installed);
  t.equal(off.after.hits + off.after.misses, 0, 'with the cache off no allocation goes through it');
  // Where a tensor lives never changes its value: the same steps give the same losses and gradient norms.
  t.same(on.losses, off.losses, 'losses and gradient norms equal with and without the cache, bit for bit');
  t.ok(new Set(on.losses).size > 2, 'the steps move the loss (else the equality proves little)');
  // The first steps warm the pool up; compare the later ones.
  const a = median(on.faults.slice(2)),
    b = median(off.faults.slice(2));
  t.ok(b > 2000, `without the cache, steps fault in pages (median ${b}), else this test proves nothing`);
  t.ok(a * 4 < b, `with the cache a repeated step faults ${a} pages, against ${b} without it`);
});

t.test('SLM_TRAIN_CPU_CACHE=N caps the cached bytes at N MiB; anything but digits is refused', { skip }, async (t) => {
  // A step frees one ~233 MB logits buffer (its 384 trained rows are one chunk of the head) and many
  // smaller blocks: more than 300 MiB.
  const r = run({ SLM_TRAIN_CPU_CACHE: '300' }, 3);
  t.equal(r.cpuCache, 'caching blocks >= 64 KiB, at most 300 MiB cached');
  t.equal(r.after.capBytes, 300 * 2 ** 20);
  t.ok(
    r.cached.every((c) => c > 150 * 2 ** 20 && c <= 300 * 2 ** 20),
    `after each step the cache holds 150-300 MiB (${r.cached.map((c) => (c / 2 ** 20).toFixed(0)).join(', ')} MiB)`,
  );
  t.ok(r.after.hits > r.before.hits, 'blocks under the cap are still reused');
  const bad = spawnSync(
    process.execPath,
    [
      '--input-type=module',
      '-e',
      `const { native } = await import(${dist('engine/runtime.js')}); try { native(); console.log('loaded'); } catch (e) { console.log(e.code + ' ' + e.message); }`,
    ],
    { env: { ...process.env, SLM_TRAIN_CPU_CACHE: '2GB' }, encoding: 'utf8', timeout: 60_000 },
  );
  t.match(bad.stdout, /^ARGUMENT_INVALID SLM_TRAIN_CPU_CACHE must be 0 \(the CPU tensor cache off\) or its cap in MiB, found '2GB'/);
});

t.test('doctor reports the allocator in force', { skip }, async (t) => {
  const doctor = (env: Record<string, string>) => {
    const base = { ...process.env };
    delete base.SLM_TRAIN_CPU_CACHE;
    const r = spawnSync(process.execPath, [join(repoRoot, 'bin', 'slm-train.js'), 'doctor', '--json'], {
      env: { ...base, ...env },
      encoding: 'utf8',
      timeout: 120_000,
    });
    return (JSON.parse(r.stdout) as { libtorch: { cpuCache: string } }).libtorch.cpuCache;
  };
  t.match(doctor({}), /^caching blocks >= 64 KiB/);
  t.equal(doctor({ SLM_TRAIN_CPU_CACHE: '0' }), "SLM_TRAIN_CPU_CACHE=0: ATen's CPU allocator");
  t.equal(doctor({ SLM_TRAIN_CPU_CACHE: '00' }), "SLM_TRAIN_CPU_CACHE=0: ATen's CPU allocator", 'any spelling of zero turns it off');
  t.equal(doctor({ SLM_TRAIN_CPU_CACHE: '64' }), 'caching blocks >= 64 KiB, at most 64 MiB cached');
});

t.test("serve's allocator: ATen's unless SLM_TRAIN_CPU_CACHE has a value (empty counts as unset)", async (t) => {
  const { serverAllocatorEnv } = await import('../lib/engine/runtime.js');
  t.equal(serverAllocatorEnv({}).SLM_TRAIN_CPU_CACHE, '0', 'unset: ATen');
  t.equal(serverAllocatorEnv({ SLM_TRAIN_CPU_CACHE: '' }).SLM_TRAIN_CPU_CACHE, '0', 'empty: ATen, as unset');
  t.equal(serverAllocatorEnv({ SLM_TRAIN_CPU_CACHE: '256' }).SLM_TRAIN_CPU_CACHE, '256', "the user's cap stays");
  t.equal(serverAllocatorEnv({ SLM_TRAIN_CPU_CACHE: '0' }).SLM_TRAIN_CPU_CACHE, '0');
});

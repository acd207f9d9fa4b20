// The CPU kernels' instruction-set levels a test runs at: every level this CPU supports, so that an
// AVX-512 machine tests the AVX2 and plain paths too (SLM_TRAIN_CPU_ISA caps the level for users;
// the addon's setCpuIsa does it for a test).
import type { Test } from 'tap';
import { CPU_ISA_LEVELS, type CpuIsaLevel, type NativeAddon } from '../../lib/binding/types.js';

/** The levels this CPU supports, most capable first; `none` (no vector kernel) only when asked for. */
export function cpuLevels(a: NativeAddon, withNone = false): CpuIsaLevel[] {
  const top = a.version().cpuIsaDetected;
  return CPU_ISA_LEVELS.slice(CPU_ISA_LEVELS.indexOf(top)).filter((l) => withNone || l !== 'none');
}

/** t.test once per level, the level in force while it runs (then the one in force before). */
export function atEachLevel(
  t: Test,
  a: NativeAddon,
  name: string,
  fn: (t: Test, level: CpuIsaLevel) => Promise<void> | void,
  o: { withNone?: boolean; skip?: string | false } = {},
): void {
  for (const level of cpuLevels(a, o.withNone))
    t.test(`${name} [${level}]`, { skip: o.skip }, async (tt) => {
      const before = a.version().cpuIsa; // the level in force (SLM_TRAIN_CPU_ISA may cap it), restored after
      tt.equal(a.setCpuIsa(level), level, `the kernels run at ${level}`);
      tt.teardown(() => void a.setCpuIsa(before));
      await fn(tt, level);
    });
}

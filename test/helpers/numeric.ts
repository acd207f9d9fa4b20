// Deterministic inputs for the numeric kernel tests (cpu-small-linear, cpu-attention, cpu-sampler).
import { xorshift32 } from '../../lib/util/data.js';

/** A seeded uniform stream in [0, 1) (xorshift32; seed 0 is taken as 1, which xorshift needs). */
export const rng = (seed: number): (() => number) => xorshift32(seed >>> 0 || 1);

/** n seeded uniform values in [-scale, scale). */
export function uniform(n: number, seed: number, scale = 1): Float32Array {
  const r = rng(seed);
  return Float32Array.from({ length: n }, () => (r() - 0.5) * 2 * scale);
}

/** float32 -> the nearest bfloat16 (ties to even), as a float32 value. */
export function toBf16(v: Float32Array): Float32Array {
  const u = new Uint32Array(v.buffer.slice(0));
  for (let i = 0; i < u.length; i++) u[i] = ((u[i] + 0x7fff + ((u[i] >>> 16) & 1)) >>> 0) & 0xffff0000;
  return new Float32Array(u.buffer);
}

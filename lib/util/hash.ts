/** A seeded uniform in [0, 1) from integers (splitmix-style): per-rollout temperatures and top-p, the demo's question styles. */
export function hashUniform(...xs: number[]): number {
  let h = 0x9e3779b9;
  for (const x of xs) {
    h ^= Math.imul(x | 0, 0x85ebca6b) + 0x6b43a9b5 + (h << 6) + (h >>> 2);
    h = Math.imul(h ^ (h >>> 15), 0x2c1b3c6d);
    h ^= h >>> 12;
  }
  return (h >>> 0) / 4294967296;
}

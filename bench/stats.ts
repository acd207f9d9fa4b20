/**
 * The median of a list of timings: the middle value, or the mean of the two middle values when the
 * count is even (numpy's convention). One definition for every bench, so two
 * figures of the same run are never medians by different rules.
 */
export function median(xs: readonly number[]): number {
  if (xs.length === 0) throw new Error('median of no values');
  const s = [...xs].sort((a, b) => a - b);
  const h = s.length >> 1;
  return s.length % 2 ? s[h] : (s[h - 1] + s[h]) / 2;
}

/**
 * The harmonic mean: the rate of the mean time when each value is a rate over the same work (two
 * passes' tokens/s), or the bandwidth at which the mean of two memory bounds is read. One definition
 * for the benches' passes, rounds and rollout reads.
 */
export function harmonicMean(xs: readonly number[]): number {
  if (xs.length === 0) throw new Error('harmonic mean of no values');
  return xs.length / xs.reduce((s, x) => s + 1 / x, 0);
}

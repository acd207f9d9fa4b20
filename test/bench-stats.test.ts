// The benches' one median (bench/stats.ts): every bench figure that is "the median of N runs" uses it,
// so an even count of runs is the mean of the middle two everywhere (before, five bench programs took the
// upper middle, bench/train.ts the mean).
import t from 'tap';
import { harmonicMean, median } from '../bench/stats.js';

t.test('odd counts: the middle value, whatever the order', async (t) => {
  t.equal(median([3]), 3);
  t.equal(median([5, 1, 3]), 3);
  t.equal(median([9, 2, 7, 4, 100]), 7);
});

t.test('even counts: the mean of the two middle values, not either of them', async (t) => {
  t.equal(median([1, 2]), 1.5);
  t.equal(median([10, 1, 4, 2]), 3);
});

t.test('the input is left unsorted, and no values is an error, not NaN', async (t) => {
  const xs = [3, 1, 2];
  median(xs);
  t.same(xs, [3, 1, 2]);
  t.throws(() => median([]), /median of no values/);
});

t.test('the harmonic mean: the rate of the mean time, the bandwidth of the mean memory bound', async (t) => {
  t.equal(harmonicMean([30, 60]), 40, 'reads of 30 and 60 GB/s: the mean of their bounds is read at 40');
  t.equal(harmonicMean([50, 50]), 50);
  const bytes = 1e9;
  t.ok(Math.abs(bytes / harmonicMean([30, 60]) - (bytes / 30 + bytes / 60) / 2) < 1e-6);
  t.ok(Math.abs(harmonicMean([1, 2, 4]) - 3 / 1.75) < 1e-15, 'any count');
  t.throws(() => harmonicMean([]), /harmonic mean of no values/);
});

// Coded errors for bad input that used to surface as a raw exception or a wrong result.
import t from 'tap';
import { BM25 } from '../lib/retrieval/bm25.js';
import { configFromObject } from '../lib/config/load.js';

t.test('BM25 refuses parameters that would make a posting score <= 0 (its accumulator takes 0 for untouched)', async (t) => {
  t.throws(() => new BM25(['a b'], 1.2, 1.5), { code: 'ARGUMENT_INVALID', message: /k1 >= 0 and 0 <= b <= 1, found k1 1.2, b 1.5/ });
  t.throws(() => new BM25(['a b'], -1, 0.75), { code: 'ARGUMENT_INVALID' });
  t.same(
    new BM25(['a b', 'c'], 0, 0).search('a', 5).map((h) => h.doc ?? h),
    new BM25(['a b', 'c']).search('a', 5).map((h) => h.doc ?? h),
    'the edges k1 0, b 0 are accepted',
  );
});

t.test('configFromObject: a value that cannot be copied is CONFIG_INVALID saying what to pass instead', async (t) => {
  t.throws(() => configFromObject({ stage: 'sft', model: { path: 'm' }, reward: { fn: () => 1 } }), {
    code: 'CONFIG_INVALID',
    message: /cannot be copied.*\{ reward, tools \} options/,
  });
});

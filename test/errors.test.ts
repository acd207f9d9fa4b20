import t from 'tap';
import { SlmError, closest, describe as describeValue, editDistance } from '../lib/errors.js';

t.test('closest suggests near misspellings and nothing for unrelated words', async (t) => {
  t.equal(closest('lerning_rate', ['learning_rate', 'batch_size']), 'learning_rate');
  t.equal(closest('zzz', ['learning_rate', 'batch_size']), undefined);
  t.equal(editDistance('kitten', 'sitting'), 3);
});

t.test('SlmError carries a code and describe names the type', async (t) => {
  const e = new SlmError('CONFIG_INVALID', 'bad');
  t.equal(e.code, 'CONFIG_INVALID');
  t.ok(e instanceof Error);
  t.equal(describeValue(-1), '-1 (number)');
  t.equal(describeValue('x'), '"x" (string)');
});

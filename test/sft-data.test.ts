import t from 'tap';
import { readFileSync } from 'node:fs';
import { ChatFormatter } from '../lib/model/chat.js';
import { qwen3Tokenizer } from '../lib/model/tokenizer.js';
import { batchByLength, readSftRows, tokenizeConversation } from '../lib/train/sft-data.js';
import { dataFile, fixture } from './helpers/shared.js';

const fmt = new ChatFormatter(readFileSync(fixture('qwen3-tokenizer', 'chat_template.jinja'), 'utf8'), { eosToken: '<|im_end|>' });
const tok = qwen3Tokenizer();

t.test('the loss mask covers exactly the assistant turns and their end-of-turn token', async (t) => {
  const messages = [
    { role: 'system' as const, content: 'S' },
    { role: 'user' as const, content: 'Q?' },
    { role: 'assistant' as const, content: '<python>print(1)</python>' },
    { role: 'user' as const, content: '<python_output>1</python_output>' },
    { role: 'assistant' as const, content: '<answer>1</answer>' },
  ];
  const ex = tokenizeConversation(messages, fmt, tok);
  t.equal(ex.ids.length, ex.mask.length);
  const trained = tok.decode(ex.ids.filter((_, i) => ex.mask[i]));
  t.equal(trained, '<python>print(1)</python><|im_end|><answer>1</answer><|im_end|>');
  t.equal(tok.decode(ex.ids), fmt.render(messages), 'pieces tokenized separately decode to the whole render');
  const untrained = tok.decode(ex.ids.filter((_, i) => !ex.mask[i]));
  t.match(untrained, /<python_output>1<\/python_output>/, 'tool output is not trained');
  t.notMatch(untrained, /<answer>/);
});

t.test('the 81 reference trajectories tokenize with masks on assistant text only', async (t) => {
  const rows = readSftRows(dataFile('seed-sft', 'trajectories.jsonl'));
  t.equal(rows.length, 81);
  t.equal(rows.filter((r) => r.in_test_split).length, 19);
  let assistantChars = 0;
  for (const [i, r] of rows.entries()) {
    const ex = tokenizeConversation(r.messages, fmt, tok, i);
    const trained = tok.decode(ex.ids.filter((_, k) => ex.mask[k]));
    const expected = r.messages.filter((m) => m.role === 'assistant').map((m) => m.content + '<|im_end|>').join('');
    if (trained !== expected) t.fail(`row ${i}: trained text differs`);
    assistantChars += expected.length;
  }
  t.ok(assistantChars > 1000);
  const b = batchByLength(rows.map((r, i) => tokenizeConversation(r.messages, fmt, tok, i)), 8);
  t.equal(b.flat().length, 81);
  t.ok(b.every((x) => x.length <= 8));
});

t.test('bad rows give DATA_INVALID with the row number', async (t) => {
  const dir = t.testdir({ 'bad.jsonl': '{"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]}\n', 'noasst.jsonl': '{"messages": [{"role": "user", "content": "hi"}]}\n' });
  t.throws(() => readSftRows(`${dir}/bad.jsonl`), { code: 'DATA_INVALID', message: /row 1, message 2.*"robot"/ });
  t.throws(() => readSftRows(`${dir}/noasst.jsonl`), { code: 'DATA_INVALID', message: /no assistant message/ });
  t.throws(() => readSftRows(`${dir}/missing.jsonl`), { code: 'FILE_NOT_FOUND' });
});

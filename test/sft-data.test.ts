import t from 'tap';
import { readFileSync } from 'node:fs';
import { ChatFormatter } from '../lib/model/chat.js';
import { qwen3Tokenizer } from '../lib/model/tokenizer.js';
import { batchByLength, fitContext, readSftRows, sftPrompts, tokenizeConversation } from '../lib/train/sft/sft-data.js';
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
    const expected = r.messages
      .filter((m) => m.role === 'assistant')
      .map((m) => m.content + '<|im_end|>')
      .join('');
    if (trained !== expected) t.fail(`row ${i}: trained text differs`);
    assistantChars += expected.length;
  }
  t.ok(assistantChars > 1000);
  const b = batchByLength(
    rows.map((r, i) => tokenizeConversation(r.messages, fmt, tok, i)),
    8,
  );
  t.equal(b.flat().length, 81);
  t.ok(b.every((x) => x.length <= 8));
});

t.test('bad rows give DATA_INVALID with the row number', async (t) => {
  const dir = t.testdir({
    'bad.jsonl': '{"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]}\n',
    'noasst.jsonl': '{"messages": [{"role": "user", "content": "hi"}]}\n',
  });
  t.throws(() => readSftRows(`${dir}/bad.jsonl`), { code: 'DATA_INVALID', message: /row 1, message 2.*"robot"/ });
  t.throws(() => readSftRows(`${dir}/noasst.jsonl`), { code: 'DATA_INVALID', message: /no assistant message/ });
  t.throws(() => readSftRows(`${dir}/missing.jsonl`), { code: 'FILE_NOT_FOUND' });
});

t.test('conversations over max_context are truncated (loss on what fits), not dropped', async (t) => {
  const ex = (n: number, trainedFrom: number, row: number) => ({
    ids: Array.from({ length: n }, (_, i) => i + 1),
    mask: Array.from({ length: n }, (_, i) => (i >= trainedFrom ? 1 : 0)),
    row,
  });
  const r = fitContext([ex(5, 2, 0), ex(12, 4, 1), ex(12, 9, 2)], 8);
  t.same([r.truncated, r.dropped], [1, 1]);
  t.same(
    r.examples.map((e) => e.row),
    [0, 1],
    'the one whose assistant tokens all lie past the limit is dropped',
  );
  t.same(r.examples[1].ids, [1, 2, 3, 4, 5, 6, 7, 8]);
  t.same(r.examples[1].mask, [0, 0, 0, 0, 1, 1, 1, 1], 'the loss covers the assistant tokens within the limit');
  t.same(r.examples[0], ex(5, 2, 0), 'short ones pass through unchanged');
  t.throws(() => fitContext([], 1), { code: 'ARGUMENT_INVALID' });
  // The reference trajectories at the reference's 3,000 tokens: none dropped whole any more.
  const rows = readSftRows(dataFile('seed-sft', 'trajectories.jsonl')).filter((x) => !x.in_test_split);
  const all = rows.map((x, i) => tokenizeConversation(x.messages, fmt, tok, i));
  const long = all.filter((e) => e.ids.length > 3000).length;
  const fit = fitContext(all, 3000);
  t.ok(long > 0, `${long} of the ${rows.length} training trajectories are longer than 3,000 tokens`);
  t.equal(fit.truncated + fit.dropped, long);
  t.equal(
    fit.examples.length,
    rows.length - fit.dropped,
    `kept ${fit.examples.length} (truncated ${fit.truncated}, dropped ${fit.dropped})`,
  );
  t.ok(fit.examples.every((e) => e.ids.length <= 3000 && e.mask.some((m) => m)));
});

t.test('the prompts the SFT conversations carry: the system message and the final-turn reminder', async (t) => {
  const rows = readSftRows(dataFile('seed-sft', 'trajectories.jsonl')).filter((x) => !x.in_test_split);
  const p = sftPrompts(rows);
  t.equal(p.rows, 62);
  t.equal(p.systemRows, 62, 'every training trajectory has the same system prompt');
  t.match(p.system!, /^Answer questions using Python code to search Wikipedia\./);
  t.match(p.system!, /You have 2 turns/);
  t.match(p.finalTurn!, /^\[FINAL TURN\] You MUST provide your answer NOW/);
  t.ok(p.finalTurnRows >= 55, `${p.finalTurnRows} rows end with the reminder`);
  // Majority and agreement counts on a mixed set; a one-turn conversation has no reminder.
  const conv = (s: string, notice?: string) => ({
    messages: [
      { role: 'system' as const, content: s },
      { role: 'user' as const, content: 'Question: q' },
      ...(notice
        ? [
            { role: 'assistant' as const, content: '<python>x</python>' },
            { role: 'user' as const, content: '<python_output>\n1\n</python_output>' },
            { role: 'user' as const, content: notice },
          ]
        : []),
      { role: 'assistant' as const, content: '<answer>a</answer>' },
    ],
  });
  const q = sftPrompts([conv('A', 'N1'), conv('B', 'N1'), conv('A'), conv('A', 'N2')]);
  t.same([q.system, q.systemRows, q.finalTurn, q.finalTurnRows, q.rows], ['A', 3, 'N1', 2, 4]);
  t.same(
    sftPrompts([
      {
        messages: [
          { role: 'user', content: 'q' },
          { role: 'assistant', content: 'a' },
        ],
      },
    ]),
    { system: null, systemRows: 0, finalTurn: null, finalTurnRows: 0, rows: 1 },
  );
});

t.test('retrieved passages inside an assistant message (Search-R1 trajectories) are not trained on', async (t) => {
  const info = '\n\n<information>Doc 1(Title: Paris) Paris is the capital of France.</information>\n\n';
  const messages = [
    { role: 'user' as const, content: 'Question: capital of France?' },
    {
      role: 'assistant' as const,
      content: `<think>I should search.</think>\n<search>capital of France</search>${info}<answer>Paris</answer>`,
    },
  ];
  const ex = tokenizeConversation(messages, fmt, tok);
  const trained = tok.decode(ex.ids.filter((_, i) => ex.mask[i]));
  t.equal(
    trained,
    '<think>I should search.</think>\n<search>capital of France</search><answer>Paris</answer><|im_end|>',
    "the model's own text only",
  );
  t.equal(tok.decode(ex.ids), fmt.render(messages), 'the whole conversation is still there');
  // The passages are tokenized on their own, as the runner encodes an inline reply.
  const infoIds = tok.encode(info);
  const at = ex.ids.findIndex((_, i) => infoIds.every((x, j) => ex.ids[i + j] === x));
  t.ok(at > 0, 'the information block appears as its own tokens');
  t.ok(
    infoIds.every((_, j) => ex.mask[at + j] === 0),
    'all of them masked',
  );
  // Two searches: both blocks masked; inline program output likewise.
  const two = tokenizeConversation(
    [
      { role: 'user', content: 'q' },
      { role: 'assistant', content: `<search>a</search>${info}<search>b</search>${info}<answer>x</answer>` },
    ],
    fmt,
    tok,
  );
  t.equal(tok.decode(two.ids.filter((_, i) => two.mask[i])), '<search>a</search><search>b</search><answer>x</answer><|im_end|>');
  const code = tokenizeConversation(
    [
      { role: 'user', content: 'q' },
      { role: 'assistant', content: '<python>print(1)</python>\n<python_output>\n1\n</python_output>\n<answer>1</answer>' },
    ],
    fmt,
    tok,
  );
  t.equal(tok.decode(code.ids.filter((_, i) => code.mask[i])), '<python>print(1)</python><answer>1</answer><|im_end|>');
});

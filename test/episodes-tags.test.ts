// Search-R1's protocol: parsing, the `Doc i(Title: …) text` passages, the invalid-action note,
// the instruction, and the protocol bound to a passage search.
import t from 'tap';
import {
  formatInformation,
  formatPassages,
  parseTagsTurn,
  SEARCH_R1_INSTRUCTION,
  tagsFeedback,
  tagsInstruction,
  tagsProtocol,
} from '../lib/episodes/index.js';
import { SlmError } from '../lib/errors.js';
import { validateConfig } from '../lib/config/load.js';

t.test('search and answer actions', async (t) => {
  const text = '<think>I need the capital.</think>\n<search> capital of France </search>';
  t.same(parseTagsTurn(text), { kind: 'search', query: 'capital of France', end: text.length });
  t.same(parseTagsTurn('<think>ok</think> <answer> Beijing </answer>'), { kind: 'answer', answer: 'Beijing', end: 44 });
});

t.test("several actions: the first complete one wins (as Search-R1's re.search)", async (t) => {
  t.equal(parseTagsTurn('<search>a</search><answer>b</answer>').kind, 'search');
  const two = parseTagsTurn('<answer>x</answer> <answer>y</answer>');
  t.same(two, { kind: 'answer', answer: 'x', end: 18 });
  // an unclosed <search> is skipped, like the regex does
  t.same(parseTagsTurn('<search> what is <answer>Paris</answer>'), { kind: 'answer', answer: 'Paris', end: 39 });
});

t.test('text after the action is not part of it', async (t) => {
  const r = parseTagsTurn('<search>eiffel tower height</search>\n<information>made up</information>');
  t.same(r, { kind: 'search', query: 'eiffel tower height', end: '<search>eiffel tower height</search>'.length });
});

t.test('unclosed, truncated, empty, none', async (t) => {
  t.same(parseTagsTurn('<think>hmm</think><search>eiffel tow'), { kind: 'none', reason: 'unclosed', open: 'search' });
  t.same(parseTagsTurn('<answer>Paris'), { kind: 'none', reason: 'unclosed', open: 'answer' });
  t.same(parseTagsTurn('<search>  </search>'), { kind: 'none', reason: 'empty_query' });
  t.same(parseTagsTurn('<answer></answer>'), { kind: 'answer', answer: '', end: 17 });
  t.same(parseTagsTurn('The answer is Paris.'), { kind: 'none', reason: 'no_action' });
  t.same(parseTagsTurn('<think>I will <search>x</search> maybe'), { kind: 'none', reason: 'unclosed', open: 'think' });
});

t.test('<think> blocks are ignored for parsing', async (t) => {
  const text = '<think>Should I <answer>guess</answer>? No: <search>q1</search></think><search>q2</search>';
  t.same(parseTagsTurn(text), { kind: 'search', query: 'q2', end: text.length });
});

t.test('passages as Search-R1 formats them', async (t) => {
  const ps = [
    { title: 'Paris', text: 'Paris is the capital of France.' },
    { title: 'Eiffel\nTower', text: '  The tower is 330 m tall.\n' },
  ];
  t.equal(formatPassages(ps), 'Doc 1(Title: Paris) Paris is the capital of France.\nDoc 2(Title: Eiffel Tower) The tower is 330 m tall.');
  t.equal(formatInformation(ps), `\n\n<information>${formatPassages(ps)}</information>\n\n`);
  t.equal(formatInformation([]), '\n\n<information>No passages matched the query.</information>\n\n');
});

t.test('invalid action note', async (t) => {
  const n = tagsFeedback({ kind: 'none', reason: 'no_action' });
  t.match(n, /^\nMy previous action is invalid\./);
  t.match(n, /between <search> and <\/search>/);
  t.match(n, /between <answer> and <\/answer>/);
  t.match(tagsFeedback({ kind: 'none', reason: 'empty_query' }), /query was empty/);
});

t.test('instruction', async (t) => {
  const p = tagsInstruction('who wrote Hamlet?');
  for (const s of [
    '<think>',
    '</think>',
    '<search> query </search>',
    '<information>',
    '</information>',
    '<answer>',
    '</answer>',
    '<answer> Beijing </answer>',
  ])
    t.ok(p.includes(s), s);
  t.ok(p.endsWith('Question: who wrote Hamlet?\n'));
});

t.test('tags protocol over a passage search', async (t) => {
  const asked: Array<[string, number | undefined]> = [];
  const search = {
    searchPassages(q: string, k?: number) {
      asked.push([q, k]);
      if (q === 'broken') throw new Error('index file unreadable');
      if (q === 'bad') throw new SlmError('ARGUMENT_INVALID', 'search expects a non-empty text query');
      return [{ page_id: 'p', title: 'Paris', text: 'Capital of France.', score: 1 }];
    },
  };
  const p = tagsProtocol({ search, topK: 2 });
  t.equal(p.injection, 'inline');
  t.same(p.stopStrings, ['</search>', '</answer>']);
  const msgs = p.initialMessages('Q?', 3);
  t.same(
    msgs.map((m) => m.role),
    ['user'],
  );
  t.ok(msgs[0].content.endsWith('Question: Q?\n'));
  const ctx = { turn: 1, maxTurns: 3, finishReason: 'stop_string' as const, maxNewTokens: 64 };
  const r = await p.respond({ kind: 'search', query: 'paris', end: 0 }, ctx);
  t.equal(r.text, '\n\n<information>Doc 1(Title: Paris) Capital of France.</information>\n\n');
  t.same(asked, [['paris', 2]]);
  t.equal(r.calls.length, 1);
  t.match(r.calls[0], { turn: 1, name: 'search', args: ['paris'], ok: true, results: 1 });
  // a query the index rejects is shown to the model; a broken index is an error of the run
  const bad = await p.respond({ kind: 'search', query: 'bad', end: 0 }, ctx);
  t.match(bad.text, /<information>The search failed: search expects a non-empty text query<\/information>/);
  t.equal(bad.calls[0].ok, false);
  await t.rejects(p.respond({ kind: 'search', query: 'broken', end: 0 }, ctx), /index file unreadable/);
  const none = await p.respond({ kind: 'none', reason: 'no_action' }, ctx);
  t.match(none.text, /My previous action is invalid/);
  t.same(none.calls, []);
  // chat mode: the same text as a message
  const chat = tagsProtocol({ search, mode: 'chat', envRole: 'tool', systemPrompt: 'S' });
  t.same(
    chat.initialMessages('Q?', 2).map((m) => m.role),
    ['system', 'user'],
  );
  const cr = await chat.respond({ kind: 'search', query: 'paris', end: 0 }, ctx);
  t.same(cr.messages, [{ role: 'tool', content: '<information>Doc 1(Title: Paris) Capital of France.</information>' }]);
  t.throws(() => tagsProtocol({} as never), { code: 'ARGUMENT_INVALID' });
});

// Search-R1's make_prefix (scripts/data_process/nq_search.py, template_type base), copied here by hand
// so that a change to the default template shows.
const MAKE_PREFIX = (question: string) =>
  `Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get new information. After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> and it will return the top searched results between <information> and </information>. You can search as many times as your want. If you find no further external knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: ${question}\n`;

t.test("the default instruction is Search-R1's template, word for word", async (t) => {
  t.equal(tagsInstruction('who wrote Hamlet?'), MAKE_PREFIX('who wrote Hamlet?'));
  t.equal(SEARCH_R1_INSTRUCTION, MAKE_PREFIX('{question}'));
  // the question is put in literally (no $-patterns of String.replace)
  t.equal(tagsInstruction('what costs $& or $1?'), MAKE_PREFIX('what costs $& or $1?'));
  const search = { searchPassages: () => [] };
  t.same(tagsProtocol({ search }).initialMessages('who wrote Hamlet?', 3), [{ role: 'user', content: MAKE_PREFIX('who wrote Hamlet?') }]);
});

t.test("a configured template; a row's own chat prompt is used as it is", async (t) => {
  const search = { searchPassages: () => [] };
  const custom = tagsProtocol({ search, instruction: 'Q: {question}\nSearch with <search>, answer with <answer>. ({question})' });
  t.same(custom.initialMessages('why?', 2), [{ role: 'user', content: 'Q: why?\nSearch with <search>, answer with <answer>. (why?)' }]);
  t.same(tagsProtocol({ search, instruction: (q) => `fn ${q}` }).initialMessages('x', 2), [{ role: 'user', content: 'fn x' }]);
  t.throws(() => tagsProtocol({ search, instruction: 'Answer the question.' }), {
    code: 'ARGUMENT_INVALID',
    message: /contain \{question\}/,
  });
  // A Search-R1 processed row's prompt: exactly those messages, no re-wrapping and no system prompt added
  const prompt = [
    { role: 'system' as const, content: 'You are helpful.' },
    { role: 'user' as const, content: MAKE_PREFIX('who wrote Hamlet?').replace('Answer the given', 'Please answer the given') },
  ];
  for (const p of [tagsProtocol({ search }), custom, tagsProtocol({ search, systemPrompt: 'S', mode: 'chat' })]) {
    const msgs = p.initialMessages('who wrote Hamlet?', 2, prompt);
    t.same(msgs, prompt);
    t.not(msgs[0], prompt[0], 'a copy');
  }
  // an empty prompt, or usePrompt false, falls back to the instruction
  t.same(custom.initialMessages('why?', 2, []), custom.initialMessages('why?', 2));
  t.same(tagsProtocol({ search, usePrompt: false }).initialMessages('who wrote Hamlet?', 2, prompt), [
    { role: 'user', content: MAKE_PREFIX('who wrote Hamlet?') },
  ]);
  // turns are counted as Search-R1 counts them unless asked otherwise
  t.equal(tagsProtocol({ search }).turnsCount, 'searches');
  t.equal(tagsProtocol({ search, turnsCount: 'generations' }).turnsCount, 'generations');
  t.throws(() => tagsProtocol({ search, turnsCount: 'turns' as never }), { code: 'ARGUMENT_INVALID' });
});

t.test('config: protocol.instruction, use_data_prompt, turns_count', async (t) => {
  const base = { stage: 'ppo', model: { path: '/m' }, data: { questions: '/q.jsonl', corpus: '/c.jsonl' } };
  const c = validateConfig({ ...base, protocol: { kind: 'tags' } }, 'test');
  t.equal(c.protocol.instruction, SEARCH_R1_INSTRUCTION, "the default is Search-R1's template");
  t.equal(c.protocol.use_data_prompt, true);
  t.equal(c.protocol.turns_count, null, "null: the protocol's own (tags: searches)");
  const mine = validateConfig({ ...base, protocol: { kind: 'tags', instruction: 'Q: {question}', turns_count: 'generations' } }, 'test');
  t.same([mine.protocol.instruction, mine.protocol.turns_count], ['Q: {question}', 'generations']);
  t.throws(() => validateConfig({ ...base, protocol: { kind: 'tags', instruction: 'Answer the question.' } }, 'test'), {
    code: 'CONFIG_INVALID',
    message: /protocol\.instruction: expected a string matching \\\{question\\\}, found "Answer the question\."/,
  });
  t.throws(() => validateConfig({ ...base, protocol: { kind: 'tags', turns_count: 'turns' } }, 'test'), {
    code: 'CONFIG_INVALID',
    message: /protocol\.turns_count: expected one of "searches", "generations" or null/,
  });
});

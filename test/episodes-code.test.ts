// The `code` protocol's pure functions: parsing every edge case of a generated turn, the
// observation format (checked against the reference's real observations), the feedback messages
// and the default system prompt.
import t from 'tap';
import { readFileSync } from 'node:fs';
import {
  codeFeedback,
  errorLine,
  finalTurnNotice,
  formatCodeObservation,
  maskThink,
  parseCodeTurn,
  scanBlocks,
  truncateMiddle,
} from '../lib/episodes/index.js';
import { codeQuestionMessage, codeSystemPrompt } from '../lib/episodes/prompts.js';
import { dataFile, haveShared, needs } from './helpers/shared.js';

const needShared = { skip: needs(!haveShared && 'needs ../shared beside the checkout (fixtures and data)', t) };

t.test('code and answer actions', async (t) => {
  const code = parseCodeTurn('Let me search.\n<python>\nprint(search_pages("x"))\n</python>');
  t.same(code, {
    kind: 'code',
    code: 'print(search_pages("x"))',
    end: 'Let me search.\n<python>\nprint(search_pages("x"))\n</python>'.length,
  });
  t.same(parseCodeTurn('<answer> Paris </answer>'), { kind: 'answer', answer: 'Paris', end: 24 });
  // indentation of the first line survives, only the newline after the tag goes
  t.equal((parseCodeTurn('<python>\n    x = 1\n</python>') as { code: string }).code, '    x = 1');
  t.equal((parseCodeTurn('<python>x = 1</python>') as { code: string }).code, 'x = 1');
});

t.test('an answer inside code is code', async (t) => {
  const text = '<python>\nprint("<answer>x</answer>")\n</python>';
  t.same(parseCodeTurn(text), { kind: 'code', code: 'print("<answer>x</answer>")', end: text.length });
  // ...also when the program is not closed yet (a stop string matched inside it): still no answer
  t.same(parseCodeTurn('<python>\nprint("<answer>x</answer>'), { kind: 'none', reason: 'unclosed', open: 'python' });
  // a line that starts with <answer> ends a program the model forgot to close (no Python line
  // starts with `<`): the shape of one of the reference's own expert trajectories
  const forgot = '<python>\nfor d in directors:\n    print(d)\n</python_output>\n\n<answer>J. Robert Oppenheimer</answer>';
  t.same(parseCodeTurn(forgot), { kind: 'answer', answer: 'J. Robert Oppenheimer', end: forgot.length });
  t.same(parseCodeTurn('<python>\nx = 1\n  <answer>unclosed'), { kind: 'none', reason: 'unclosed', open: 'python' });
  // but an answer before the code is the answer
  const a = parseCodeTurn('<answer>y</answer>\n<python>print(1)</python>');
  t.equal(a.kind, 'answer');
  t.equal((a as { answer: string }).answer, 'y');
});

t.test('unclosed or truncated <python> (the turn hit the token limit)', async (t) => {
  t.same(parseCodeTurn('<python>\nfor r in search_pages("a"):\n    print(r["ti'), { kind: 'none', reason: 'unclosed', open: 'python' });
  t.same(parseCodeTurn('<python>\nx = 1\n<|im_end|>'), { kind: 'none', reason: 'unclosed', open: 'python' });
  const msg = codeFeedback({ kind: 'none', reason: 'unclosed', open: 'python' }, { finishReason: 'length', maxNewTokens: 512 });
  t.match(msg, /not closed with <\/python>/);
  t.match(msg, /limit of 512 tokens/);
  t.match(msg, /did not run/);
  t.notMatch(codeFeedback({ kind: 'none', reason: 'unclosed', open: 'python' }, { finishReason: 'stop_token' }), /limit/);
});

t.test('several answers: the first complete one wins', async (t) => {
  // Generation stops at the first </answer> (a stop string), so first-wins gives the same answer
  // whether or not the generator honours stop strings; the reference's parse_answer takes the first too.
  const a = parseCodeTurn('<answer>first</answer> hmm, actually <answer>second</answer>');
  t.same(a, { kind: 'answer', answer: 'first', end: '<answer>first</answer>'.length });
  // as the reference's regex (<answer>(.*?)</answer>): from the first opening tag to the first closing one
  t.equal((parseCodeTurn('I will give <answer> later.\n<answer>B</answer>') as { answer: string }).answer, 'later.\n<answer>B');
});

t.test('an unclosed <answer> before code does not hide the code', async (t) => {
  const r = parseCodeTurn('My final answer goes in <answer> tags.\n<python>print(1)</python>');
  t.same(r, { kind: 'code', code: 'print(1)', end: 'My final answer goes in <answer> tags.\n<python>print(1)</python>'.length });
  t.same(parseCodeTurn('<answer>Paris'), { kind: 'none', reason: 'unclosed', open: 'answer' });
  t.match(codeFeedback({ kind: 'none', reason: 'unclosed', open: 'answer' }), /<answer>your answer<\/answer>/);
});

t.test('text after the answer is not part of it', async (t) => {
  const text = '<answer>Copenhagen</answer>\n\nI hope this helps! <python_output>fake</python_output>';
  const r = parseCodeTurn(text);
  t.same(r, { kind: 'answer', answer: 'Copenhagen', end: '<answer>Copenhagen</answer>'.length });
  // text after code (a hallucinated output block) is likewise left out: `end` marks where the action stops
  const c = parseCodeTurn('<python>print(1)</python>\n<python_output>\n1\n</python_output>\n<answer>1</answer>');
  t.equal(c.kind, 'code');
  t.equal((c as { end: number }).end, '<python>print(1)</python>'.length);
});

t.test('empty answer and empty code', async (t) => {
  t.same(parseCodeTurn('<answer></answer>'), { kind: 'answer', answer: '', end: 17 });
  t.same(parseCodeTurn('<answer>  \n </answer>'), { kind: 'answer', answer: '', end: 21 });
  t.same(parseCodeTurn('<python>\n   \n</python>'), { kind: 'none', reason: 'empty_code' });
  t.match(codeFeedback({ kind: 'none', reason: 'empty_code' }), /empty/);
});

t.test('no action at all', async (t) => {
  t.same(parseCodeTurn('I think the answer is Paris.'), { kind: 'none', reason: 'no_action' });
  t.same(parseCodeTurn(''), { kind: 'none', reason: 'no_action' });
  t.same(parseCodeTurn('```python\nprint(1)\n```'), { kind: 'none', reason: 'no_action' });
  const msg = codeFeedback({ kind: 'none', reason: 'no_action' });
  t.match(msg, /<python>\.\.\.<\/python>/);
  t.match(msg, /<answer>\.\.\.<\/answer>/);
});

t.test('<think> blocks are ignored for parsing', async (t) => {
  const text = '<think>\nMaybe <answer>Rome</answer>? Or run <python>x</python>.\n</think>\n\n<answer>Paris</answer>';
  t.same(parseCodeTurn(text), { kind: 'answer', answer: 'Paris', end: text.length });
  // a think block opened by the prompt: only its closing tag is generated
  t.equal((parseCodeTurn('reasoning <answer>no</answer>\n</think>\n<python>print(2)</python>') as { code: string }).code, 'print(2)');
  // an unclosed think hides everything after it
  t.same(parseCodeTurn('<think>\nI should write <python>print(1)</python>'), { kind: 'none', reason: 'unclosed', open: 'think' });
  t.match(codeFeedback({ kind: 'none', reason: 'unclosed', open: 'think' }), /close it with <\/think>/);
  // an action before a think block is found
  t.equal(parseCodeTurn('<python>a=1</python><think>x').kind, 'code');
  // masking keeps character positions
  const m = maskThink('a<think>bc</think>d');
  t.equal(m.masked, 'a' + ' '.repeat(17) + 'd');
  t.equal(m.unclosedAt, -1);
});

t.test('scanBlocks: opaque vs non-opaque', async (t) => {
  const specs = [{ tag: 'python', opaque: true }, { tag: 'answer' }];
  t.same(scanBlocks('<python>a', specs), { found: false, open: 'python', openAt: 0 });
  t.same(scanBlocks('x <answer>a', specs), { found: false, open: 'answer', openAt: 2 });
  const r = scanBlocks('<answer>a<python>b</python>', specs);
  t.same(r, { found: true, tag: 'python', content: 'b', start: 9, end: 27 });
});

t.test('max turns: the last turn must answer (notice before it)', async (t) => {
  const n = finalTurnNotice();
  t.match(n, /^\[FINAL TURN\]/);
  t.match(n, /<answer>your answer<\/answer>/);
  const p = codeSystemPrompt({ maxTurns: 3 });
  t.match(p, /You have 3 turns/);
  t.match(p, /by turn 3 at the latest/);
  t.match(codeSystemPrompt({ maxTurns: 1 }), /You have 1 turn\./);
});

t.test('observation: output, error line, empty output', async (t) => {
  t.equal(formatCodeObservation({ stdout: 'hello\n', error: null, timed_out: false }), '<python_output>\nhello\n\n</python_output>');
  // the error line comes after whatever was printed (the reference dropped the printed part)
  t.equal(
    formatCodeObservation({ stdout: 'found 3 pages\n', error: "NameError: name 'x' is not defined", timed_out: false }),
    "<python_output>\nfound 3 pages\nError: NameError: name 'x' is not defined\n</python_output>",
  );
  t.equal(
    formatCodeObservation({ stdout: 'partial', error: 'ValueError: bad', timed_out: false }),
    '<python_output>\npartial\nError: ValueError: bad\n</python_output>',
  );
  t.equal(
    formatCodeObservation({ stdout: '', error: null, timed_out: true }),
    '<python_output>\nError: TimeoutError: the program ran past the time limit and was stopped\n</python_output>',
  );
  t.equal(
    errorLine({ stdout: '', error: 'TimeoutError: the program exceeded the time limit of 10 s', timed_out: true }),
    'Error: TimeoutError: the program exceeded the time limit of 10 s',
  );
  t.match(
    formatCodeObservation({ stdout: '', error: null, timed_out: false }),
    /^<python_output>\n\(the program printed nothing.*\)\n<\/python_output>$/,
  );
  t.equal(
    formatCodeObservation({ stdout: 'x\n', error: null, timed_out: false }, { tags: { code: 'javascript', answer: 'answer' } }),
    '<javascript_output>\nx\n\n</javascript_output>',
  );
});

t.test('observation: the output cap keeps head and tail, never the error line', async (t) => {
  const long = 'A'.repeat(5000) + 'B'.repeat(5000) + '\nSUMMARY: 42\n';
  const capped = truncateMiddle(long, 1000);
  t.ok(capped.startsWith('A'.repeat(400) + '\n\n... ['));
  t.ok(capped.endsWith('B'.repeat(387) + '\nSUMMARY: 42\n'));
  t.match(capped, /\.\.\. \[9213 chars truncated\] \.\.\./);
  t.equal(truncateMiddle('short', 1000), 'short');
  const obs = formatCodeObservation({ stdout: long, error: 'KeyError: 3', timed_out: false }, { maxChars: 1000 });
  t.ok(obs.endsWith('SUMMARY: 42\nError: KeyError: 3\n</python_output>'));
  t.ok(obs.length < 1100);
});

t.test('observations match the reference trajectories exactly', needShared, async (t) => {
  const rows = readFileSync(dataFile('seed-sft', 'trajectories.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { messages: { role: string; content: string }[] });
  const outputs = rows.flatMap((r) =>
    r.messages.filter((m) => m.role === 'user' && m.content.startsWith('<python_output>')).map((m) => m.content),
  );
  t.ok(outputs.length > 50);
  // error-only observation, verbatim
  const err = outputs.find((o) => o.startsWith('<python_output>\nError: '))!;
  t.equal(
    formatCodeObservation({
      stdout: '',
      error: err.slice('<python_output>\nError: '.length, -'\n</python_output>'.length),
      timed_out: false,
    }),
    err,
  );
  // truncated observations: rebuild a program output from the head and tail the reference kept, hide
  // the middle, and format it again: same text, same marker, same cap (6000 chars, 40 % + 40 %)
  let checked = 0;
  for (const o of outputs) {
    const m = /\n\n\.\.\. \[(\d+) chars truncated\] \.\.\.\n\n/.exec(o);
    if (!m) continue;
    const body = o.slice('<python_output>\n'.length, -'\n</python_output>'.length);
    const head = body.slice(0, m.index - '<python_output>\n'.length);
    const tail = body.slice(m.index - '<python_output>\n'.length + m[0].length);
    const stdout = head + 'x'.repeat(Number(m[1])) + tail;
    t.equal(formatCodeObservation({ stdout, error: null, timed_out: false }), o);
    checked++;
  }
  t.ok(checked >= 20, `${checked} truncated observations rebuilt`);
  // every plain observation has the shape <python_output>\n{printed}\n</python_output>
  for (const o of outputs.filter((x) => !x.includes('chars truncated') && !x.startsWith('<python_output>\nError: '))) {
    const printed = o.slice('<python_output>\n'.length, -'\n</python_output>'.length);
    if (printed.trim()) t.equal(formatCodeObservation({ stdout: printed, error: null, timed_out: false }), o);
  }
});

t.test('the reference trajectories parse: code turns, then an answer', needShared, async (t) => {
  const rows = readFileSync(dataFile('seed-sft', 'trajectories.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { messages: { role: string; content: string }[] });
  let answers = 0;
  let codes = 0;
  let cut = 0;
  for (const r of rows) {
    const turns = r.messages.filter((m) => m.role === 'assistant');
    const last = parseCodeTurn(turns[turns.length - 1].content);
    t.equal(last.kind, 'answer');
    const expected = /<answer>([\s\S]*?)<\/answer>/
      .exec(turns[turns.length - 1].content.replace(/<think>[\s\S]*?<\/think>/g, ''))![1]
      .trim();
    t.equal((last as { answer: string }).answer, expected);
    answers++;
    for (const m of turns.slice(0, -1)) {
      const a = parseCodeTurn(m.content);
      if (a.kind === 'code') codes++;
      else {
        // two expert turns were cut at the token limit inside their program
        t.same(a, { kind: 'none', reason: 'unclosed', open: 'python' });
        t.notOk(m.content.includes('</python>'));
        cut++;
      }
    }
  }
  t.equal(answers, rows.length);
  t.equal(
    codes + cut,
    rows.reduce((n, r) => n + r.messages.filter((m) => m.role === 'assistant').length - 1, 0),
  );
  t.equal(cut, 2);
});

t.test('system prompt: functions, turns, tags', async (t) => {
  const p = codeSystemPrompt({ maxTurns: 2 });
  for (const s of [
    'search_pages(query: str)',
    'view_sections(page_id: str)',
    'read_section(section_id: str)',
    '"page_id:full"',
    're, json, string, Counter, defaultdict',
    '<python>',
    '</python>',
    '<python_output>',
    '<answer>',
    'You have 2 turns',
  ])
    t.ok(p.includes(s), s);
  // the example in the prompt is itself well-formed for the parser
  const example = p.slice(p.indexOf('EXAMPLE:'), p.indexOf('RULES:'));
  t.equal(parseCodeTurn(example).kind, 'code');
  const js = codeSystemPrompt({ maxTurns: 2, language: 'javascript' });
  t.match(js, /console\.log/);
  t.match(js, /writing JavaScript code/);
  t.equal(codeQuestionMessage('Who?'), 'Question: Who?');
});

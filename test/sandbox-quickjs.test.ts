// The QuickJS sandbox: the same three primitives for JavaScript programs, with time, memory and stack
// limits, and no handle leaks (QuickJS aborts on dispose if one leaked: many programs, failing ones
// included, must run and dispose cleanly).
import t, { type Test } from 'tap';
import { SlmError } from '../lib/errors.js';
import { createSandbox } from '../lib/sandbox/index.js';
import { createQuickJSSandbox, type QuickJSSandbox } from '../lib/sandbox/quickjs.js';
import type { SearchTools } from '../lib/sandbox/types.js';
import { truncationMarker } from '../lib/sandbox/types.js';

const tools: SearchTools = {
  search_pages: (q) => [{ page_id: 'kate_box', title: `Kate Box (${q})`, similarity: 0.91 }],
  view_sections: (p) => {
    if (p !== 'kate_box') throw new SlmError('NOT_FOUND', `Page not found: ${p}`);
    return [{ section_id: 'kate_box:career', section_name: 'Career' }];
  },
  read_section: async (s) => {
    await new Promise((res) => setTimeout(res, 2));
    if (s !== 'kate_box:career') throw new SlmError('NOT_FOUND', `Section not found: ${s}`);
    return 'In 2003, Box graduated from NIDA.';
  },
};

let sb: QuickJSSandbox;
t.before(async () => {
  sb = await createQuickJSSandbox({ tools, timeoutMs: 3000 });
});
t.teardown(() => sb?.close());

async function healthy(t: Test) {
  const r = await sb.run('console.log(6 * 7, search_pages("q")[0].page_id)');
  t.same([r.stdout, r.error, r.timed_out], ['42 kate_box\n', null, false], 'the next program runs normally');
}

t.test('console.log is captured and values are shown as JSON', async (t) => {
  const r = await sb.run('console.log("a", 1, true, null, {x: [1, "y"]}); print("b"); console.error(new Error("e"))');
  t.same(r, {
    stdout: 'a 1 true null {"x":[1,"y"]}\nb\nError: e\n',
    error: null,
    timed_out: false,
    calls: [],
    truncated: false,
    duration_ms: r.duration_ms,
  });
});

t.test('the primitives are synchronous functions returning JSON values; asynchronous tools too', async (t) => {
  const r = await sb.run(
    'const hits = search_pages("nida");\n' +
      'const secs = view_sections(hits[0].page_id);\n' +
      'console.log(hits[0].title, hits[0].similarity, secs[0].section_name, read_section(secs[0].section_id));',
  );
  t.equal(r.error, null);
  t.equal(r.stdout, 'Kate Box (nida) 0.91 Career In 2003, Box graduated from NIDA.\n');
  t.same(
    r.calls.map((c) => [c.name, c.args, c.ok]),
    [
      ['search_pages', ['nida'], true],
      ['view_sections', ['kate_box'], true],
      ['read_section', ['kate_box:career'], true],
    ],
  );
});

t.test('tools work inside promise continuations, after await', async (t) => {
  const r = await sb.run('(async () => { await null; console.log(read_section("kate_box:career").length); })()');
  t.equal(r.error, null);
  t.equal(r.stdout, '33\n');
});

t.test("a tool's error is an Error the program can catch; uncaught, it is the result's error", async (t) => {
  const r = await sb.run('try { read_section("x:y") } catch (e) { console.log("caught", e.message) }\nview_sections("nope")');
  t.equal(r.stdout, 'caught Section not found: x:y\n');
  t.equal(r.error, 'Error: Page not found: nope');
  const bad = await sb.run('search_pages(5)');
  t.match(bad.error, /^TypeError: search_pages\(query\) expects one string argument/);
});

t.test('errors keep the output printed before them', async (t) => {
  const r = await sb.run('console.log(1)\nundefinedName + 1');
  t.same([r.stdout, r.error], ['1\n', "ReferenceError: 'undefinedName' is not defined"]);
  const s = await sb.run('function (');
  t.match(s.error, /^SyntaxError: /);
  const thrown = await sb.run('throw "plain string"');
  t.equal(thrown.error, 'Uncaught "plain string"');
});

t.test('an infinite loop is stopped at the time limit', async (t) => {
  const r = await sb.run('console.log("started"); while (true) {}', { timeoutMs: 500 });
  t.same([r.timed_out, r.stdout], [true, 'started\n']);
  t.match(r.error, /^TimeoutError: the program exceeded the time limit of 0.5 s/);
  await healthy(t);
});

t.test('a program stuck inside a native builtin is stopped too (its thread is replaced)', async (t) => {
  const started = sb.started;
  const r = await sb.run('const a = []; while (true) a.push(new Array(100000).fill(1))', { timeoutMs: 500, memoryMb: 512 });
  t.equal(r.timed_out, true, `reported: ${r.error}`);
  await healthy(t);
  t.ok(sb.started >= started, 'the sandbox has a working thread');
});

t.test('a memory bomb ends at the heap limit', async (t) => {
  const r = await sb.run('let s = "x"; const keep = []; while (true) { s = s.repeat(2); keep.push(s) }', { memoryMb: 32 });
  t.equal(r.error, 'InternalError: out of memory');
  t.equal(r.timed_out, false);
  const arrays = await sb.run('console.log(typeof ArrayBuffer, typeof Uint8Array, typeof DataView)');
  t.equal(arrays.stdout, 'undefined undefined undefined\n', 'no buffers, whose storage would escape the limit');
  await healthy(t);
});

t.test('deep recursion ends at the stack limit', async (t) => {
  const r = await sb.run('function f(n) { return f(n + 1) + 1 } f(0)');
  t.equal(r.error, 'InternalError: stack overflow');
  await healthy(t);
});

t.test('output past the cap is cut and a visible marker appended', async (t) => {
  const r = await sb.run('for (let i = 0; i < 1e5; i++) console.log("x".repeat(99))', { maxOutputChars: 1000 });
  t.equal(r.truncated, true);
  t.equal(r.error, null);
  t.equal(r.stdout, ('x'.repeat(99) + '\n').repeat(10) + truncationMarker(1000));
});

t.test('a program sees no host objects', async (t) => {
  const r = await sb.run('console.log(typeof require, typeof process, typeof fetch, typeof setTimeout, typeof globalThis.__slm_write)');
  t.equal(r.stdout, 'undefined undefined undefined undefined undefined\n');
});

t.test('redefining search_pages affects that program only', async (t) => {
  const a = await sb.run(
    'search_pages = () => [{ page_id: "fake" }]; Object.prototype.evil = 1; console.log(search_pages("x")[0].page_id)',
  );
  t.equal(a.stdout, 'fake\n');
  const b = await sb.run('console.log(search_pages("x")[0].page_id, ({}).evil)');
  t.equal(b.stdout, 'kate_box undefined\n');
});

t.test('globals are bound for one program only, checked before it is queued', async (t) => {
  const question = 'Who founded "Oslo"?\nÅ 😀';
  const r = await sb.run('console.log(question, n + 1, flags, search_pages(question)[0].title)', {
    globals: { question, n: 41, flags: { a: [1, null] } },
  });
  t.equal(r.error, null);
  t.equal(r.stdout, `${question} 42 {"a":[1,null]} Kate Box (${question})\n`);
  t.equal((await sb.run('console.log(typeof question)')).stdout, 'undefined\n', 'the next program does not see them');
  await t.rejects(sb.run('1', { globals: { read_section: 1 } }), { code: 'ARGUMENT_INVALID', message: /would hide the search primitive/ });
  await t.rejects(sb.run('1', { globals: { 'a-b': 1 } }), { code: 'ARGUMENT_INVALID', message: /identifier/ });
});

t.test('final_answer() ends the program with its answer, only where asked for', async (t) => {
  const r = await sb.run(
    'console.log("looking"); try { final_answer(1432) } catch (e) { console.log("caught") } final_answer("second"); console.log("after")',
    { finalAnswer: true },
  );
  t.same([r.error, r.final_answer], [null, '1432'], 'the first call counts, even when the program catches it');
  const inAsync = await sb.run('(async () => { await null; final_answer({a: 1}) })()', { finalAnswer: true });
  t.same([inAsync.error, inAsync.final_answer], [null, '{"a":1}'], 'from a promise continuation too; objects as JSON');
  const off = await sb.run('final_answer("x")');
  t.match(off.error, /ReferenceError: 'final_answer' is not defined/);
  t.equal(off.final_answer, undefined);
  await healthy(t);
});

t.test('the call limit applies', async (t) => {
  const r = await sb.run('for (;;) search_pages("x")', { maxCalls: 5 });
  t.match(r.error, /call limit reached/);
  t.equal(r.calls.length, 6);
});

t.test('many programs, failing ones included, run and dispose cleanly', async (t) => {
  const programs = [
    'console.log(search_pages("a").length)',
    'read_section("missing:x")',
    'syntax error here (',
    'throw new RangeError("r")',
    'let o = {}; for (let i = 0; i < 100; i++) o["k" + i] = view_sections("kate_box"); console.log(Object.keys(o).length)',
    'Promise.reject(new Error("unhandled"))',
    '(async () => { throw new Error("in async") })()',
  ];
  const n = 350;
  const results = [];
  for (let i = 0; i < n; i++) results.push(await sb.run(programs[i % programs.length]));
  t.equal(results.length, n);
  t.equal(results.filter((r) => r.error?.startsWith('SandboxError')).length, 0, 'the interpreter never failed');
  t.same(
    results.slice(0, programs.length).map((r) => r.error === null),
    [true, false, false, false, true, true, true],
  );
  t.equal(results[4].stdout, '100\n');
  await healthy(t);
});

t.test('several threads run programs side by side', async (t) => {
  const two = await createQuickJSSandbox({ tools, size: 2 });
  t.teardown(() => two.close());
  const rs = await Promise.all(Array.from({ length: 6 }, (_, i) => two.run(`console.log(${i} * 2, search_pages("q${i}")[0].title)`)));
  t.same(
    rs.map((r) => r.stdout),
    Array.from({ length: 6 }, (_, i) => `${i * 2} Kate Box (q${i})\n`),
  );
});

t.test('options are checked, and a closed sandbox refuses programs', async (t) => {
  await t.rejects(createQuickJSSandbox({ stackKb: 4 }), { code: 'ARGUMENT_INVALID' });
  await t.rejects(createSandbox({ kind: 'quickjs', stack: 5 } as never), { code: 'CONFIG_UNKNOWN_KEY' });
  const s = await createSandbox({ kind: 'quickjs', tools });
  t.equal((await s.run('console.log(1)')).stdout, '1\n');
  await s.close();
  await t.rejects(s.run('1'), { code: 'SANDBOX_ERROR' });
});

// The Python sandbox pool: what a program sees, what comes back, how the pool manages its workers.
// (Hostile programs: sandbox-hostile.test.ts; the real model-written programs: sandbox-code-blocks.test.ts.)
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { SlmError } from '../lib/errors.js';
import { createSandbox } from '../lib/sandbox/index.js';
import { detectIsolation, runnerPackagePath } from '../lib/sandbox/isolation.js';
import { createPythonPool, type PythonSandboxPool } from '../lib/sandbox/python.js';
import type { SearchTools } from '../lib/sandbox/types.js';
import { truncationMarker } from '../lib/sandbox/types.js';
import { SlmError as SlmErrorClass } from '../lib/errors.js';

const tools: SearchTools = {
  search_pages: (q) => [
    { page_id: 'kate_box', title: 'Kate Box', similarity: 0.91 },
    { page_id: 'q', title: `Query: ${q}`, similarity: 0.5 },
  ],
  view_sections: (p) => {
    if (p !== 'kate_box') throw new SlmErrorClass('NOT_FOUND', `Page not found: ${p}; did you mean kate_box?`);
    return [{ section_id: 'kate_box:career', section_name: 'Career' }];
  },
  read_section: (s) => {
    if (s === 'kate_box:career') return 'In 2003, Box graduated from NIDA.';
    throw new SlmErrorClass('NOT_FOUND', `Section not found: ${s}`);
  },
};

/** Processes (any depth, reparented or not) whose command line carries the pool's tag. */
function taggedPids(tag: string): number[] {
  const out: number[] = [];
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      if (readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(tag)) out.push(Number(pid));
    } catch {
      /* gone meanwhile */
    }
  }
  return out;
}
const tagged = (tag: string) => taggedPids(tag).length;

async function until(cond: () => boolean, ms = 20_000): Promise<boolean> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (cond()) return true;
    await new Promise((res) => setTimeout(res, 20));
  }
  return cond();
}

let pool: PythonSandboxPool;
t.before(async () => {
  pool = await createPythonPool({ tools, size: 2, timeoutMs: 10_000 });
});
t.teardown(() => pool?.close());

t.test('runs a program and returns what it printed', async (t) => {
  const r = await pool.run('print("hello")\nprint(1 + 1)');
  t.same(r, { stdout: 'hello\n2\n', error: null, timed_out: false, calls: [], truncated: false, duration_ms: r.duration_ms });
  t.ok(r.duration_ms >= 0);
});

t.test("the reference's extras are pre-imported", async (t) => {
  const r = await pool.run(
    'print(re.sub("a", "b", "aa"), json.dumps({"a": 1}), string.ascii_lowercase[:3], Counter("aab")["a"], ' +
      'defaultdict(int)["x"], math.floor(2.5), list(itertools.islice(itertools.count(), 3)), collections.deque([1]).pop())',
  );
  t.equal(r.error, null);
  t.equal(r.stdout, 'bb {"a": 1} abc 2 0 2 [0, 1, 2] 1\n');
});

t.test("keeps printed output when the program raises, with the exception's last line", async (t) => {
  const r = await pool.run('print(1)\nprint(2)\nundefined_name + 1\nprint(3)');
  t.equal(r.stdout, '1\n2\n');
  t.equal(r.error, "NameError: name 'undefined_name' is not defined");
  t.equal(r.timed_out, false);
});

t.test('a syntax error names its line, as the reference reported it', async (t) => {
  const r = await pool.run('x = 1\nprint((x\n');
  t.equal(r.error, "SyntaxError: '(' was never closed (line 2)");
  t.equal(r.stdout, '');
});

t.test('the search primitives are proxied to the host and every call is recorded', async (t) => {
  const r = await pool.run(
    'hits = search_pages("who graduated from NIDA")\n' +
      'print(hits[0]["page_id"], hits[0]["similarity"])\n' +
      'secs = view_sections(hits[0]["page_id"])\n' +
      'print(secs[0]["section_id"], "|", read_section(secs[0]["section_id"]))',
  );
  t.equal(r.error, null);
  t.equal(r.stdout, 'kate_box 0.91\nkate_box:career | In 2003, Box graduated from NIDA.\n');
  t.same(
    r.calls.map((c) => [c.name, c.args, c.ok]),
    [
      ['search_pages', ['who graduated from NIDA'], true],
      ['view_sections', ['kate_box'], true],
      ['read_section', ['kate_box:career'], true],
    ],
  );
  for (const c of r.calls) t.ok(c.ms >= 0);
});

t.test("a tool's error reaches the program as a ValueError it can catch", async (t) => {
  const r = await pool.run(
    'try:\n    read_section("kate_box:awards")\nexcept ValueError as e:\n    print("caught:", e)\nview_sections("kate")',
  );
  t.equal(r.stdout, 'caught: Section not found: kate_box:awards\n');
  t.equal(r.error, 'ValueError: Page not found: kate; did you mean kate_box?');
  t.same(
    r.calls.map((c) => c.ok),
    [false, false],
  );
});

t.test('asynchronous tools work, and tools can be given per program', async (t) => {
  const asyncTools: SearchTools = {
    search_pages: async (q) => {
      await new Promise((res) => setTimeout(res, 5));
      return [{ page_id: q.toLowerCase(), title: q, similarity: 1 }];
    },
    view_sections: async () => [],
    read_section: async (s) => `text of ${s}`,
  };
  const r = await pool.run('print(search_pages("Paris")[0]["page_id"], read_section("paris:full"), view_sections("paris"))', {
    tools: asyncTools,
  });
  t.equal(r.error, null);
  t.equal(r.stdout, 'paris text of paris:full []\n');
});

t.test('wrong arguments are a TypeError, as for a Python function', async (t) => {
  const a = await pool.run('search_pages(5)');
  t.match(a.error, /^TypeError: search_pages\(query\) expects a str, got int/);
  const b = await pool.run('search_pages()');
  t.match(b.error, /^TypeError: .*search_pages\(\) missing 1 required positional argument: 'query'/);
  const c = await pool.run('search_pages(query="x"); print("ok")');
  t.equal(c.stdout, 'ok\n', 'the parameter names are those of the reference');
  t.same(a.calls, [], 'a call rejected in the sandbox never reaches the host');
});

t.test('the call limit stops a program that calls tools without end', async (t) => {
  const r = await pool.run('n = 0\nwhile True:\n    search_pages("x")\n    n += 1\n    print(n)', { maxCalls: 3 });
  t.equal(r.stdout, '1\n2\n3\n');
  t.match(r.error, /^RuntimeError: call limit reached: a program may make at most 3 tool calls/);
  t.same(
    r.calls.map((c) => c.ok),
    [true, true, true, false],
  );
});

t.test('text survives both ways: accents, CJK, astral characters', async (t) => {
  const uniTools: SearchTools = { ...tools, read_section: (s) => `naïve ☃ 𝄞 ${s}` };
  const r = await pool.run('print(read_section("東京:full"))\nprint(len("𝄞"))', { tools: uniTools });
  t.equal(r.error, null);
  t.equal(r.stdout, 'naïve ☃ 𝄞 東京:full\n1\n');
  t.same(r.calls[0].args, ['東京:full']);
});

t.test('output past the cap is cut and a visible marker appended', async (t) => {
  const r = await pool.run('print("a" * 30)\nprint("b" * 30)\nraise KeyError("late")', { maxOutputChars: 40 });
  t.equal(r.truncated, true);
  t.equal(r.stdout, 'a'.repeat(30) + '\n' + 'b'.repeat(9) + truncationMarker(40));
  t.ok(r.stdout.endsWith('\n...[output truncated at 40 chars]'));
  t.equal(r.error, "KeyError: 'late'", 'the error is still reported after the cap');
});

t.test('exit(), sys.exit() and os._exit() end the program with an error; output is kept', async (t) => {
  const a = await pool.run('print("before")\nexit()\nprint("after")');
  t.same([a.stdout, a.error], ['before\n', 'SystemExit']);
  const b = await pool.run('import sys\nprint("before")\nsys.exit(3)');
  t.same([b.stdout, b.error], ['before\n', 'SystemExit: 3']);
  const c = await pool.run('import os\nprint("before")\nos._exit(4)');
  t.equal(c.stdout, 'before\n');
  t.match(c.error, /^SystemExit: 4 \(the program ended its process itself/);
  t.equal((await pool.run('print("next")')).stdout, 'next\n');
});

t.test('each program starts in a fresh namespace and an empty working directory', async (t) => {
  const one = await createPythonPool({ tools, size: 1 });
  t.teardown(() => one.close());
  const first = await one.run(
    'x = 41\nimport os, json\nopen("notes.txt", "w").write("x")\nos.mkdir("sub")\n' +
      'json.dumps = lambda *a, **k: "patched"\nsearch_pages = lambda q: "fake"\nprint(sorted(os.listdir(".")), json.dumps(1), search_pages("q"))',
  );
  t.equal(first.stdout, "['notes.txt', 'sub'] patched fake\n");
  const second = await one.run('import os, json\nprint("x" in globals(), os.listdir("."), json.dumps(1), search_pages("q")[0]["page_id"])');
  t.equal(second.error, null);
  t.equal(second.stdout, 'False [] 1 kate_box\n');
  t.equal(second.calls.length, 1, 'the real search_pages answered');
});

t.test("every one of the runner's modules is loaded before a program runs, and sys.path is the interpreter's own", async (t) => {
  // The child drops its uid and installs seccomp before the program: a module of python/slm_sandbox
  // imported lazily there would be read after the lock-down (and may be unreadable by then).
  const r = await pool.run(
    'import sys, json\nprint(json.dumps({"mods": sorted(m for m in sys.modules if m.split(".")[0] == "slm_sandbox"), "path": sys.path}))',
  );
  t.equal(r.error, null, r.error ?? '');
  const seen = JSON.parse(r.stdout) as { mods: string[]; path: string[] };
  const files = readdirSync(runnerPackagePath()).filter((f) => f.endsWith('.py'));
  t.ok(files.length >= 5, `the runner's package holds its modules: ${files.join(' ')}`);
  const expected = files.map((f) => (f === '__init__.py' ? 'slm_sandbox' : `slm_sandbox.${f.slice(0, -3)}`)).sort();
  t.same(seen.mods, expected, 'every module file of python/slm_sandbox is already imported');
  // The runner puts its own folder on sys.path only to import its modules (-I leaves it off).
  const own = spawnSync(pool.isolation.python, ['-I', '-S', '-B', '-c', 'import sys, json; print(json.dumps(sys.path))'], {
    encoding: 'utf8',
  });
  t.equal(own.status, 0, own.stderr);
  t.same(seen.path, JSON.parse(own.stdout), "the program's sys.path is the interpreter's, without the runner's folder");
});

t.test('globals are bound for one program only, checked before it is queued', async (t) => {
  const question = 'Who founded "Oslo"?\nÅ 😀';
  const r = await pool.run('print(question, n + 1, flags, search_pages(question)[1]["title"])', {
    globals: { question, n: 41, flags: { a: [1, null] } },
  });
  t.equal(r.error, null);
  t.equal(r.stdout, `${question} 42 {'a': [1, None]} Query: ${question}\n`);
  const next = await pool.run('print("question" in globals())');
  t.equal(next.stdout, 'False\n', 'the next program does not see them');
  for (const [globals, msg] of [
    [{ 'not a name': 1 }, /identifier/],
    [{ search_pages: 'x' }, /would hide the search primitive/],
    [{ q: () => 1 }, /JSON value/],
  ] as const) {
    await t.rejects(pool.run('print(1)', { globals }), { code: 'ARGUMENT_INVALID', message: msg });
  }
});

t.test('final_answer() ends the program with its answer, only where asked for', async (t) => {
  const r = await pool.run('print("looking")\ntry:\n    final_answer(1432)\nexcept Exception:\n    print("caught")\nprint("after")', {
    finalAnswer: true,
  });
  t.same(
    [r.stdout, r.error, r.final_answer],
    ['looking\n', null, '1432'],
    'ends at the call; except Exception does not catch it; the value as text',
  );
  const swallowed = await pool.run(
    'try:\n    final_answer("first")\nexcept BaseException:\n    pass\nfinal_answer("second")\nraise ValueError("later")',
    { finalAnswer: true },
  );
  t.same([swallowed.final_answer, swallowed.error], ['first', null], 'the first call counts, even when the program catches it');
  const capped = await pool.run('final_answer("x" * 500)', { finalAnswer: true, maxOutputChars: 100 });
  t.equal(capped.final_answer, 'x'.repeat(100), 'capped like the output');
  const off = await pool.run('final_answer("x")');
  t.match(off.error, /NameError: name 'final_answer' is not defined/);
  t.equal(off.final_answer, undefined);
  const none = await pool.run('print(2)', { finalAnswer: true });
  t.same([none.stdout, none.final_answer], ['2\n', undefined], 'a program that does not call it has no answer');
});

t.test('programs run side by side on the workers and each gets its own result', async (t) => {
  const n = 8;
  const results = await Promise.all(
    Array.from({ length: n }, (_, i) => pool.run(`import time\ntime.sleep(0.05)\nprint(${i} * ${i})\nsearch_pages("q${i}")`)),
  );
  t.same(
    results.map((r) => r.stdout),
    Array.from({ length: n }, (_, i) => `${i * i}\n`),
  );
  t.same(
    results.map((r) => r.calls[0].args[0]),
    Array.from({ length: n }, (_, i) => `q${i}`),
  );
});

t.test('a worker killed from outside is replaced and the pool keeps serving', async (t) => {
  const started = pool.started;
  const victim = pool.workerPids()[0];
  process.kill(-victim, 'SIGKILL');
  t.ok(
    await until(() => !pool.workerPids().includes(victim) && pool.workerPids().length === 2),
    'the pool noticed and started a replacement',
  );
  const results = await Promise.all(Array.from({ length: 4 }, (_, i) => pool.run(`print(${i})`)));
  t.same(
    results.map((r) => r.stdout),
    ['0\n', '1\n', '2\n', '3\n'],
  );
  t.ok(pool.started > started, 'a new worker was started');
});

t.test('a worker that stops answering is killed by the host and replaced', async (t) => {
  const one = await createPythonPool({ tools, size: 1 });
  t.teardown(() => one.close());
  const [pid] = one.workerPids();
  // Freeze every process of the worker (bubblewrap puts the runner in a session of its own):
  // only the host's backstop timer can end the program now.
  for (const p of taggedPids(one.tag)) process.kill(p, 'SIGSTOP');
  const r = await one.run('print("never")', { timeoutMs: 300 });
  t.equal(r.timed_out, true);
  t.match(r.error, /^TimeoutError: .*did not answer and was replaced/);
  const next = await one.run('print("after")');
  t.equal(next.stdout, 'after\n');
  t.notOk(one.workerPids().includes(pid));
});

t.test('close() ends every worker process and later runs are refused', async (t) => {
  const p = await createPythonPool({ tools, size: 2 });
  await p.run('print(1)');
  t.ok(tagged(p.tag) >= 2, 'the workers carry the pool tag');
  const pending = p.run('import time\ntime.sleep(30)');
  await new Promise((res) => setTimeout(res, 100));
  await p.close();
  t.equal(tagged(p.tag), 0, 'no process of this pool is left');
  const interrupted = await pending;
  t.match(interrupted.error, /SandboxError: the sandbox worker died/);
  await t.rejects(p.run('print(1)'), { code: 'SANDBOX_ERROR' });
});

t.test('limits and options are checked before anything starts', async (t) => {
  await t.rejects(createPythonPool({ timeoutMs: -1 }), { code: 'ARGUMENT_INVALID', message: /timeoutMs/ });
  await t.rejects(createPythonPool({ memoryMb: 16 }), { code: 'ARGUMENT_INVALID', message: /at least 64/ });
  await t.rejects(pool.run('print(1)', { maxOutputChars: 0 }), { code: 'ARGUMENT_INVALID' });
  await t.rejects(createSandbox({ kind: 'python', timeoutMS: 5 } as never), {
    code: 'CONFIG_UNKNOWN_KEY',
    message: /did you mean "timeoutMs"/,
  });
  await t.rejects(createSandbox({ kind: 'ruby' } as never), { code: 'ARGUMENT_INVALID' });
  await t.rejects(pool.run(42 as never), SlmError);
});

t.test('the isolation report describes this machine consistently', async (t) => {
  const iso = await detectIsolation();
  t.ok(['bwrap', 'unshare', 'rlimits-only'].includes(iso.level));
  t.ok(existsSync(iso.python), 'the real interpreter, not a shim');
  t.same(pool.isolation.level, iso.level);
  // What the report says against what a program can do (not the report's own formula again): it
  // connects to a loopback listener and writes a file in /tmp.
  const listener = createServer((s) => s.destroy());
  await new Promise<void>((r) => listener.listen(0, '127.0.0.1', r));
  const port = (listener.address() as AddressInfo).port;
  const name = join('/tmp', `slm-iso-report-${process.pid}`);
  try {
    const r = await pool.run(
      'import socket\n' +
        `try:\n    socket.create_connection(("127.0.0.1", ${port}), timeout=2).close()\n    print("connected")\nexcept OSError:\n    print("no network")\n` +
        `try:\n    open(${JSON.stringify(name)}, "w").write("x")\n    print("wrote")\nexcept OSError:\n    print("read-only")\n`,
    );
    t.equal(r.error, null);
    const connected = /connected/.test(r.stdout);
    const wrote = /wrote/.test(r.stdout);
    t.equal(
      pool.isolation.network,
      !connected,
      `the report's network isolation (${pool.isolation.network}) is what the program saw: ${r.stdout.trim()}`,
    );
    t.equal(pool.isolation.readonlyFs, !wrote, `the report's read-only filesystem (${pool.isolation.readonlyFs}) is what the program saw`);
    if (pool.isolation.level !== 'rlimits-only')
      t.ok(pool.isolation.network, `${pool.isolation.level} runs programs in their own network namespace`);
    if (pool.isolation.level === 'bwrap') t.ok(pool.isolation.readonlyFs, 'bwrap mounts / read-only');
  } finally {
    listener.close();
    rmSync(name, { force: true });
  }
  t.comment(`isolation: ${iso.level}; ${iso.details}`);
  for (const level of ['unshare', 'rlimits-only'] as const) {
    const lower = await detectIsolation({ maxLevel: level });
    t.ok(['unshare', 'rlimits-only'].includes(lower.level), `asking for at most ${level} gives ${lower.level}`);
  }
});

t.test('the lower isolation levels run programs too', async (t) => {
  for (const maxLevel of ['unshare', 'rlimits-only'] as const) {
    const iso = await detectIsolation({ maxLevel });
    if (iso.level === 'rlimits-only' && !iso.seccomp && !iso.uidDrop) {
      t.comment(`${maxLevel}: nothing to contain programs here; skipped`);
      continue;
    }
    const p = await createPythonPool({ tools, size: 1, maxLevel });
    const r = await p.run('import os\nprint(search_pages("x")[0]["title"], os.getcwd() != "/")');
    t.equal(r.stdout, 'Kate Box True\n', `works at ${p.isolation.level}`);
    await p.close();
    t.equal(tagged(p.tag), 0);
  }
});

t.test('nothing of an earlier program is reachable from the next one: frames, their globals and locals, the heap', async (t) => {
  // Issue 33 row 5: walking sys._getframe() up reached the zygote's frame holding the previous
  // program's message (its code and its globals: the question).
  const one = await createPythonPool({ tools, size: 1 });
  t.teardown(() => one.close());
  const a = await one.run(
    "def alpha_fn_marker():\n    local_secret = ''.join(['TOP', 'SECRET-', str(12345 * 7)])\n    return local_secret\nsecret = alpha_fn_marker()\nprint(secret, question)",
    { globals: { question: 'TOPSECRET-86415 in the question' } },
  );
  t.equal(a.stdout, 'TOPSECRET-86415 TOPSECRET-86415 in the question\n');
  const b = await one.run(
    [
      'import sys, gc, types',
      "KEY = ''.join(['TOP', 'SECRET-', str(12345 * 7)])",
      "MARK = ''.join(['alpha_fn', '_marker'])",
      'def scan(v, seen, path, out, depth=0):',
      '    if depth > 8 or id(v) in seen: return',
      '    seen.add(id(v))',
      '    if isinstance(v, (bytes, bytearray)): v = bytes(v).decode("utf-8", "replace")',
      '    if isinstance(v, str):',
      '        if v is not KEY and v is not MARK and (KEY in v or MARK in v): out.append(path)',
      '    elif isinstance(v, dict):',
      '        for k, x in list(v.items()): scan(k, seen, path, out, depth + 1); scan(x, seen, path + "." + str(k)[:30], out, depth + 1)',
      '    elif isinstance(v, (list, tuple, set, frozenset)):',
      '        for x in list(v): scan(x, seen, path, out, depth + 1)',
      '    elif isinstance(v, types.CodeType):',
      '        scan(v.co_name, seen, path, out, depth + 1); scan(v.co_consts, seen, path, out, depth + 1)',
      '    elif isinstance(v, types.FunctionType):',
      '        scan(v.__code__, seen, path, out, depth + 1)',
      '    elif hasattr(v, "__dict__") and not isinstance(v, type):',
      '        scan(vars(v), seen, path + "." + type(v).__name__, out, depth + 1)',
      'def main():',
      '    out, seen, frames = [], {id(globals()), id(KEY), id(MARK)}, []',
      '    f = sys._getframe()',
      '    while f is not None:',
      '        frames.append(f.f_code.co_name)',
      '        for where, d in (("locals", f.f_locals), ("globals", f.f_globals)):',
      '            scan(d, seen, f.f_code.co_name + ":" + where, out)',
      '        scan(f.f_code, seen, f.f_code.co_name + ":code", out)',
      '        f = f.f_back',
      '    for o in gc.get_objects():',
      '        scan(o, seen, "heap:" + type(o).__name__, out)',
      '    print(len(frames) > 1, sorted(set(out)))',
      'main()',
    ].join('\n'),
  );
  t.equal(b.error, null, b.error ?? '');
  t.equal(b.stdout, 'True []\n', "no frame, global, local or heap object holds the earlier program's secret, question or code");
});

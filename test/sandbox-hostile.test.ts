// Hostile programs against the Python sandbox, one property per test (issue 3, item 9). Every test
// runs at each isolation level this machine offers (bubblewrap, unshare, limits only) and checks that
// the program is contained, that the result reports it, and that the next program runs normally.
// Where a property depends on the level (network, filesystem), the assertion follows what
// detectIsolation() reports for that level.
import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { detectIsolation } from '../lib/sandbox/isolation.js';
import { createPythonPool, type PythonSandboxPool } from '../lib/sandbox/python.js';
import type { SearchTools } from '../lib/sandbox/types.js';
import { truncationMarker } from '../lib/sandbox/types.js';
import { repoRoot } from './helpers/shared.js';

// A secret in the host's environment, set before any worker starts.
const SECRET = `s3cr3t-${randomBytes(8).toString('hex')}`;
process.env.SLM_SANDBOX_TEST_SECRET = SECRET;

const tools: SearchTools = {
  search_pages: (q) => [{ page_id: 'real', title: `real result for ${q}`, similarity: 1 }],
  view_sections: () => [],
  read_section: () => 'text',
};

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

async function until(cond: () => boolean, ms = 20_000): Promise<boolean> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (cond()) return true;
    await new Promise((res) => setTimeout(res, 25));
  }
  return cond();
}

interface Level {
  name: string;
  pool: PythonSandboxPool;
  /** Processes of an idle, healthy worker (wrapper + runner + its prepared child). */
  baseline: number;
}
const levels: Level[] = [];

t.before(async () => {
  const seen = new Set<string>();
  for (const maxLevel of ['bwrap', 'unshare', 'rlimits-only'] as const) {
    const iso = await detectIsolation({ maxLevel });
    if (seen.has(iso.level)) continue;
    seen.add(iso.level);
    if (iso.level === 'rlimits-only' && !iso.seccomp && !iso.uidDrop) continue; // refused by design
    const pool = await createPythonPool({ tools, size: 1, maxLevel, timeoutMs: 10_000 });
    await pool.run('pass');
    await new Promise((res) => setTimeout(res, 200));
    levels.push({ name: pool.isolation.level, pool, baseline: taggedPids(pool.tag).length });
  }
});
t.teardown(async () => {
  for (const l of levels) await l.pool.close();
  for (const l of levels) if (taggedPids(l.pool.tag).length) throw new Error(`processes of the ${l.name} pool survived close()`);
});

/** Runs `body` once per isolation level, then checks that the level's pool still works normally. */
function eachLevel(name: string, body: (t: Test, l: Level) => Promise<void>) {
  t.test(name, async (t) => {
    t.ok(levels.length >= 1, 'at least one isolation level works here');
    for (const l of levels) {
      await t.test(`at ${l.name}`, async (t) => {
        await body(t, l);
        const next = await l.pool.run('print(6 * 7)\nprint(search_pages("q")[0]["title"])');
        t.same([next.stdout, next.error, next.timed_out], ['42\nreal result for q\n', null, false], 'the next program runs normally');
        t.ok(await until(() => taggedPids(l.pool.tag).length <= l.baseline), `no process left over (baseline ${l.baseline})`);
      });
    }
  });
}

eachLevel(
  'memory held through file descriptors or SysV segments (memfd_create, shmget) is refused where seccomp is in force',
  async (t, { pool }) => {
    // Issue 33 row 3: 120 memfds of 16 MiB held 1,920 MiB past memory_mb (outside RLIMIT_AS).
    const r = await pool.run(
      [
        'import os, ctypes',
        'held = 0',
        'try:',
        '    for i in range(8):',
        "        fd = os.memfd_create('m%d' % i)",
        "        os.write(fd, b'y' * (16 << 20))",
        '        held += 16',
        '    print("memfd held", held, "MiB")',
        'except OSError as e:',
        '    print("memfd", type(e).__name__, e.errno, "after", held, "MiB")',
        'libc = ctypes.CDLL(None, use_errno=True)',
        'shm = libc.shmget(0, 16 << 20, 0o1600)',
        'print("shmget", shm, ctypes.get_errno() if shm < 0 else 0)',
      ].join('\n'),
      { memoryMb: 64 },
    );
    t.equal(r.error, null, r.error ?? '');
    if (pool.isolation.seccomp)
      t.equal(r.stdout, 'memfd PermissionError 1 after 0 MiB\nshmget -1 1\n', 'both refused with EPERM: nothing held past memory_mb');
    else t.match(r.stdout, /^memfd held 128 MiB\n/, 'without seccomp (the isolation report says so) memfds are not bounded by memory_mb');
  },
);

eachLevel('an infinite loop is stopped at the time limit', async (t, { pool }) => {
  const r = await pool.run('print("started")\nwhile True:\n    pass', { timeoutMs: 1000 });
  t.equal(r.timed_out, true);
  // The runner's own deadline ended it (the host's backstop, 2 s later, says 'the worker did not answer and was replaced').
  t.equal(r.error, 'TimeoutError: the program exceeded the time limit of 1 s');
  t.ok(r.duration_ms >= 1000 && r.duration_ms < 2500, `ended at its deadline: ${r.duration_ms.toFixed(0)} ms`);
  t.equal(r.stdout, 'started\n', 'output printed before the loop is kept');
});

eachLevel('a memory bomb ends in MemoryError at the address-space limit', async (t, { pool }) => {
  const r = await pool.run('blocks = []\nwhile True:\n    blocks.append(bytearray(32 * 1024 * 1024))', { memoryMb: 256 });
  t.match(r.error, /^MemoryError/);
  t.equal(r.timed_out, false);
});

eachLevel('a fork bomb creates no process', async (t, { pool }) => {
  const r = await pool.run('import os\nn = 0\ntry:\n    while True:\n        os.fork()\n        n += 1\nfinally:\n    print("forks:", n)', {
    timeoutMs: 3000,
  });
  t.not(r.error, null, `reported: ${r.error}`);
  if (pool.isolation.seccomp) {
    t.equal(r.stdout, 'forks: 0\n');
    t.match(r.error, /^PermissionError/);
  }
});

eachLevel('running another program is refused', async (t, { pool }) => {
  const r = await pool.run('import subprocess\nprint(subprocess.run(["/bin/echo", "escaped"], capture_output=True).stdout)');
  if (pool.isolation.seccomp) t.match(r.error, /^PermissionError/);
  t.notMatch(r.stdout, /escaped/);
});

eachLevel('100 MB of output is capped with a visible marker', async (t, { pool }) => {
  const r = await pool.run('line = "x" * 99\nfor _ in range(1_000_000):\n    print(line)', { maxOutputChars: 10_000, timeoutMs: 20_000 });
  t.equal(r.truncated, true);
  const marker = truncationMarker(10_000);
  t.ok(r.stdout.endsWith(marker), 'ends with the marker');
  t.equal(r.stdout.length, 10_000 + marker.length);
  t.ok(r.stdout.startsWith(`${'x'.repeat(99)}\n`));
});

eachLevel('deep recursion is contained', async (t, { pool }) => {
  const plain = await pool.run('def f(n):\n    return f(n + 1)\nf(0)');
  t.match(plain.error, /^RecursionError: maximum recursion depth exceeded/);
  const raised = await pool.run('import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f(n + 1) + 1\nprint("deep")\nf(0)', {
    timeoutMs: 10_000,
    memoryMb: 128,
  });
  t.equal(raised.stdout, 'deep\n');
  // CPython ends this in RecursionError, MemoryError, or (out of memory for frames) SystemError; a C
  // stack overflow would be SIGSEGV. Any of them is contained and reported.
  t.match(raised.error, /^(RecursionError|MemoryError|SystemError|SandboxError: .*SIGSEGV|TimeoutError)/, `reported: ${raised.error}`);
});

eachLevel('threads end with their program and cannot print into the next one', async (t, { pool }) => {
  const r = await pool.run(
    'import threading, time\n' +
      'def spam():\n    while True:\n        print("spam")\n        time.sleep(0.001)\n' +
      'for _ in range(8):\n    threading.Thread(target=spam).start()\n' +
      'print("main done")',
  );
  t.equal(r.error, null);
  t.match(r.stdout, /main done/);
  const next = await pool.run('import time\ntime.sleep(0.2)\nprint("quiet")');
  t.equal(next.stdout, 'quiet\n', 'no thread of the previous program printed here');
  const bomb = await pool.run(
    'import threading, time\nts = []\nwhile True:\n    th = threading.Thread(target=time.sleep, args=(60,))\n    th.start()\n    ts.append(th)',
    { timeoutMs: 5000 },
  );
  t.not(bomb.error, null, `a thread bomb is stopped: ${bomb.error}`);
});

eachLevel('a socket connection to a loopback listener fails where the network is isolated', async (t, { pool }) => {
  let connections = 0;
  const server: Server = createServer((s) => {
    connections++;
    s.destroy();
  });
  await new Promise<void>((res) => server.listen(0, '127.0.0.1', res));
  const port = (server.address() as { port: number }).port;
  try {
    const r = await pool.run(`import socket\ns = socket.create_connection(("127.0.0.1", ${port}), timeout=2)\nprint("connected")`);
    if (pool.isolation.network) {
      t.not(r.error, null, `refused: ${r.error}`);
      t.equal(r.stdout, '');
      t.equal(connections, 0, 'the listener saw no connection');
    } else {
      // The report says programs reach the network here: it must be right about that too.
      t.equal(pool.isolation.level, 'rlimits-only', 'only the lowest level runs without a network namespace');
      t.equal(r.stdout, 'connected\n', `${pool.isolation.level}: the report says no network isolation, and the program connected`);
      t.ok(connections >= 1, 'the listener saw it');
    }
  } finally {
    server.close();
  }
});

eachLevel('writing outside the working directory fails where the filesystem is read-only', async (t, { pool }) => {
  const name = `slm-sandbox-escape-${randomBytes(6).toString('hex')}`;
  const targets = [join(repoRoot, name), join(tmpdir(), name), join('/tmp', name)];
  try {
    const r = await pool.run(
      'import os\n' +
        `for p in ${JSON.stringify(targets)}:\n` +
        '    try:\n        open(p, "w").write("x")\n        print("wrote", p)\n    except OSError as e:\n        print("refused", type(e).__name__)\n' +
        'open("inside.txt", "w").write("ok")\nprint("inside", open("inside.txt").read())',
    );
    t.equal(r.error, null);
    t.match(r.stdout, /inside ok\n$/, 'the working directory is writable');
    if (pool.isolation.readonlyFs) {
      t.notMatch(r.stdout, /wrote/, 'every write outside was refused');
      for (const p of targets) t.notOk(existsSync(p), `nothing appeared at ${p}`);
    } else {
      // The report says the filesystem is writable here: a write outside must indeed succeed (/tmp
      // is writable to every uid).
      t.not(pool.isolation.level, 'bwrap', 'bwrap always mounts / read-only');
      t.match(r.stdout, new RegExp(`wrote /tmp/${name}`), `${pool.isolation.level}: the report says writable, and /tmp was written`);
    }
  } finally {
    for (const p of targets) rmSync(p, { force: true });
  }
});

eachLevel("the host's environment secrets are not visible", async (t, { pool }) => {
  const r = await pool.run(
    'import os\nprint(sorted(os.environ))\nprint(os.environ.get("SLM_SANDBOX_TEST_SECRET"))\n' +
      'found = 0\nfor pid in os.listdir("/proc"):\n    try:\n        found += open(f"/proc/{pid}/environ", "rb").read().count(b"SLM_SANDBOX_TEST_SECRET")\n    except Exception:\n        pass\nprint("found", found)',
  );
  t.equal(r.error, null);
  t.notMatch(r.stdout, SECRET);
  t.match(r.stdout, /^\['HOME', 'LANG', 'PATH'\]\nNone\nfound 0\n$/);
});

eachLevel('killing the parent harms neither the worker nor the host', async (t, { pool }) => {
  const pids = pool.workerPids();
  const r = await pool.run('import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint("still here")');
  t.not(r.error, null, `reported: ${r.error}`);
  if (pool.isolation.seccomp) {
    t.match(r.error, /^PermissionError/);
    t.same(pool.workerPids(), pids, 'the worker survived');
  }
  const group = await pool.run('import os, signal\nos.killpg(os.getpgid(0), signal.SIGKILL)');
  t.not(group.error, null, `killing its own process group is reported: ${group.error}`);
});

eachLevel('redefining search_pages affects that program only', async (t, { pool }) => {
  const a = await pool.run(
    'def search_pages(q):\n    return [{"page_id": "fake"}]\n' +
      'import builtins, json\nbuiltins.search_pages = search_pages\njson.loads = lambda s: "evil"\n' +
      'print(search_pages("x")[0]["page_id"])',
  );
  t.equal(a.stdout, 'fake\n');
  t.equal(a.calls.length, 0);
  const b = await pool.run('import json\nprint(search_pages("x")[0]["page_id"], json.loads("[1]"))');
  t.equal(b.stdout, 'real [1]\n');
  t.equal(b.calls.length, 1, 'the host answered');
});

eachLevel('garbage written to the tool channel is caught', async (t, { pool }) => {
  const r = await pool.run(
    'import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b"\\xff" * 64)\n    except OSError:\n        pass\nprint("done")',
  );
  t.match(r.error, /tool channel/, `reported: ${r.error}`);
});

eachLevel('threads burning CPU meet the CPU limit', async (t, { pool }) => {
  const r = await pool.run(
    'import threading, hashlib\n' +
      'def burn():\n    while True:\n        hashlib.sha256(b"x" * 10_000_000).digest()\n' +
      'for _ in range(4):\n    threading.Thread(target=burn, daemon=True).start()\n' +
      'import time\ntime.sleep(30)',
    { timeoutMs: 20_000, cpuSeconds: 1 },
  );
  t.equal(r.timed_out, true);
  t.match(r.error, /^TimeoutError: CPU time limit of 1 s exceeded/);
});

// What a model-written program can read of the host (issue 20). The sandbox's filesystem is an
// allow-list under bubblewrap: the interpreter's executable, standard library and shared libraries,
// read-only, and the private working directory; nothing else. Secrets are planted in the folder a
// `slm-train exec` / `slm-train eval` runs from and next to the questions (and corpus) file, and at
// every isolation level this machine offers a program tries to read and list them. Where the level
// cannot hide files (unshare, limits only) the test checks that the log says exactly that, and that
// what it says is true (the program reads the secret), rather than passing silently.
// sandbox.require_isolation / --require-isolation refuse a run below a chosen level.
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import t from 'tap';
import { syntheticCorpus } from '../lib/retrieval/synthetic.js';
import {
  bwrapView,
  checkRequiredIsolation,
  detectIsolation,
  detectIsolationWithCaps,
  runnerPackagePath,
  SANDBOX_PACKAGE,
  SANDBOX_RUNNER,
  BWRAP_WORKDIR,
} from '../lib/sandbox/isolation.js';
import { createPythonPool, type PythonSandboxPool } from '../lib/sandbox/python.js';
import type { IsolationLevel, IsolationReport, SearchTools } from '../lib/sandbox/types.js';
import { runCliAsync } from './helpers/cli.js';
import { repoRoot } from './helpers/shared.js';

const SECRET_CWD = `cwd-secret-${randomBytes(8).toString('hex')}`;
const SECRET_DATA = `data-secret-${randomBytes(8).toString('hex')}`;
const GOLD = `gold-answer-${randomBytes(8).toString('hex')}`;

// A run folder outside /tmp (tap's test folder is inside the checkout), as a user's would be.
const root = t.testdir();
const runDir = join(root, 'run'); // the folder slm-train runs from
const dataDir = join(root, 'data'); // questions and corpus
const progDir = join(root, 'programs');
for (const d of [runDir, dataDir, progDir]) mkdirSync(d, { recursive: true });
const gen = syntheticCorpus({ pages: 12, seed: 4 });
const page = gen.pages[3];
const corpus = join(dataDir, 'corpus.jsonl');
const questions = join(dataDir, 'questions.jsonl');
writeFileSync(corpus, gen.pages.map((p) => JSON.stringify(p)).join('\n') + '\n');
writeFileSync(
  questions,
  gen.questions
    .slice(0, 4)
    .map((q, i) => JSON.stringify({ answer: i === 0 ? GOLD : q.answer, id: q.id, question: q.question }))
    .join('\n') + '\n',
);
writeFileSync(join(runDir, 'secret.txt'), SECRET_CWD); // default permissions (0644), as a user's files are
writeFileSync(join(runDir, '.env'), `OPENAI_API_KEY=${SECRET_CWD}\n`);
writeFileSync(join(dataDir, 'secret.txt'), SECRET_DATA);

const planted = [
  join(runDir, 'secret.txt'),
  join(runDir, '.env'),
  join(dataDir, 'secret.txt'),
  questions,
  corpus,
  join(repoRoot, 'package.json'),
];
const folders = [runDir, dataDir, root, repoRoot, '/work', '/srv', '/opt', '/mnt', '/home', '/root/.ssh', '/etc/ssh', '/usr/share', '/var'];
const secrets = [SECRET_CWD, SECRET_DATA, GOLD];

/** A program that reads every planted file (its first 200 characters) and lists the folders (20 names). */
function probeProgram(): string {
  return `import os, json
P = json.loads(${JSON.stringify(JSON.stringify({ files: planted, dirs: folders }))})
out = {"read": {}, "list": {}, "cwd": os.getcwd(), "root": sorted(os.listdir("/"))}
for p in P["files"]:
    try:
        with open(p) as f:
            out["read"][p] = f.read()[:200]
    except Exception as e:
        out["read"][p] = "ERR " + type(e).__name__
for d in P["dirs"]:
    try:
        out["list"][d] = sorted(os.listdir(d))[:20]
    except Exception as e:
        out["list"][d] = "ERR " + type(e).__name__
print(json.dumps(out))
`;
}

/** A program that walks the whole visible filesystem but `prune` and prints how many files it saw and the first 100. */
function walkProgram(prune: string[]): string {
  return `import os, json
prune = set(json.loads(${JSON.stringify(JSON.stringify(prune))}))
seen = []
for top, ds, fs in os.walk("/"):
    ds[:] = [d for d in ds if os.path.join(top, d) not in prune]
    seen += [os.path.join(top, f) for f in fs]
    if len(seen) > 10000:
        break
print(json.dumps({"count": len(seen), "first": sorted(seen)[:100]}))
`;
}

/** What model programs import (the prompts show re, json, collections; the rest are common) and the three tools. */
const STDLIB_AND_TOOLS = `import re, json, math, collections, datetime, itertools, functools, heapq, string, random, statistics
import textwrap, difflib, unicodedata, hashlib, decimal, fractions, operator, bisect, copy, html, typing
import dataclasses, enum, csv, io, base64, zlib, struct, array, urllib.parse, time
from collections import Counter, defaultdict
print(re.sub("a+", "b", "caat"), json.dumps({"k": [1]}), math.isqrt(17), datetime.date(2020, 1, 2).isoformat())
print(hashlib.sha256(b"abc").hexdigest()[:8], zlib.crc32(b"abc"), statistics.mean([1, 2, 6]), base64.b64encode(b"hi").decode())
print(Counter("aab").most_common(1), list(csv.reader(io.StringIO("a,b"))), str(decimal.Decimal("1.10") + 1), fractions.Fraction(1, 3) * 3)
hits = search_pages(QUERY)
secs = view_sections(hits[0]["page_id"])
print(hits[0]["page_id"], len(secs) > 0, len(read_section(secs[0]["section_id"])) > 0)
`;
const STDLIB_OUT = (pageId: string) =>
  `cbt {"k": [1]} 4 2020-01-02\nba7816bf 891568578 3 aGk=\n[('a', 2)] [['a', 'b']] 2.10 1\n${pageId} True True\n`;

const tools = (): SearchTools => {
  const byId = new Map(gen.pages.map((p) => [p.id, p]));
  return {
    search_pages: (q) => gen.pages.filter((p) => q === `about ${p.title}`).map((p) => ({ page_id: p.id, title: p.title, similarity: 1 })),
    view_sections: (id) => [{ section_id: `${id}:full`, section_name: byId.get(id)?.title ?? '' }],
    read_section: (s) => byId.get(s.split(':')[0])?.content ?? '',
  };
};

interface Level {
  level: IsolationLevel;
  iso: IsolationReport;
  /** Refused by createPythonPool by design (nothing contains programs here). */
  refused: boolean;
}
const levels: Level[] = [];
t.before(async () => {
  for (const maxLevel of ['bwrap', 'unshare', 'rlimits-only'] as const) {
    const iso = await detectIsolation({ maxLevel });
    if (levels.some((l) => l.level === iso.level)) continue;
    levels.push({ level: iso.level, iso, refused: iso.level === 'rlimits-only' && !iso.seccomp && !iso.uidDrop });
  }
});

/** The read-only allow-list bubblewrap should show, as the interpreter reported it (the test's own computation). */
async function allowList() {
  const { caps, python } = await detectIsolationWithCaps({ maxLevel: 'bwrap' });
  return { view: bwrapView(python, caps.paths!), python };
}

t.test('every isolation level: the report says what a program can read, and it is true', async (t) => {
  t.ok(levels.length >= 1, `levels offered here: ${levels.map((l) => l.level).join(', ')}`);
  // Where bubblewrap itself works, the sandbox must use it (a broken allow-list must not fall back
  // to a weaker level unnoticed).
  const bwrapWorks =
    spawnSync('bwrap', ['--ro-bind', '/', '/', '--unshare-pid', '--unshare-net', '--', 'true'], { timeout: 15_000 }).status === 0;
  if (bwrapWorks) t.equal(levels[0].level, 'bwrap', 'bubblewrap works on this machine, so programs run under it');
  else t.comment('bubblewrap does not work on this machine: the levels below are all it offers');
  for (const l of levels) {
    await t.test(`at ${l.level}`, async (t) => {
      t.comment(`${l.level}: a program can read ${l.iso.readable}`);
      if (l.refused) {
        await t.rejects(
          createPythonPool({ tools: tools(), size: 1, maxLevel: l.level }),
          { code: 'SANDBOX_UNAVAILABLE' },
          'nothing contains programs: refused',
        );
        return;
      }
      const pool: PythonSandboxPool = await createPythonPool({ tools: tools(), size: 1, maxLevel: l.level });
      try {
        t.equal(pool.isolation.level, l.level);
        const libs = await pool.run(STDLIB_AND_TOOLS, { globals: { QUERY: `about ${page.title}` } });
        t.equal(libs.error, null, 'the standard library imports');
        t.equal(libs.stdout, STDLIB_OUT(page.id), 'modules work and the tools answer');
        t.same(
          libs.calls.map((c) => [c.name, c.ok]),
          [
            ['search_pages', true],
            ['view_sections', true],
            ['read_section', true],
          ],
        );

        const hidden = pool.isolation.hostFilesHidden;
        const r = await pool.run(probeProgram(), { maxOutputChars: 100_000 });
        t.equal(r.error, null, r.error ?? '');
        const out = JSON.parse(r.stdout) as {
          read: Record<string, string>;
          list: Record<string, string[] | string>;
          cwd: string;
          root: string[];
        };
        if (hidden) {
          t.equal(l.level, 'bwrap');
          for (const s of secrets) t.notMatch(r.stdout, s, 'no planted secret reaches the program');
          for (const p of planted) t.equal(out.read[p], 'ERR FileNotFoundError', `${p} does not exist for the program`);
          for (const d of folders) t.equal(out.list[d], 'ERR FileNotFoundError', `${d} cannot be listed`);
          t.equal(out.cwd, BWRAP_WORKDIR);
          const { view } = await allowList();
          const tops = new Set([
            'dev',
            'proc',
            'tmp',
            SANDBOX_RUNNER.split('/')[1],
            ...[...view.dirs, ...view.files, ...view.symlinks.map((s) => s[1])].map((p) => p.split('/')[1]),
          ]);
          t.same(out.root, [...tops].sort(), `/ holds only the allow-list's top folders: ${out.root.join(' ')}`);
          // Every file the program can see outside the bound library folders, /proc and /dev: exactly the allow-listed ones.
          const w = await pool.run(walkProgram(['/proc', '/dev', '/sys', ...view.dirs]), { maxOutputChars: 100_000, timeoutMs: 30_000 });
          t.equal(w.error, null, w.error ?? '');
          // The runner's modules: every file of python/slm_sandbox/ on the host, at SANDBOX_PACKAGE.
          const modules = readdirSync(runnerPackagePath(), { recursive: true, withFileTypes: true })
            .filter((e) => e.isFile())
            .map((e) => join(SANDBOX_PACKAGE, join(e.parentPath ?? e.path, e.name).slice(runnerPackagePath().length + 1)));
          t.ok(modules.includes(join(SANDBOX_PACKAGE, 'runner.py')), "the runner's modules are bound next to it");
          const expected = [...view.files, SANDBOX_RUNNER, ...modules].sort();
          t.same(
            JSON.parse(w.stdout),
            { count: expected.length, first: expected },
            'the only files outside the library folders are the allow-listed ones',
          );
          t.match(pool.isolation.readable, /^only what the interpreter needs, read-only: .*Nothing else of this machine/);
        } else {
          // The level cannot hide files: the report must say so, and be right.
          t.match(pool.isolation.readable, /^every file/, 'the report says that every (readable) file is open to programs');
          if (!pool.isolation.uidDrop) {
            // Programs run as the slm-train user: the report says every file that user can read.
            t.equal(out.read[join(runDir, 'secret.txt')], SECRET_CWD, 'and indeed the program reads the secret in the run folder');
            t.equal(out.read[join(dataDir, 'secret.txt')], SECRET_DATA, 'and the one next to the questions file');
            t.match(out.read[questions], GOLD, 'and the gold answers');
          } else {
            // An unprivileged uid: world-readable files only (this test folder's path decides which).
            t.match(pool.isolation.readable, /any user may read/);
            // Which ones follows from the modes: the file readable by others and every folder above
            // it searchable by others. A readable one must be read in full, any other refused.
            for (const p of planted) {
              const open = (statSync(p).mode & 0o004) !== 0 && ancestors(p).every((d) => (statSync(d).mode & 0o001) !== 0);
              if (open) t.equal(out.read[p], readFileSync(p, 'utf8').slice(0, 200), `${p} is world-readable: the program reads it`);
              else t.equal(out.read[p], 'ERR PermissionError', `${p} is not world-readable: the program is refused`);
            }
          }
        }
      } finally {
        await pool.close();
      }
    });
  }
});

t.test('requireIsolation refuses a pool below the chosen level, before starting anything', async (t) => {
  const weak = levels.find((l) => l.level !== 'bwrap' && !l.refused);
  t.ok(weak, 'a level below bwrap is offered (rlimits-only always is), so the refusal is exercised');
  if (weak) {
    await t.rejects(createPythonPool({ tools: tools(), size: 1, maxLevel: weak.level, requireIsolation: 'bwrap' }), {
      code: 'SANDBOX_ISOLATION_INSUFFICIENT',
      message: new RegExp(
        `Expected sandbox isolation bwrap or better \\(requireIsolation\\) but this machine gives ${weak.level}.*a program can read every file`,
      ),
    });
  }
  const best = levels[0];
  if (!best.refused) {
    const pool = await createPythonPool({ tools: tools(), size: 1, requireIsolation: best.level });
    t.equal(pool.isolation.level, best.level, 'the best level meets a requirement of itself');
    await pool.close();
  }
  // The check itself, for every pair of levels.
  const report = (level: IsolationLevel) => ({ ...best.iso, level, details: '', readable: 'x' });
  const order: IsolationLevel[] = ['rlimits-only', 'unshare', 'bwrap'];
  for (const have of order)
    for (const want of order) {
      const ok = order.indexOf(have) >= order.indexOf(want);
      if (ok) t.doesNotThrow(() => checkRequiredIsolation(report(have), want), `${have} meets ${want}`);
      else
        t.throws(() => checkRequiredIsolation(report(have), want), { code: 'SANDBOX_ISOLATION_INSUFFICIENT' }, `${have} is below ${want}`);
    }
  t.doesNotThrow(() => checkRequiredIsolation(report('rlimits-only'), null), 'null: any level');
  t.throws(() => checkRequiredIsolation(report('bwrap'), 'full' as IsolationLevel), { code: 'ARGUMENT_INVALID' });
});

t.test(
  'slm-train exec from a run folder with secrets, at every level: nothing of the host is readable under bwrap, and the log says what is',
  async (t) => {
    const prog = join(progDir, 'probe.py');
    writeFileSync(prog, probeProgram() + STDLIB_AND_TOOLS.replace('QUERY', JSON.stringify(`about ${page.title}`)));
    for (const l of levels) {
      await t.test(`at ${l.level}`, async (t) => {
        const r = await runCliAsync(['exec', '--corpus', corpus, '--file', prog, '--json'], {
          cwd: runDir,
          env: { SLM_SANDBOX_ISOLATION: l.level },
          timeout: 120_000,
        });
        if (l.refused) {
          t.equal(r.code, 2);
          t.match(r.stderr, /error SANDBOX_UNAVAILABLE/);
          return;
        }
        t.equal(r.code, 0, r.stderr);
        t.match(
          r.stderr,
          `sandbox: isolation ${l.level}: a program can read ${l.iso.readable}`,
          'the log line says exactly what a program can read',
        );
        const res = JSON.parse(r.stdout) as { stdout: string; error: string | null; calls: { name: string; ok: boolean }[] };
        t.equal(res.error, null, res.error ?? '');
        const [probeLine, ...rest] = res.stdout.split('\n');
        const out = JSON.parse(probeLine) as { read: Record<string, string>; list: Record<string, unknown> };
        t.match(rest.join('\n'), /^cbt \{"k": \[1\]\} 4 2020-01-02\n/, 'the standard library works');
        t.same(
          res.calls.map((c) => [c.name, c.ok]),
          [
            ['search_pages', true],
            ['view_sections', true],
            ['read_section', true],
          ],
          'the tools answer from the corpus',
        );
        if (l.iso.hostFilesHidden) {
          for (const s of secrets) t.notMatch(res.stdout, s, 'no planted secret, no gold answer reaches the program');
          for (const p of planted) t.equal(out.read[p], 'ERR FileNotFoundError', `${p} is not there`);
          for (const d of folders) t.equal(out.list[d], 'ERR FileNotFoundError', `${d} cannot be listed`);
          t.match(r.stderr, /a program can read only what the interpreter needs/);
        } else {
          t.match(
            r.stderr,
            new RegExp(`sandbox: isolation ${l.level}: a program can read every file`),
            'the log says the host is readable',
          );
          if (!l.iso.uidDrop) t.equal(out.read[join(runDir, 'secret.txt')], SECRET_CWD, 'as it is');
        }
      });
    }
    const weak = levels.find((l) => l.level !== 'bwrap');
    t.ok(weak, 'a level below bwrap is offered (rlimits-only always is), so the refusal is exercised');
    if (weak) {
      const r = await runCliAsync(['exec', '--corpus', corpus, '--file', prog, '--require-isolation', 'bwrap', '--json'], {
        cwd: runDir,
        env: { SLM_SANDBOX_ISOLATION: weak.level },
        timeout: 120_000,
      });
      t.equal(r.code, 2, '--require-isolation bwrap below bwrap: refused');
      t.match(r.stderr, /slm-train: error SANDBOX_ISOLATION_INSUFFICIENT: Expected sandbox isolation bwrap or better/);
      t.equal(r.stdout, '', 'nothing ran');
    }
  },
);

t.test('slm-train eval with sandbox.require_isolation: refuses to start below it, and logs what a program can read', async (t) => {
  const model = join(root, 'not-a-model');
  mkdirSync(model, { recursive: true });
  const args = (extra: string[]) => [
    'eval',
    '--config',
    join(repoRoot, 'configs', 'code-grpo.yaml'),
    `model.path=${model}`,
    `data.questions=${questions}`,
    `data.corpus=${corpus}`,
    `run.dir=${join(runDir, 'runs')}`,
    'protocol.prompts_from_sft=false',
    ...extra,
  ];
  const weak = levels.find((l) => l.level !== 'bwrap');
  t.ok(weak, 'a level below bwrap is offered (rlimits-only always is), so the refusal is exercised');
  if (weak) {
    const r = await runCliAsync(args(['sandbox.require_isolation=bwrap']), {
      cwd: runDir,
      env: { SLM_SANDBOX_ISOLATION: weak.level },
      timeout: 120_000,
    });
    t.equal(r.code, 2);
    t.match(r.stderr, `sandbox: isolation ${weak.level}: a program can read every file`);
    t.match(
      r.stderr,
      /slm-train: error SANDBOX_ISOLATION_INSUFFICIENT: Expected sandbox isolation bwrap or better \(sandbox\.require_isolation\) but this machine gives/,
    );
  }
  if (levels[0].level === 'bwrap') {
    // bwrap meets it: the run goes on (and fails later, on the fake model folder).
    const r = await runCliAsync(args(['sandbox.require_isolation=bwrap']), { cwd: runDir, timeout: 120_000 });
    t.match(r.stderr, /sandbox: isolation bwrap: a program can read only what the interpreter needs/);
    t.notMatch(r.stderr, /SANDBOX_ISOLATION_INSUFFICIENT/);
  }
  const bad = await runCliAsync(args(['sandbox.require_isolation=full']), { cwd: runDir, timeout: 60_000 });
  t.match(bad.stderr, /error CONFIG_INVALID: [^\n]*require_isolation/, 'an unknown level is a config error');
});

t.test('slm-train doctor says what a program can read at every level, and warns where host files are readable', async (t) => {
  for (const l of levels) {
    const r = await runCliAsync(['doctor'], { env: { SLM_SANDBOX_ISOLATION: l.level }, timeout: 120_000 });
    t.equal(r.code, 0, r.stderr);
    t.match(r.stdout, `sandbox files    a program can read ${l.iso.readable}`, `${l.level}: the doctor's line`);
    if (l.iso.hostFilesHidden) {
      t.match(r.stdout, /host files hidden/);
      t.notMatch(r.stdout, /the Python sandbox runs at isolation level/, 'no warning about the sandbox');
    } else {
      t.match(r.stdout, /host files READABLE/);
      t.match(
        r.stdout,
        new RegExp(
          `- the Python sandbox runs at isolation level ${l.level}: .*a program can read every file.*sandbox\\.require_isolation: bwrap`,
        ),
        'a warning says so',
      );
    }
  }
});

t.test('the library path (openEnvironment, what trainFromConfig opens) enforces sandbox.require_isolation too', async (t) => {
  const { validateConfig } = await import('../lib/config/load.js');
  const { openEnvironment } = await import('../lib/train/environment.js');
  const cfg = (req: string | null) =>
    validateConfig(
      {
        stage: 'grpo',
        model: { path: 'unused' },
        data: { questions: questions, corpus },
        protocol: { kind: 'code', max_turns: 2 },
        sandbox: { workers: 1, require_isolation: req },
        retrieval: { kind: 'bm25' },
      },
      'test',
    );
  const weak = levels.find((l) => l.level !== 'bwrap' && !l.refused);
  t.ok(weak, 'a level below bwrap is offered (rlimits-only always is), so the refusal is exercised');
  if (weak) {
    const saved = process.env.SLM_SANDBOX_ISOLATION;
    process.env.SLM_SANDBOX_ISOLATION = weak.level;
    t.teardown(() => (saved === undefined ? delete process.env.SLM_SANDBOX_ISOLATION : (process.env.SLM_SANDBOX_ISOLATION = saved)));
    await t.rejects(
      openEnvironment(cfg('bwrap')),
      { code: 'SANDBOX_ISOLATION_INSUFFICIENT' },
      `${weak.level} is refused when bwrap is required`,
    );
    const env = await openEnvironment(cfg(null));
    t.ok(env.sandbox, `without the requirement ${weak.level} runs`);
    await env.close();
  }
});

/** The folders above a path, from its parent up to /. */
function ancestors(p: string): string[] {
  const out: string[] = [];
  for (let d = dirname(p); ; d = dirname(d)) {
    out.push(d);
    if (d === dirname(d)) return out;
  }
}

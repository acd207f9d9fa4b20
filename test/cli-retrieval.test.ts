// `slm-train index`, `search` and `exec` (issue 3, items 3 and 6) through the built command line.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { syntheticCorpus } from '../lib/retrieval/synthetic.js';
import { runCli } from './helpers/cli.js';

const dir = t.testdir();
const corpus = join(dir, 'corpus.jsonl');
const index = join(dir, 'index');
const gen = syntheticCorpus({ pages: 30, seed: 9 });
writeFileSync(corpus, gen.pages.map((p) => JSON.stringify(p)).join('\n') + '\n');
const page = gen.pages[4];

t.test('index builds and saves; search finds the page a title names, from the index and from the corpus', async (t) => {
  const r = runCli(['index', '--corpus', corpus, '--out', index, '--M', '24', '--ef', '64', '--json']);
  t.equal(r.code, 0, r.stderr);
  t.match(JSON.parse(r.stdout), { pages: 30, chunks: 120, kind: 'hybrid', embedder: 'hashing-256', hnsw: true });
  t.match(r.stderr, /index: 30 pages, 120 chunks in [\d.]+ s/, 'progress and timing on stderr');
  const plain = runCli(['index', '--corpus', corpus, '--out', join(dir, 'index-plain'), '--kind', 'bm25']);
  t.equal(plain.code, 0, plain.stderr);
  t.match(plain.stdout, /^indexed 30 pages \(120 chunks, hashing-256, bm25\) in [\d.]+ s -> .*index-plain\n$/, 'a one-line summary');
  t.match(JSON.parse(readFileSync(join(index, 'manifest.json'), 'utf8')).params, { M: 24, ef: 64, efConstruction: 200 });
  for (const src of [
    ['--index', index],
    ['--corpus', corpus],
  ]) {
    const s = runCli(['search', ...src, page.title, '--json']);
    t.equal(s.code, 0, s.stderr);
    const hits = JSON.parse(s.stdout);
    t.equal(hits.length, 10);
    t.match(hits[0], { page_id: page.id, title: page.title, similarity: Number });
  }
  const k3 = runCli(['search', '--index', index, `Who founded ${page.title}?`, '--k', '3', '--kind', 'bm25']);
  t.equal(k3.code, 0);
  t.equal(k3.stdout.trim().split('\n').length, 3, 'a table of 3 rows');
  t.match(k3.stdout, new RegExp(`^\\s+1\\s+[\\d.]+\\s+${page.id}\\s+${page.title}`));
});

t.test('exec runs a Python program against the index; output, error and calls come back', async (t) => {
  const program = [
    `hits = search_pages(${JSON.stringify(page.title)})`,
    'print(hits[0]["page_id"])',
    'print([s["section_id"] for s in view_sections(hits[0]["page_id"])])',
    'print(read_section(hits[0]["page_id"] + ":history").splitlines()[1][:40])',
    'raise KeyError("late")',
  ].join('\n');
  const file = join(dir, 'p.py');
  writeFileSync(file, program);
  const r = runCli(['exec', '--index', index, '--file', file, '--json']);
  t.equal(r.code, 0, 'a program that raises is a result, not a CLI failure');
  const out = JSON.parse(r.stdout);
  t.same(Object.keys(out), ['stdout', 'error', 'timed_out', 'calls']);
  t.equal(out.stdout.split('\n')[0], page.id);
  t.match(out.stdout, `['${page.id}:introduction', '${page.id}:history', '${page.id}:geography', '${page.id}:economy', '${page.id}:full']`);
  t.match(out.stdout, `${page.title} was founded in`);
  t.equal(out.error, "KeyError: 'late'");
  t.equal(out.timed_out, false);
  t.same(
    out.calls.map((c: { name: string; ok: boolean }) => [c.name, c.ok]),
    [
      ['search_pages', true],
      ['view_sections', true],
      ['read_section', true],
    ],
  );
  t.same(out.calls[2].args, [`${page.id}:history`]);

  const stdin = runCli(['exec', '--corpus', corpus, '--json'], { input: 'print(read_section("nope:full"))' });
  t.equal(stdin.code, 0);
  t.match(JSON.parse(stdin.stdout).error, /no page "nope"/, 'a tool error reaches the program as an exception with the hint');
  const loop = runCli(['exec', '--corpus', corpus, '--timeout-s', '1', '--json', '-'], { input: 'while True: pass' });
  t.equal(loop.code, 0);
  t.match(JSON.parse(loop.stdout), { timed_out: true });
});

t.test('exec without --json: the program output on stdout, its error on stderr, exit 0, sandbox closed', async (t) => {
  // No process.exit in the CLI: a sandbox left open would keep it alive past this timeout.
  const r = runCli(['exec', '--corpus', corpus], {
    input: `print(search_pages(${JSON.stringify(page.title)})[0]["title"])\nprint("before")\n1/0\nprint("after")`,
    timeout: 30_000,
  });
  t.equal(r.code, 0, r.stderr);
  t.equal(r.stdout, `${page.title}\nbefore\n`);
  t.match(r.stderr, /the program raised: ZeroDivisionError: division by zero/);
  t.notMatch(r.stderr, /slm-train: error/);
});

t.test('exec runs JavaScript in QuickJS with the same tools', async (t) => {
  const r = runCli(['exec', '--corpus', corpus, '--sandbox', 'quickjs', '--json'], {
    input: `const h = search_pages(${JSON.stringify(page.title)}); console.log(h[0].page_id); console.log(read_section(h[0].page_id + ':economy').length > 10)`,
  });
  t.equal(r.code, 0, r.stderr);
  const out = JSON.parse(r.stdout);
  t.equal(out.stdout, `${page.id}\ntrue\n`);
  t.equal(out.error, null);
  t.equal(out.calls.length, 2);
});

t.test('bad input: clear errors and exit code 2', async (t) => {
  const both = runCli(['exec', '--index', index, '--corpus', corpus], { input: 'print(1)' });
  t.equal(both.code, 2);
  t.match(both.stderr, /error ARGUMENT_INVALID: give exactly one of --index DIR .* or --corpus FILE .*found both/);
  const neither = runCli(['search', 'x']);
  t.match(neither.stderr, /found neither/);
  const missing = runCli(['search', '--index', join(dir, 'no-index'), 'x']);
  t.equal(missing.code, 2);
  t.match(missing.stderr, /error INDEX_INVALID: .*no manifest\.json.*slm-train index --corpus FILE/);
  const emb = runCli(['index', '--corpus', corpus, '--out', join(dir, 'x'), '--embedder', '/models/Qwen3-Embedding-0.6B']);
  t.match(
    emb.stderr,
    /error MODEL_NOT_FOUND: embedder \/models\/Qwen3-Embedding-0\.6B: expected "hashing", a sentence-transformers BERT folder \(all-MiniLM-L6-v2: .*\) or a Qwen3 embedding model folder, but \/models\/Qwen3-Embedding-0\.6B has no config\.json/,
  );
  t.notOk(existsSync(join(dir, 'x')), 'nothing written');
  const badCorpus = runCli(['index', '--corpus', join(dir, 'nope.jsonl'), '--out', join(dir, 'y')]);
  t.match(badCorpus.stderr, /error FILE_NOT_FOUND: corpus file .*nope\.jsonl cannot be read/);
});

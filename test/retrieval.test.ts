// Corpus loading and search primitives, BM25, reciprocal-rank fusion, the HNSW index (recall against
// exact search, save/load, damaged folders) and page retrieval on a generated corpus (issue 3,
// items 1-3 and 10).
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { SlmError } from '../lib/errors.js';
import { BM25, reciprocalRankFusion } from '../lib/retrieval/bm25.js';
import { Corpus, normalizeId, type Page } from '../lib/retrieval/corpus.js';
import { HashingEmbedder, dot } from '../lib/retrieval/embedders.js';
import { SearchIndex } from '../lib/retrieval/index.js';
import { syntheticCorpus } from '../lib/retrieval/synthetic.js';
import { words } from '../lib/retrieval/text.js';
import { writeParquet } from './helpers/parquet.js';

const tmp = mkdtempSync(join(tmpdir(), 'slm-retrieval-'));
t.teardown(() => rmSync(tmp, { recursive: true, force: true }));

const PAGES: Page[] = [
  {
    id: 'kate_box',
    title: 'Kate Box',
    content:
      'Kate Box is an Australian actress.\n\n## Early life\nBorn in Sydney.\n\n## Career\nIn 2003, Box graduated from NIDA.\n\n## Career\nLater work on stage.\n\n### Awards & honours\nA Helpmann nomination.',
  },
  { id: 'lake_ossa', title: 'Lake Ossa', content: '# Lake Ossa\nA lake in Cameroon.\n\n## Fauna\nManatees live in the lake.' },
  { id: 'empty_page', title: 'Empty page', content: '' },
];

async function rejects(p: () => unknown, code: string, re: RegExp, t: Test) {
  try {
    await p();
    t.fail(`expected ${code}`);
  } catch (e) {
    t.ok(e instanceof SlmError, e instanceof SlmError ? `SlmError ${(e as SlmError).code}` : `expected an SlmError, got ${String(e)}`);
    t.equal((e as SlmError).code, code);
    t.match((e as Error).message, re);
  }
}

t.test('a corpus loads the same from JSONL, JSON and Parquet', async (t) => {
  writeFileSync(join(tmp, 'c.jsonl'), PAGES.map((p) => JSON.stringify(p)).join('\n') + '\n\n');
  writeFileSync(join(tmp, 'c.json'), JSON.stringify(PAGES));
  writeParquet(
    join(tmp, 'c.parquet'),
    PAGES.map((p) => ({ id: p.id, title: p.title, content: p.content })),
    { id: 'STRING', title: 'STRING', content: 'STRING' },
  );
  for (const f of ['c.jsonl', 'c.json', 'c.parquet']) {
    const c = await Corpus.load(join(tmp, f));
    t.same(c.pages, PAGES, f);
  }
});

t.test('bad corpus files say what was expected and where', async (t) => {
  writeFileSync(join(tmp, 'bad1.jsonl'), JSON.stringify(PAGES[0]) + '\n{"id": "x", "title": 3, "content": ""}\n');
  await rejects(() => Corpus.load(join(tmp, 'bad1.jsonl')), 'CORPUS_INVALID', /row 2 needs a string "title", found/, t);
  writeFileSync(join(tmp, 'bad2.jsonl'), JSON.stringify(PAGES[0]) + '\n{"id": \n');
  await rejects(() => Corpus.load(join(tmp, 'bad2.jsonl')), 'CORPUS_INVALID', /bad2\.jsonl:2: not valid JSON/, t);
  writeFileSync(join(tmp, 'dup.json'), JSON.stringify([PAGES[0], PAGES[0]]));
  await rejects(() => Corpus.load(join(tmp, 'dup.json')), 'CORPUS_INVALID', /repeats the id "kate_box"/, t);
  writeFileSync(join(tmp, 'obj.json'), '{"id": 1}');
  await rejects(() => Corpus.load(join(tmp, 'obj.json')), 'CORPUS_INVALID', /expected a JSON array/, t);
  await rejects(() => Corpus.load(join(tmp, 'nope.jsonl')), 'FILE_NOT_FOUND', /cannot be read/, t);
  writeFileSync(join(tmp, 'junk.parquet'), 'not parquet at all');
  await rejects(() => Corpus.load(join(tmp, 'junk.parquet')), 'CORPUS_INVALID', /could not be read as Parquet/, t);
});

t.test('sections: ids page_id:normalized_heading, repeats numbered, page_id:full, helpful misses', async (t) => {
  const c = new Corpus(PAGES);
  t.equal(normalizeId('Awards & honours'), 'awards___honours');
  t.same(c.view_sections('kate_box'), [
    { section_id: 'kate_box:introduction', section_name: 'introduction' },
    { section_id: 'kate_box:early_life', section_name: 'Early life' },
    { section_id: 'kate_box:career', section_name: 'Career' },
    { section_id: 'kate_box:career_2', section_name: 'Career' },
    { section_id: 'kate_box:awards___honours', section_name: 'Awards & honours' },
    { section_id: 'kate_box:full', section_name: 'full page' },
  ]);
  t.same(
    c.view_sections('lake_ossa').map((s) => s.section_id),
    ['lake_ossa:lake_ossa', 'lake_ossa:fauna', 'lake_ossa:full'],
    'a page starting with a heading has no empty introduction',
  );
  t.equal(c.read_section('kate_box:career'), '## Career\nIn 2003, Box graduated from NIDA.');
  t.equal(c.read_section('kate_box:career_2'), '## Career\nLater work on stage.');
  t.equal(c.read_section('kate_box:full'), `# Kate Box\n${PAGES[0].content}`);
  t.same(c.view_sections('empty_page'), [{ section_id: 'empty_page:full', section_name: 'full page' }]);

  t.throws(() => c.view_sections('kate_boxx'), {
    code: 'NOT_FOUND',
    message: /page_id "kate_boxx" does not exist\. Did you mean "kate_box"\? Use search_pages/,
  });
  t.throws(() => c.read_section('kate_box:carrer'), {
    code: 'NOT_FOUND',
    message: /Did you mean "kate_box:career"\?.*Sections of kate_box: kate_box:introduction, .*kate_box:full for the whole page/,
  });
  t.throws(() => c.read_section('kat_box:career'), { code: 'NOT_FOUND', message: /no page "kat_box"\. Did you mean "kate_box:full"\?/ });
  t.throws(() => c.read_section('career'), { code: 'NOT_FOUND', message: /look like "page_id:section"/ });
});

t.test('BM25 scores match a hand computation (k1 1.2, b 0.75, Lucene idf)', async (t) => {
  // Computed independently in Python: idf = ln(1 + (N - n + 0.5) / (n + 0.5)), avgdl = 7/3.
  const bm = new BM25(['apple banana', 'apple apple cherry', 'cherry date']);
  const close = (got: Array<{ doc: number; score: number }>, want: Array<[number, number]>, msg: string) => {
    t.same(
      got.map((g) => g.doc),
      want.map((w) => w[0]),
      `${msg}: order`,
    );
    got.forEach((g, i) => t.ok(Math.abs(g.score - want[i][1]) < 1e-9, `${msg}: doc ${g.doc} ${g.score} vs ${want[i][1]}`));
  };
  close(
    bm.search('apple', 10),
    [
      [1, 0.5981864372218454],
      [0, 0.4991762683023676],
    ],
    'apple',
  );
  close(
    bm.search('Apple, cherry!', 10),
    [
      [1, 1.0190036401511668],
      [0, 0.4991762683023676],
      [2, 0.4991762683023676],
    ],
    'apple cherry',
  );
  close(bm.search('date', 10), [[2, 1.041708310095213]], 'date');
  t.same(bm.search('zebra', 10), [], 'no shared term, no result');
  t.equal(bm.search('apple cherry', 1).length, 1, 'k is respected');
});

t.test('reciprocal-rank fusion matches a hand computation (k = 60)', async (t) => {
  const f = reciprocalRankFusion([
    ['a', 'b', 'c'],
    ['b', 'c', 'd'],
  ]);
  t.same(
    f.map((x) => x.key),
    ['b', 'c', 'a', 'd'],
  );
  const want = { b: 1 / 62 + 1 / 61, c: 1 / 63 + 1 / 62, a: 1 / 61, d: 1 / 63 };
  for (const x of f) t.ok(Math.abs(x.score - want[x.key as keyof typeof want]) < 1e-15, x.key);
});

t.test('the hashing embedder: unit vectors, deterministic, similar texts closer', async (t) => {
  const e = new HashingEmbedder(256);
  const [a, b, c, a2] = await e.embed(
    ['the river flows north', 'the river flows south', 'copper mining company', 'the river flows north'],
    'document',
  );
  t.ok(Math.abs(dot(a, a) - 1) < 1e-5, 'unit length');
  t.same(Array.from(a), Array.from(a2), 'deterministic');
  t.ok(dot(a, b) > dot(a, c) + 0.3, `shared words score higher (${dot(a, b)} vs ${dot(a, c)})`);
});

const gen = syntheticCorpus({ pages: 300, seed: 3 });
let small: SearchIndex;
t.before(async () => {
  small = await SearchIndex.build(new Corpus(gen.pages));
});

t.test('a query made of a page title finds that page first (>= 95 % of pages)', async (t) => {
  t.equal(gen.pages.length, 300);
  t.equal(new Set(gen.pages.map((p) => p.id)).size, 300, 'unique page ids');
  for (const kind of ['hybrid', 'bm25'] as const) {
    let first = 0;
    for (const p of gen.pages) if ((await small.searchPages(p.title, 10, kind))[0].page_id === p.id) first++;
    t.ok(first / gen.pages.length >= 0.95, `${kind}: ${first}/${gen.pages.length} first`);
  }
});

t.test('questions that share no word with the page title still find the page (content is indexed)', async (t) => {
  const alias = gen.questions.filter((q) => q.by_alias);
  t.equal(alias.length, 300);
  let found = 0;
  for (const q of alias) {
    const title = new Set(words(gen.pages.find((p) => p.id === q.page_id)!.title));
    t.notOk(
      words(q.question).some((w) => title.has(w)),
      'no title word in the question',
    );
    const hits = await small.search_pages(q.question);
    t.equal(hits.length, 10);
    if (hits.some((h) => h.page_id === q.page_id)) found++;
  }
  t.ok(found / alias.length >= 0.9, `${found}/${alias.length} in the top 10`);
});

t.test('search_pages returns page hits; passages carry the chunk text; bad queries are errors', async (t) => {
  const p = gen.pages[7];
  const hits = await small.search_pages(`${p.title} founded`);
  t.match(hits[0], { page_id: p.id, title: p.title, similarity: Number });
  t.equal(new Set(hits.map((h) => h.page_id)).size, hits.length, 'each page once');
  const pass = await small.searchPassages(`In which year was ${p.title} founded?`, 3);
  t.equal(pass.length, 3);
  t.equal(pass[0].page_id, p.id);
  t.match(pass[0].text, new RegExp(`^${p.title}\\. History\\. ${p.title} was founded in \\d+`));
  await rejects(() => small.searchPages('  ?! '), 'ARGUMENT_INVALID', /non-empty text query/, t);
  t.same(small.view_sections(p.id).at(-1), { section_id: `${p.id}:full`, section_name: 'full page' });
});

t.test('save and load: the same answers, and damaged folders are INDEX_INVALID', async (t) => {
  const dir = join(tmp, 'idx');
  small.save(dir);
  const m = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8'));
  t.match(m, {
    format: 'slm-train-index',
    version: 1,
    embedder: { name: 'hashing-256', dim: 256 },
    params: { kind: 'hybrid', M: 32, efConstruction: 200, ef: 256 },
    pages: 300,
    hnsw: true,
  });
  const back = await SearchIndex.load(dir);
  t.notOk(back.exact, 'the HNSW graph is loaded');
  for (const q of [gen.questions[0].question, gen.questions[4].question, gen.pages[11].title])
    for (const kind of ['dense', 'bm25', 'hybrid'] as const)
      t.same(await back.searchPages(q, 10, kind), await small.searchPages(q, 10, kind), `${kind}: ${q}`);

  const bad = (name: string) => {
    const d = join(tmp, name);
    small.save(d);
    return d;
  };
  await rejects(() => SearchIndex.load(join(tmp, 'nothing-here')), 'INDEX_INVALID', /no manifest\.json.*slm-train index --corpus FILE/, t);
  const d1 = bad('idx-vec');
  writeFileSync(join(d1, 'vectors.f32'), readFileSync(join(d1, 'vectors.f32')).subarray(0, 1000));
  await rejects(() => SearchIndex.load(d1), 'INDEX_INVALID', /found 1000 bytes; the index is damaged/, t);
  const d2 = bad('idx-hnsw');
  writeFileSync(join(d2, 'hnsw.bin'), Buffer.alloc(64, 7));
  await rejects(() => SearchIndex.load(d2), 'INDEX_INVALID', /hnsw\.bin cannot be read/, t);
  const d3 = bad('idx-version');
  writeFileSync(join(d3, 'manifest.json'), JSON.stringify({ ...m, version: 99 }));
  await rejects(() => SearchIndex.load(d3), 'INDEX_INVALID', /found slm-train-index version 99/, t);
  const d4 = bad('idx-json');
  writeFileSync(join(d4, 'manifest.json'), '{');
  await rejects(() => SearchIndex.load(d4), 'INDEX_INVALID', /not valid JSON/, t);
  const d5 = bad('idx-pages');
  writeFileSync(join(d5, 'pages.json'), '[');
  await rejects(() => SearchIndex.load(d5), 'INDEX_INVALID', /pages\.json is missing or damaged/, t);
});

t.test('HNSW recall@10 against exact search >= 0.99 on ~20k chunks at the default ef', async (t) => {
  const big = syntheticCorpus({ pages: 5000, seed: 7 });
  const idx = await SearchIndex.build(new Corpus(big.pages), { kind: 'dense' });
  t.equal(idx.chunks.length, 20000);
  t.equal(idx.params.ef, 256);
  const qs = big.questions.filter((_, i) => i % 61 === 0).map((q) => q.question);
  let hit = 0;
  for (const q of qs) {
    const approx = await idx.denseChunks(q, 10);
    const exact = await idx.denseChunks(q, 10, true);
    // ann-benchmarks' convention: a neighbour counts when it is as close as the 10th exact one
    // (within 1e-3), so exact ties at the cut are not misses.
    const cut = exact[9].score - 1e-3;
    hit += approx.filter((a) => a.score >= cut).length;
  }
  const recall = hit / (qs.length * 10);
  t.ok(recall >= 0.99, `recall@10 ${recall.toFixed(4)} over ${qs.length} queries`);
});

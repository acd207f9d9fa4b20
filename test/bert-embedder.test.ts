// BERT sentence embedders as `retrieval.embedder` (issue 32 item 5), on a tiny random BERT folder
// written here (its own WordPiece tokenizer.json): the folder is recognised by its model_type and
// reaches search_pages through the config, pooling follows 1_Pooling/config.json, texts are cut at
// max_seq_length, an index over page titles (retrieval.text: titles) saves and loads, folders that
// are not such a model get coded errors, and the recall bench's gold and recall@k are what they say.
// Parity with sentence-transformers on the real all-MiniLM-L6-v2 is test/minilm.test.ts.
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { loadConfig } from '../lib/config/load.js';
import { writeSafetensors } from '../lib/model/safetensors.js';
import { BertEmbedder } from '../lib/retrieval/bert-embedder.js';
import { Corpus } from '../lib/retrieval/corpus.js';
import { SearchIndex, embedderFor } from '../lib/retrieval/index.js';
import { openIndex } from '../lib/train/environment.js';
import { goldQuestions, recallOf } from '../bench/recall.js';

const WORDS = [
  'the',
  'town',
  'river',
  'copper',
  'mine',
  'fair',
  'spring',
  'paris',
  'rome',
  'capital',
  'of',
  'france',
  'italy',
  'what',
  'is',
  'a',
  '.',
  '?',
  '##s',
  'berlin',
];
const VOCAB = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', ...WORDS];
const H = 16,
  I = 32,
  LAYERS = 2,
  POS = 32;

function tokenizerJson(): unknown {
  const special = (id: number, content: string) => ({
    id,
    special: true,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
  });
  return {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: VOCAB.slice(0, 5).map((c, i) => special(i, c)),
    normalizer: { type: 'BertNormalizer', clean_text: true, handle_chinese_chars: true, strip_accents: null, lowercase: true },
    pre_tokenizer: { type: 'BertPreTokenizer' },
    post_processor: {
      type: 'TemplateProcessing',
      single: [
        { SpecialToken: { id: '[CLS]', type_id: 0 } },
        { Sequence: { id: 'A', type_id: 0 } },
        { SpecialToken: { id: '[SEP]', type_id: 0 } },
      ],
      pair: [
        { SpecialToken: { id: '[CLS]', type_id: 0 } },
        { Sequence: { id: 'A', type_id: 0 } },
        { SpecialToken: { id: '[SEP]', type_id: 0 } },
        { Sequence: { id: 'B', type_id: 1 } },
        { SpecialToken: { id: '[SEP]', type_id: 1 } },
      ],
      special_tokens: { '[CLS]': { id: '[CLS]', ids: [2], tokens: ['[CLS]'] }, '[SEP]': { id: '[SEP]', ids: [3], tokens: ['[SEP]'] } },
    },
    decoder: { type: 'WordPiece', prefix: '##', cleanup: true },
    model: {
      type: 'WordPiece',
      unk_token: '[UNK]',
      continuing_subword_prefix: '##',
      max_input_chars_per_word: 100,
      vocab: Object.fromEntries(VOCAB.map((w, i) => [w, i])),
    },
  };
}

/** A random BERT sentence-embedder folder (seeded); `opts` changes a file to break it. */
function bertFolder(
  dir: string,
  opts: {
    pooling?: Record<string, boolean>;
    config?: Record<string, unknown>;
    maxSeq?: number;
    dropTensor?: string;
    noTokenizer?: boolean;
    prefix?: string;
  } = {},
): string {
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(join(dir, '1_Pooling'), { recursive: true });
  writeFileSync(
    join(dir, 'config.json'),
    JSON.stringify({
      model_type: 'bert',
      hidden_size: H,
      num_hidden_layers: LAYERS,
      num_attention_heads: 2,
      intermediate_size: I,
      hidden_act: 'gelu',
      layer_norm_eps: 1e-12,
      max_position_embeddings: POS,
      type_vocab_size: 2,
      vocab_size: VOCAB.length,
      ...opts.config,
    }),
  );
  writeFileSync(join(dir, 'sentence_bert_config.json'), JSON.stringify({ max_seq_length: opts.maxSeq ?? 24, do_lower_case: false }));
  writeFileSync(
    join(dir, '1_Pooling', 'config.json'),
    JSON.stringify(
      opts.pooling ?? {
        word_embedding_dimension: H,
        pooling_mode_cls_token: false,
        pooling_mode_mean_tokens: true,
        pooling_mode_max_tokens: false,
      },
    ),
  );
  if (!opts.noTokenizer) writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(tokenizerJson()));
  let s = 12345;
  const rnd = () => ((s = (s * 1103515245 + 12345) % 2 ** 31) / 2 ** 31 - 0.5) * 0.6;
  const shapes: Array<[string, number[]]> = [
    ['embeddings.word_embeddings.weight', [VOCAB.length, H]],
    ['embeddings.position_embeddings.weight', [POS, H]],
    ['embeddings.token_type_embeddings.weight', [2, H]],
    ['embeddings.LayerNorm.weight', [H]],
    ['embeddings.LayerNorm.bias', [H]],
  ];
  for (let l = 0; l < LAYERS; l++) {
    const b = `encoder.layer.${l}.`;
    for (const m of ['attention.self.query', 'attention.self.key', 'attention.self.value', 'attention.output.dense'])
      shapes.push([`${b}${m}.weight`, [H, H]], [`${b}${m}.bias`, [H]]);
    shapes.push(
      [`${b}intermediate.dense.weight`, [I, H]],
      [`${b}intermediate.dense.bias`, [I]],
      [`${b}output.dense.weight`, [H, I]],
      [`${b}output.dense.bias`, [H]],
    );
    for (const n of ['attention.output.LayerNorm', 'output.LayerNorm']) shapes.push([`${b}${n}.weight`, [H]], [`${b}${n}.bias`, [H]]);
  }
  const specs = shapes
    .filter(([n]) => n !== opts.dropTensor)
    .map(([name, shape]) => {
      const v = new Float32Array(shape.reduce((a, b) => a * b, 1)).map(() => (name.includes('LayerNorm.weight') ? 1 + rnd() * 0.2 : rnd()));
      return {
        name: (opts.prefix ?? '') + name,
        dtype: 'F32' as const,
        shape,
        fill: (out: Uint8Array, e: number) => out.set(new Uint8Array(v.buffer, e * 4, out.length)),
      };
    });
  writeSafetensors(join(dir, 'model.safetensors'), specs);
  return dir;
}

const root = t.testdir();
const dir = bertFolder(join(root, 'bert'));
const pages = [
  { id: 'paris', title: 'Paris', content: '# Paris\n\nParis is the capital of France.' },
  { id: 'rome', title: 'Rome', content: '# Rome\n\nRome is the capital of Italy.' },
  { id: 'copper', title: 'The copper mine', content: '# The copper mine\n\nA mine by the river.' },
];

t.test('a BERT folder is an embedder: unit vectors, batch-independent, cut at max_seq_length, pooled as 1_Pooling says', async (t) => {
  const e = await embedderFor(dir);
  t.ok(e instanceof BertEmbedder, 'model_type bert gives the BERT embedder');
  t.equal(e.name, `bert:${dir}`);
  t.equal(e.dim, H);
  const b = e as BertEmbedder;
  t.same(b.ids('The towns'), [2, 5, 6, 23, 3], '[CLS] the town ##s [SEP] (WordPiece, lower-cased)');
  t.same(b.ids(''), [2, 3], 'an empty text is [CLS] [SEP]');
  const long = b.ids('the river '.repeat(40));
  t.equal(long.length, 24, 'cut at sentence_bert_config.json max_seq_length');
  t.equal(long.at(-1), 3, 'keeping [SEP] last');
  const texts = ['The town lies on the river.', 'Copper is mined there.', 'a', 'the river '.repeat(40), 'The town lies on the river.'];
  const v = await e.embed(texts, 'document');
  for (const x of v) t.ok(Math.abs(Math.hypot(...x) - 1) < 1e-5, 'unit length');
  const small = BertEmbedder.load(dir, { batchTokens: 8 }); // one text per forward
  const w = await small.embed(texts, 'document');
  v.forEach((x, i) =>
    t.ok(
      x.every((y, k) => Math.abs(y - w[i][k]) < 1e-5),
      `text ${i}: the same vector alone as beside others`,
    ),
  );
  t.notSame(Array.from(v[0]), Array.from(v[1]), 'different texts, different vectors');

  const cls = BertEmbedder.load(
    bertFolder(join(root, 'bert-cls'), { pooling: { pooling_mode_cls_token: true, pooling_mode_mean_tokens: false } }),
  );
  t.equal(cls.config.pooling, 'cls');
  const [c0] = await cls.embed([texts[0]]);
  t.ok(
    c0.some((y, k) => Math.abs(y - v[0][k]) > 1e-3),
    'CLS pooling gives another vector than mean pooling',
  );
  const noPool = bertFolder(join(root, 'bert-nopool'));
  rmSync(join(noPool, '1_Pooling'), { recursive: true });
  t.equal(BertEmbedder.load(noPool).config.pooling, 'mean', "no 1_Pooling: mean, sentence-transformers' default");
  const prefixed = BertEmbedder.load(bertFolder(join(root, 'bert-prefixed'), { prefix: 'bert.' }));
  const [p0] = await prefixed.embed([texts[0]]);
  t.ok(
    p0.every((y, k) => Math.abs(y - v[0][k]) < 1e-6),
    'tensors named bert.* (a BertModel inside a task model) load the same',
  );
});

t.test('folders that are not a BERT sentence embedder get coded errors', async (t) => {
  const gpt2 = join(root, 'gpt2');
  mkdirSync(gpt2);
  writeFileSync(join(gpt2, 'config.json'), JSON.stringify({ model_type: 'gpt2' }));
  await t.rejects(embedderFor(gpt2), {
    code: 'MODEL_TYPE_UNSUPPORTED',
    message: /model_type "gpt2" is neither a sentence-transformers BERT/,
  });
  await t.rejects(embedderFor(join(root, 'nothing')), { code: 'MODEL_NOT_FOUND', message: /all-MiniLM-L6-v2/ });
  const noWeights = bertFolder(join(root, 'no-weights'));
  rmSync(join(noWeights, 'model.safetensors'));
  await t.rejects(embedderFor(noWeights), { code: 'WEIGHTS_MISSING' });
  await t.rejects(embedderFor(bertFolder(join(root, 'short'), { dropTensor: 'encoder.layer.1.output.dense.weight' })), {
    code: 'WEIGHTS_MISMATCH',
    message: /encoder\.layer\.1\.output\.dense\.weight of shape \[16, 32\].*found none/,
  });
  await t.rejects(embedderFor(bertFolder(join(root, 'wide'), { config: { hidden_size: 32 } })), { code: 'WEIGHTS_MISMATCH' });
  await t.rejects(embedderFor(bertFolder(join(root, 'no-tok'), { noTokenizer: true })), { code: 'TOKENIZER_MISSING' });
  await t.rejects(embedderFor(bertFolder(join(root, 'max-pool'), { pooling: { pooling_mode_max_tokens: true } })), {
    code: 'NOT_SUPPORTED',
    message: /max_tokens/,
  });
  await t.rejects(embedderFor(bertFolder(join(root, 'relu'), { config: { hidden_act: 'relu' } })), {
    code: 'NOT_SUPPORTED',
    message: /hidden_act "relu"/,
  });
});

t.test('retrieval.embedder (a BERT folder) and retrieval.text: titles reach the index; it saves and loads', async (t) => {
  const corpus = join(root, 'corpus.jsonl');
  writeFileSync(corpus, pages.map((p) => JSON.stringify(p)).join('\n') + '\n');
  writeFileSync(join(root, 'q.jsonl'), JSON.stringify({ question: 'What is the capital of France?', answer: 'Paris' }) + '\n');
  const cfgFile = join(root, 'c.yaml');
  writeFileSync(
    cfgFile,
    `stage: eval\nmodel: { path: m }\ndata: { questions: q.jsonl, corpus: corpus.jsonl, index: idx }\nretrieval: { kind: dense, embedder: bert, text: titles }\n`,
  );
  const cfg = loadConfig(cfgFile);
  const lines: string[] = [];
  const idx = await openIndex(cfg, (l) => lines.push(l));
  t.equal(idx.embedder.name, `bert:${dir}`, "the config's folder embeds");
  t.equal(idx.params.text, 'titles');
  t.same(
    idx.chunks.map((c) => c.text),
    ['Paris', 'Rome', 'The copper mine'],
    'one unit per page: its title',
  );
  t.match(lines.join('\n'), /3 pages, 3 titles, dense, bert:/);
  const want = await idx.searchPages('the town', 3);
  const [q] = await idx.embedder.embed(['the town'], 'query');
  const [v] = await idx.embedder.embed(['The copper mine'], 'document');
  t.equal(
    want.find((h) => h.page_id === 'copper')!.similarity,
    +q.reduce((a, x, i) => a + x * v[i], 0).toFixed(4),
    "a page's score is the cosine of the query and its title",
  );
  const manifest = JSON.parse(readFileSync(join(root, 'idx', 'manifest.json'), 'utf8'));
  t.match(manifest, { embedder: { name: `bert:${dir}`, dim: H }, params: { text: 'titles' }, chunks: 3 });
  const back = await SearchIndex.load(join(root, 'idx'));
  t.same(await back.searchPages('the town', 3), want, 'the loaded index re-loads the BERT folder and answers the same');
  // An index saved before retrieval.text existed has no params.text: content chunks.
  const chunked = await SearchIndex.build(new Corpus(pages), { kind: 'bm25' });
  chunked.save(join(root, 'old'));
  const m = JSON.parse(readFileSync(join(root, 'old', 'manifest.json'), 'utf8'));
  delete m.params.text;
  writeFileSync(join(root, 'old', 'manifest.json'), JSON.stringify(m));
  t.equal((await SearchIndex.load(join(root, 'old'))).params.text, 'chunks');
});

t.test('bench recall: gold pages are the pages holding the answer; recall@k counts a gold page in the first k', async (t) => {
  const qs = goldQuestions(pages, [
    { question: 'What is the capital of France?', answer: 'Paris' },
    { question: 'Which river?', answer: ['nothing here', 'river'] },
    { question: 'Capital of Italy?', answer: 'It' }, // "It" is no word of any page ("Italy" does not count)
    { question: 'What city is the capital?', answer: 'capital' },
  ]);
  t.same(
    qs.map((q) => q.gold),
    [['paris'], ['copper'], ['paris', 'rome']],
  );
  const idx = await SearchIndex.build(new Corpus(pages), { kind: 'bm25' });
  const got = await Promise.all(qs.map(async (q) => (await idx.searchPages(q.question, 10, 'bm25')).map((h) => h.page_id)));
  const want = (k: number) => +(qs.filter((q, i) => got[i].slice(0, k).some((id) => q.gold.includes(id))).length / qs.length).toFixed(4);
  t.same(await recallOf(idx, 'bm25', qs), { 'r@1': want(1), 'r@5': want(5), 'r@10': want(10) });
  t.equal(want(10), 1, 'every question has its gold page among the 3 pages');
});

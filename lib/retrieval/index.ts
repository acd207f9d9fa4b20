/**
 * The search index: pages cut into chunks (section text, ~150 words each, prefixed with the page
 * title, so a question whose words are in the content and not in the title still finds the page),
 * chunk vectors in an HNSW graph (hnswlib-node, cosine, M / efConstruction / ef set explicitly) with
 * exact search as the fallback and the reference, BM25 over the same chunks, and a hybrid by
 * reciprocal-rank fusion. Chunk scores are aggregated per page (max) for `search_pages`.
 *
 * Folder layout: manifest.json (format, version, embedder, kind, parameters), pages.json,
 * vectors.f32 (chunk vectors, little-endian float32), hnsw.bin. BM25 is rebuilt from the chunks
 * at load (deterministic, well under a second for tens of thousands of chunks).
 */
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createRequire } from 'node:module';
import { SlmError } from '../errors.js';
import { BM25, reciprocalRankFusion } from './bm25.js';
import { Corpus, type Page } from './corpus.js';
import { HashingEmbedder, dot, type Embedder } from './embedders.js';
import type { PageHit, SearchTools, SectionRef } from './types.js';
import { words } from './text.js';
import { localModelDir } from '../hub/download.js';
import { SUPPORTED_MODEL_TYPES } from '../model/config.js';

const INDEX_FORMAT = 'slm-train-index';
/** A file in an index folder while SearchIndex.save writes it (removed once the manifest is written). */
const WRITING = '.slm-train-index-writing';
const INDEX_VERSION = 1;

export type IndexKind = 'dense' | 'bm25' | 'hybrid';
/** What a page is searched by: its content chunks (title-prefixed), or its title alone (one vector per page, as the reference's search_pages). */
export type IndexText = 'chunks' | 'titles';
export const INDEX_TEXTS: readonly IndexText[] = ['chunks', 'titles'];
export interface IndexParams {
  kind: IndexKind;
  text: IndexText;
  M: number;
  efConstruction: number;
  ef: number;
  chunkWords: number;
}
// M 32 / ef 256: recall@10 0.99 against exact search on 20k synthetic chunks (bench retrieval; M 16 stalls near 0.98).
export const DEFAULT_PARAMS: IndexParams = { kind: 'hybrid', text: 'chunks', M: 32, efConstruction: 200, ef: 256, chunkWords: 150 };

export interface Chunk {
  page: number;
  text: string;
}
export interface Passage {
  page_id: string;
  title: string;
  text: string;
  score: number;
}

/** What the index needs of its lexical search (BM25 over the chunks). */
export interface LexicalSearch {
  search(query: string, k: number): Array<{ doc: number; score: number }>;
}

interface Hnsw {
  initIndex(max: number, m: number, efc: number, seed: number): void;
  addPoint(v: number[] | Float32Array, label: number): void;
  setEf(ef: number): void;
  searchKnn(v: number[] | Float32Array, k: number): { distances: number[]; neighbors: number[] };
  writeIndexSync(p: string): void;
  readIndexSync(p: string): void;
}
type HnswCtor = new (space: string, dim: number) => Hnsw;

/** hnswlib-node is an optional dependency: without it, search is exact (and says so). */
function hnswlib(): HnswCtor | undefined {
  try {
    return (createRequire(import.meta.url)('hnswlib-node') as { HierarchicalNSW: HnswCtor }).HierarchicalNSW;
  } catch {
    return undefined;
  }
}

export function chunkPages(corpus: Corpus, chunkWords: number, text: IndexText = 'chunks'): Chunk[] {
  if (text === 'titles') return corpus.pages.map((p, i) => ({ page: i, text: p.title }));
  const chunks: Chunk[] = [];
  corpus.pages.forEach((p, i) => {
    const secs = corpus.sections(p.id);
    let any = false;
    for (const s of secs) {
      const w = s.text.split(/\s+/).filter(Boolean);
      for (let o = 0; o < w.length; o += chunkWords) {
        chunks.push({
          page: i,
          text: `${p.title}. ${s.name === 'introduction' ? '' : s.name + '. '}${w.slice(o, o + chunkWords).join(' ')}`,
        });
        any = true;
      }
    }
    if (!any) chunks.push({ page: i, text: p.title });
  });
  return chunks;
}

/**
 * Where an index may be written: a folder that does not exist, an empty one, or an index slm-train
 * wrote (its manifest.json names this format, or it is being written: WRITING), which is replaced. Any other folder is refused
 * (INDEX_INVALID) before a file is written: its pages.json or vectors.f32 are not ours to overwrite.
 */
export function checkIndexFolder(dir: string): void {
  if (!existsSync(dir)) return;
  if (!statSync(dir).isDirectory())
    throw new SlmError('INDEX_INVALID', `${dir} is a file; an index is written into a folder. Choose a new or empty folder.`);
  if (readdirSync(dir).length === 0 || existsSync(join(dir, WRITING))) return;
  let format: unknown;
  try {
    format = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8'))?.format;
  } catch {
    format = undefined;
  }
  if (format !== INDEX_FORMAT)
    throw new SlmError(
      'INDEX_INVALID',
      `${dir} holds files but no index written by slm-train (no manifest.json of format ${INDEX_FORMAT}); writing the index there would overwrite its files (pages.json, vectors.f32, hnsw.bin). Choose a new or empty folder, or empty this one yourself.`,
    );
}

/** The embedder a manifest names: `hashing-D`, `qwen3:/abs/model/dir` (loaded on the native engine) or `bert:/abs/model/dir`. */
async function embedderOf(e: { name: string; dim: number }, dir: string): Promise<Embedder> {
  const h = /^hashing-(\d+)$/.exec(e.name);
  if (h) return new HashingEmbedder(Number(h[1]));
  if (e.name.startsWith('bert:')) {
    const model = e.name.slice('bert:'.length);
    if (!existsSync(join(model, 'config.json')))
      throw new SlmError(
        'MODEL_NOT_FOUND',
        `${dir} was built with the sentence embedder ${model}, which is not there any more; put it back or rebuild the index.`,
      );
    return (await import('./bert-embedder.js')).BertEmbedder.load(model);
  }
  if (e.name.startsWith('qwen3:')) {
    const model = e.name.slice('qwen3:'.length);
    if (!existsSync(join(model, 'config.json')))
      throw new SlmError(
        'MODEL_NOT_FOUND',
        `${dir} was built with the embedding model ${model}, which is not there any more; put it back or rebuild the index.`,
      );
    return (await import('./qwen-embedder.js')).QwenEmbedder.load(model);
  }
  throw new SlmError('NOT_SUPPORTED', `${dir} was built with the embedder ${e.name}, which this version cannot load.`);
}

/**
 * `hashing`, a BERT sentence-embedder folder (config.json model_type bert: all-MiniLM-L6-v2) or a
 * Qwen3 embedding model folder (what retrieval.embedder and --embedder take).
 */
export async function embedderFor(spec: string): Promise<Embedder> {
  if (spec === 'hashing') return new HashingEmbedder();
  spec = await localModelDir(spec); // hf:OWNER/NAME: downloaded once into the hub cache
  const cfgFile = join(spec, 'config.json');
  if (!existsSync(cfgFile))
    throw new SlmError(
      'MODEL_NOT_FOUND',
      `embedder ${spec}: expected "hashing", a sentence-transformers BERT folder (all-MiniLM-L6-v2: config.json, model.safetensors, tokenizer.json) or a Qwen3 embedding model folder, but ${spec} has no config.json.`,
    );
  let type: unknown;
  try {
    type = JSON.parse(readFileSync(cfgFile, 'utf8'))?.model_type;
  } catch (e) {
    throw new SlmError('MODEL_CONFIG_INVALID', `embedder ${spec}: ${cfgFile} is not valid JSON (${(e as Error).message}).`);
  }
  if (type === 'bert') return (await import('./bert-embedder.js')).BertEmbedder.load(spec);
  if (!(SUPPORTED_MODEL_TYPES as readonly unknown[]).includes(type))
    throw new SlmError(
      'MODEL_TYPE_UNSUPPORTED',
      `embedder ${spec}: config.json model_type ${JSON.stringify(type)} is neither a sentence-transformers BERT ("bert", e.g. all-MiniLM-L6-v2) nor a model the native engine runs as a Qwen3-style embedder (${SUPPORTED_MODEL_TYPES.join(', ')}). Use one of these folders, or "hashing".`,
    );
  return (await import('./qwen-embedder.js')).QwenEmbedder.load(spec);
}

export class SearchIndex implements SearchTools {
  private hnsw?: Hnsw;
  /** BM25 over the chunk texts (replaceable: the bench times the version before issue 19 through it). */
  lexical: LexicalSearch;
  readonly exact: boolean;

  constructor(
    readonly corpus: Corpus,
    readonly chunks: Chunk[],
    readonly vectors: Float32Array[],
    readonly embedder: Embedder,
    readonly params: IndexParams,
    hnsw?: Hnsw,
  ) {
    this.hnsw = hnsw;
    this.exact = !hnsw;
    this.lexical = new BM25(chunks.map((c) => c.text));
    hnsw?.setEf(params.ef);
  }

  /** `onProgress(phase, done, total)`: chunks embedded (`embed`), then inserted into the HNSW graph (`graph`). */
  static async build(
    corpus: Corpus,
    opts: Partial<IndexParams> & { embedder?: Embedder; onProgress?: (phase: 'embed' | 'graph', done: number, total: number) => void } = {},
  ): Promise<SearchIndex> {
    const params = { ...DEFAULT_PARAMS, ...opts };
    delete (params as { embedder?: unknown }).embedder;
    delete (params as { onProgress?: unknown }).onProgress;
    const embedder = opts.embedder ?? new HashingEmbedder();
    const chunks = chunkPages(corpus, params.chunkWords, params.text);
    const vectors: Float32Array[] = [];
    for (let i = 0; i < chunks.length; i += 256) {
      vectors.push(
        ...(await embedder.embed(
          chunks.slice(i, i + 256).map((c) => c.text),
          'document',
        )),
      );
      opts.onProgress?.('embed', vectors.length, chunks.length);
    }
    const H = hnswlib();
    let hnsw: Hnsw | undefined;
    if (H && params.kind !== 'bm25') {
      hnsw = new H('cosine', embedder.dim);
      hnsw.initIndex(chunks.length, params.M, params.efConstruction, 100);
      vectors.forEach((v, i) => {
        hnsw!.addPoint(Array.from(v), i);
        if ((i + 1) % 500 === 0 || i + 1 === vectors.length) opts.onProgress?.('graph', i + 1, vectors.length);
      });
    }
    return new SearchIndex(corpus, chunks, vectors, embedder, params, hnsw);
  }

  /** Changes the HNSW search breadth (recall against speed) for the searches that follow. */
  setEf(ef: number): void {
    if (!Number.isInteger(ef) || ef < 1) throw new SlmError('ARGUMENT_INVALID', `ef expects a positive integer, found ${ef}.`);
    this.params.ef = ef;
    this.hnsw?.setEf(ef);
  }

  /** Top-k chunks by vector similarity (HNSW, or exact when forced or unavailable). */
  async denseChunks(query: string, k: number, exact = false): Promise<Array<{ chunk: number; score: number }>> {
    const [q] = await this.embedder.embed([query], 'query');
    if (this.hnsw && !exact) {
      const r = this.hnsw.searchKnn(Array.from(q), Math.min(k, this.chunks.length));
      return r.neighbors.map((n, i) => ({ chunk: n, score: 1 - r.distances[i] }));
    }
    const scored = this.vectors.map((v, i) => ({ chunk: i, score: dot(q, v) }));
    scored.sort((a, b) => b.score - a.score || a.chunk - b.chunk);
    return scored.slice(0, k);
  }

  private rankPages(chunks: Array<{ chunk: number; score: number }>): Array<{ page: number; score: number }> {
    const best = new Map<number, number>();
    for (const c of chunks) {
      const p = this.chunks[c.chunk].page;
      if (!best.has(p) || best.get(p)! < c.score) best.set(p, c.score);
    }
    return [...best].map(([page, score]) => ({ page, score })).sort((a, b) => b.score - a.score || a.page - b.page);
  }

  async searchPages(query: string, k = 10, kind: IndexKind = this.params.kind): Promise<PageHit[]> {
    if (typeof query !== 'string' || !words(query).length)
      throw new SlmError('ARGUMENT_INVALID', `search_pages expects a non-empty text query, found ${JSON.stringify(query)}.`);
    const hit = (page: number, score: number): PageHit => ({
      page_id: this.corpus.pages[page].id,
      title: this.corpus.pages[page].title,
      similarity: +score.toFixed(4),
    });
    const pool = Math.max(50, k * 5);
    const dense = kind === 'bm25' ? [] : this.rankPages(await this.denseChunks(query, pool));
    const lex = kind === 'dense' ? [] : this.rankPages(this.lexical.search(query, pool).map((d) => ({ chunk: d.doc, score: d.score })));
    if (kind === 'dense') return dense.slice(0, k).map((d) => hit(d.page, d.score));
    if (kind === 'bm25') return lex.slice(0, k).map((d) => hit(d.page, d.score));
    const fused = reciprocalRankFusion([dense.map((d) => String(d.page)), lex.map((d) => String(d.page))]);
    return fused.slice(0, k).map((f) => hit(Number(f.key), f.score));
  }

  /** The top-k chunks as passages (the `<information>` of the tags protocol). */
  async searchPassages(query: string, k = 3): Promise<Passage[]> {
    const dense = this.params.kind === 'bm25' ? [] : await this.denseChunks(query, Math.max(50, k * 5));
    const lex =
      this.params.kind === 'dense' ? [] : this.lexical.search(query, Math.max(50, k * 5)).map((d) => ({ chunk: d.doc, score: d.score }));
    const keys =
      this.params.kind === 'hybrid'
        ? reciprocalRankFusion([dense.map((d) => String(d.chunk)), lex.map((d) => String(d.chunk))])
        : (dense.length ? dense : lex).map((d) => ({ key: String(d.chunk), score: d.score }));
    return keys.slice(0, k).map(({ key, score }) => {
      const c = this.chunks[Number(key)];
      const p: Page = this.corpus.pages[c.page];
      return { page_id: p.id, title: p.title, text: c.text, score };
    });
  }

  // SearchTools
  search_pages(query: string): Promise<PageHit[]> {
    return this.searchPages(query, 10);
  }
  view_sections(pageId: string): SectionRef[] {
    return this.corpus.view_sections(pageId);
  }
  read_section(sectionId: string): string {
    return this.corpus.read_section(sectionId);
  }

  save(dir: string): void {
    checkIndexFolder(dir);
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, WRITING), ''); // until the manifest is written (another rank may save the same index meanwhile)
    const buf = new Float32Array(this.vectors.length * this.embedder.dim);
    this.vectors.forEach((v, i) => buf.set(v, i * this.embedder.dim));
    writeFileSync(join(dir, 'vectors.f32'), new Uint8Array(buf.buffer));
    writeFileSync(join(dir, 'pages.json'), JSON.stringify(this.corpus.pages));
    if (this.hnsw) this.hnsw.writeIndexSync(join(dir, 'hnsw.bin'));
    writeFileSync(
      join(dir, 'manifest.json'),
      JSON.stringify(
        {
          format: INDEX_FORMAT,
          version: INDEX_VERSION,
          embedder: { name: this.embedder.name, dim: this.embedder.dim },
          params: this.params,
          chunks: this.chunks.length,
          pages: this.corpus.pages.length,
          hnsw: !!this.hnsw,
          created: new Date().toISOString(),
        },
        null,
        2,
      ) + '\n',
    );
    rmSync(join(dir, WRITING), { force: true });
  }

  static async load(dir: string, opts: { embedder?: Embedder } = {}): Promise<SearchIndex> {
    const mf = join(dir, 'manifest.json');
    if (!existsSync(mf))
      throw new SlmError(
        'INDEX_INVALID',
        `${dir} is not a search index (no manifest.json). Build one with \`slm-train index --corpus FILE --out ${dir}\`.`,
      );
    let m: {
      format?: string;
      version?: number;
      embedder?: { name: string; dim: number };
      params?: IndexParams;
      chunks?: number;
      hnsw?: boolean;
    };
    try {
      m = JSON.parse(readFileSync(mf, 'utf8'));
    } catch (e) {
      throw new SlmError('INDEX_INVALID', `${mf} is not valid JSON (${(e as Error).message}); rebuild the index.`);
    }
    if (m.format !== INDEX_FORMAT || m.version !== INDEX_VERSION || !m.embedder || !m.params)
      throw new SlmError(
        'INDEX_INVALID',
        `${dir}: expected an index of format ${INDEX_FORMAT} version ${INDEX_VERSION}, found ${m.format} version ${m.version}; rebuild it with \`slm-train index\`.`,
      );
    const embedder = opts.embedder ?? (await embedderOf(m.embedder, dir));
    if (embedder.name !== m.embedder.name || embedder.dim !== m.embedder.dim)
      throw new SlmError(
        'INDEX_INVALID',
        `${dir} was built with the embedder ${m.embedder.name} (dimension ${m.embedder.dim}), but ${embedder.name} (dimension ${embedder.dim}) was given; queries must be embedded as the chunks were. Rebuild the index or use its embedder.`,
      );
    let pages: Page[];
    try {
      pages = JSON.parse(readFileSync(join(dir, 'pages.json'), 'utf8'));
    } catch {
      throw new SlmError('INDEX_INVALID', `${dir}/pages.json is missing or damaged; rebuild the index.`);
    }
    const corpus = new Corpus(pages);
    m.params.text ??= 'chunks'; // indexes written before `text` existed
    const chunks = chunkPages(corpus, m.params.chunkWords, m.params.text);
    const raw = existsSync(join(dir, 'vectors.f32')) ? readFileSync(join(dir, 'vectors.f32')) : Buffer.alloc(0);
    if (chunks.length !== m.chunks || raw.length !== chunks.length * embedder.dim * 4)
      throw new SlmError(
        'INDEX_INVALID',
        `${dir}: expected ${m.chunks} chunk vectors of dimension ${embedder.dim} (${(m.chunks ?? 0) * embedder.dim * 4} bytes), found ${raw.length} bytes; the index is damaged — rebuild it.`,
      );
    const all = new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.length));
    const vectors = chunks.map((_, i) => all.subarray(i * embedder.dim, (i + 1) * embedder.dim));
    let hnsw: Hnsw | undefined;
    const H = hnswlib();
    if (H && m.hnsw && existsSync(join(dir, 'hnsw.bin'))) {
      hnsw = new H('cosine', embedder.dim);
      try {
        hnsw.readIndexSync(join(dir, 'hnsw.bin'));
      } catch (e) {
        throw new SlmError('INDEX_INVALID', `${dir}/hnsw.bin cannot be read (${(e as Error).message}); rebuild the index.`);
      }
    }
    return new SearchIndex(corpus, chunks, vectors, embedder, m.params, hnsw);
  }
}

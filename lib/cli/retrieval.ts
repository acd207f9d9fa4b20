/**
 * `slm-train index --corpus FILE --out DIR`, `slm-train search (--index DIR | --corpus FILE) QUERY`
 * `slm-train exec (--index DIR | --corpus FILE) [--sandbox python|quickjs] [--file F | -]` and
 * `slm-train serve-retriever (--index DIR | --corpus FILE) --port N` (Search-R1's retrieval API).
 */
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { loadToolsModule } from '../extensions.js';
import type { CommandModule } from 'yargs';
import { SlmError } from '../errors.js';
import { Corpus } from '../retrieval/corpus.js';
import {
  DEFAULT_PARAMS,
  INDEX_TEXTS,
  SearchIndex,
  checkIndexFolder,
  embedderFor,
  type IndexKind,
  type IndexText,
} from '../retrieval/index.js';
import {
  createSandbox,
  filesystemLine,
  ISOLATION_ORDER,
  MAX_TIMEOUT_S,
  type IsolationLevel,
  type PythonSandboxPool,
} from '../sandbox/index.js';
import { MAX_TOPK, RetrieverServer } from '../retrieval/server.js';
import { maxBodyBytes } from '../serve/http.js';
import { phasedProgress, progressLog } from '../util/progress.js';
import { print, untilSignal } from './common.js';

const KINDS = ['hybrid', 'dense', 'bm25'] as const;
const log = progressLog(process.stderr, '[slm-train] ');

interface Source {
  index?: string;
  corpus?: string;
}

/** The index of `--index DIR`, or one built in memory from `--corpus FILE`; exactly one of them. */
async function openSource(source: Source, kind?: IndexKind): Promise<SearchIndex> {
  if ((source.index === undefined) === (source.corpus === undefined))
    throw new SlmError(
      'ARGUMENT_INVALID',
      `give exactly one of --index DIR (built by \`slm-train index\`) or --corpus FILE (JSONL/JSON/Parquet rows {id, title, content}); found ${source.index === undefined ? 'neither' : 'both'}.`,
    );
  if (source.index !== undefined) return SearchIndex.load(source.index);
  return SearchIndex.build(await Corpus.load(source.corpus!), kind ? { kind } : {});
}

interface IndexArgs {
  corpus: string;
  out: string;
  embedder: string;
  kind: IndexKind;
  text: IndexText;
  M: number;
  'ef-construction': number;
  ef: number;
  json?: boolean;
}

export const indexCommand: CommandModule<object, IndexArgs> = {
  command: 'index',
  describe: 'build the search index of a corpus (HNSW over chunk vectors + BM25) and save it',
  builder: (yargs) =>
    yargs
      .option('corpus', { type: 'string', demandOption: true, describe: 'JSONL/JSON/Parquet rows {id, title, content}' })
      .option('out', { type: 'string', demandOption: true, describe: 'the index folder to write' })
      .option('embedder', {
        type: 'string',
        default: 'hashing',
        describe:
          'hashing, a sentence-transformers BERT folder (all-MiniLM-L6-v2: mean pooling), or a Qwen3 embedding model folder (last-token pooling); models run on the native engine',
      })
      .option('text', {
        choices: INDEX_TEXTS,
        default: DEFAULT_PARAMS.text,
        describe: "what pages are searched by: content chunks, or titles alone (one vector per page, as the reference's search_pages)",
      })
      .option('kind', { choices: KINDS, default: DEFAULT_PARAMS.kind, describe: 'what search_pages uses' })
      .option('M', { type: 'number', default: DEFAULT_PARAMS.M, describe: 'HNSW links per node' })
      .option('ef-construction', { type: 'number', default: DEFAULT_PARAMS.efConstruction, describe: 'HNSW build breadth' })
      .option('ef', { type: 'number', default: DEFAULT_PARAMS.ef, describe: 'HNSW search breadth' })
      .option('json', { type: 'boolean', describe: 'print the manifest as JSON' }) as never,
  handler: async (args) => {
    for (const [k, v] of [
      ['M', args.M],
      ['ef-construction', args['ef-construction']],
      ['ef', args.ef],
    ] as const)
      if (!Number.isInteger(v) || v < 1) throw new SlmError('ARGUMENT_INVALID', `--${k} expects a positive integer, found ${v}.`);
    checkIndexFolder(args.out); // before building: the index is saved there
    const t0 = performance.now();
    const embedder = await embedderFor(args.embedder);
    const corpus = await Corpus.load(args.corpus);
    log(
      `index: ${corpus.pages.length} pages from ${args.corpus}; building (${args.kind} over ${args.text}, ${embedder.name}, M ${args.M}, efConstruction ${args['ef-construction']})`,
    );
    const bars = phasedProgress('index', 'chunks', { stream: process.stderr });
    let idx: SearchIndex;
    try {
      idx = await SearchIndex.build(corpus, {
        kind: args.kind,
        text: args.text,
        M: args.M,
        efConstruction: args['ef-construction'],
        ef: args.ef,
        embedder,
        onProgress: bars.update,
      });
    } finally {
      bars.stop();
    }
    idx.save(args.out);
    const s = (performance.now() - t0) / 1e3;
    log(`index: ${corpus.pages.length} pages, ${idx.chunks.length} chunks in ${s.toFixed(2)} s -> ${args.out}`);
    const summary = {
      out: args.out,
      pages: corpus.pages.length,
      chunks: idx.chunks.length,
      kind: idx.params.kind,
      embedder: idx.embedder.name,
      hnsw: !idx.exact,
      seconds: +s.toFixed(2),
    };
    if (args.json) print(JSON.stringify(summary));
    else
      print(
        `indexed ${summary.pages} pages (${summary.chunks} chunks, ${summary.embedder}, ${summary.kind}${summary.hnsw || summary.kind === 'bm25' ? '' : ', exact search: hnswlib-node is not installed'}) in ${s.toFixed(1)} s -> ${args.out}`,
      );
  },
};

interface SearchArgs extends Source {
  query: string;
  k: number;
  kind?: IndexKind;
  json?: boolean;
}

export const searchCommand: CommandModule<object, SearchArgs> = {
  command: 'search <query>',
  describe: 'what search_pages(query) returns for an index or a corpus',
  builder: (yargs) =>
    yargs
      .positional('query', { type: 'string', describe: 'free-text query' })
      .option('index', { type: 'string', describe: 'an index folder (slm-train index)' })
      .option('corpus', { type: 'string', describe: 'a corpus file (indexed in memory)' })
      .option('k', { type: 'number', default: 10, describe: 'results' })
      .option('kind', { choices: KINDS, describe: "retrieval (default: the index's)" })
      .option('json', { type: 'boolean', describe: 'print [{page_id, title, similarity}]' }) as never,
  handler: async (args) => {
    const idx = await openSource(args, args.kind);
    const hits = await idx.searchPages(String(args.query), args.k, args.kind);
    if (args.json) return print(JSON.stringify(hits));
    print(
      hits.map((h, i) => `${String(i + 1).padStart(3)}  ${h.similarity.toFixed(4)}  ${h.page_id}  ${h.title}`).join('\n') || '(no results)',
    );
  },
};

interface ExecArgs extends Source {
  stdin?: string;
  sandbox: 'python' | 'quickjs';
  file?: string;
  'timeout-s': number;
  json?: boolean;
  'require-isolation'?: IsolationLevel;
  'tools-module'?: string;
}

const LEVELS_BEST_FIRST = [...ISOLATION_ORDER].reverse() as IsolationLevel[];

export const execCommand: CommandModule<object, ExecArgs> = {
  command: 'exec [stdin]',
  describe: 'run one program in the sandbox with search_pages / view_sections / read_section bound to a corpus',
  builder: (yargs) =>
    yargs
      .positional('stdin', { type: 'string', describe: '- : read the program from stdin (the default without --file)' })
      .option('index', { type: 'string', describe: 'an index folder (slm-train index)' })
      .option('corpus', { type: 'string', describe: 'a corpus file (indexed in memory)' })
      .option('sandbox', { choices: ['python', 'quickjs'] as const, default: 'python' as const })
      .option('file', { type: 'string', describe: 'the program file (default: stdin)' })
      .option('timeout-s', { type: 'number', default: 10, describe: 'wall-clock limit' })
      .option('require-isolation', {
        choices: LEVELS_BEST_FIRST,
        describe: 'python: refuse to run below this isolation level (as sandbox.require_isolation in a config)',
      })
      .option('tools-module', {
        type: 'string',
        describe: 'a JavaScript module exporting extra tools programs can call (as sandbox.tools_module in a config)',
      })
      .option('json', { type: 'boolean', describe: 'print {"stdout", "error", "timed_out", "calls"}' }) as never,
  handler: async (args) => {
    if (!(args['timeout-s'] > 0 && args['timeout-s'] <= MAX_TIMEOUT_S))
      throw new SlmError(
        'ARGUMENT_INVALID',
        `--timeout-s expects a positive number of seconds, at most ${MAX_TIMEOUT_S} (24 h), found ${args['timeout-s']}.`,
      );
    if (args.stdin === '') args.stdin = '-'; // yargs hands a lone "-" over as ""
    if (args.stdin !== undefined && args.stdin !== '-')
      throw new SlmError(
        'ARGUMENT_INVALID',
        `exec takes the program from --file F or from stdin (-); found the argument ${JSON.stringify(args.stdin)}.`,
      );
    if (args.stdin === '-' && args.file !== undefined)
      throw new SlmError('ARGUMENT_INVALID', 'give the program either with --file F or on stdin (-), not both.');
    const fromStdin = args.file === undefined;
    if (fromStdin && process.stdin.isTTY)
      throw new SlmError('ARGUMENT_INVALID', 'no program: give --file F, or pipe the program into stdin (--file -).');
    let code: string;
    try {
      code = readFileSync(fromStdin ? 0 : args.file!, 'utf8');
    } catch (e) {
      throw new SlmError('FILE_NOT_FOUND', `cannot read the program ${fromStdin ? 'from stdin' : args.file}: ${(e as Error).message}.`);
    }
    const extra = args['tools-module'] ? { extraTools: await loadToolsModule(resolve(args['tools-module']), '--tools-module') } : {};
    const idx = await openSource(args);
    const sb = await createSandbox(
      args.sandbox === 'python'
        ? {
            kind: 'python',
            tools: idx,
            ...extra,
            timeoutMs: args['timeout-s'] * 1000,
            ...(args['require-isolation'] ? { requireIsolation: args['require-isolation'] } : {}),
          }
        : { kind: 'quickjs', tools: idx, ...extra, timeoutMs: args['timeout-s'] * 1000 },
    );
    log(
      args.sandbox === 'python'
        ? `sandbox: isolation ${filesystemLine((sb as PythonSandboxPool).isolation)}`
        : 'sandbox: quickjs (WebAssembly): a program can read no file at all',
    );
    try {
      const r = await sb.run(code);
      if (args.json) print(JSON.stringify({ stdout: r.stdout, error: r.error, timed_out: r.timed_out, calls: r.calls }));
      else {
        if (r.stdout) process.stdout.write(r.stdout.endsWith('\n') ? r.stdout : r.stdout + '\n');
        if (r.error) log(`the program raised: ${r.error}`);
        if (r.timed_out) log(`the program ran past ${args['timeout-s']} s and was stopped`);
      }
    } finally {
      await sb.close();
    }
  },
};

interface ServeRetrieverArgs extends Source {
  port: number;
  host: string;
  topk: number;
  'max-body-mb': number;
}

export const serveRetrieverCommand: CommandModule<object, ServeRetrieverArgs> = {
  command: 'serve-retriever',
  describe:
    "serve an index with Search-R1's retrieval API (POST /retrieve {queries, topk, return_scores}) for Search-R1, verl or `retrieval.kind: http`",
  builder: (yargs) =>
    yargs
      .option('index', { type: 'string', describe: 'an index folder (slm-train index)' })
      .option('corpus', { type: 'string', describe: 'a corpus file (indexed in memory at start)' })
      .option('port', { type: 'number', default: 8000, describe: 'port (0 = any free port)' })
      .option('host', { type: 'string', default: '127.0.0.1', describe: 'address to listen on (0.0.0.0 for other machines)' })
      .option('topk', { type: 'number', default: 3, describe: 'passages per query when a request gives no topk' })
      .option('max-body-mb', { type: 'number', default: 32, describe: 'the largest request body in MiB; a larger one is a 413' }) as never,
  handler: async (args) => {
    if (!Number.isInteger(args.topk) || args.topk < 1 || args.topk > MAX_TOPK)
      throw new SlmError('ARGUMENT_INVALID', `--topk expects an integer from 1 to ${MAX_TOPK}, found ${args.topk}.`);
    const bodyLimit = maxBodyBytes(args['max-body-mb']);
    const index = await openSource(args);
    const server = new RetrieverServer({ index, port: args.port, host: args.host, topK: args.topk, maxBodyBytes: bodyLimit, log });
    const port = await server.listen();
    print(
      `serving ${args.index ?? args.corpus} (${index.corpus.pages.length} pages, ${index.chunks.length} chunks, ${index.params.kind}) on http://${args.host}:${port}/retrieve`,
    );
    await untilSignal();
    await server.close();
  },
};

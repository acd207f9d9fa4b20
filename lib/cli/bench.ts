/** `slm-train bench [engine|train|sandbox|retrieval|rollout|serve|recall] [--json] [--quick] [--out FILE] [--readme FILE] [--compare-unshared] [--rounds N] [--data DIR] [--llama-cpp-bin DIR]` */
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, totalmem } from 'node:os';
import type { CommandModule } from 'yargs';
import type { BenchOptions, BenchReport } from '../../bench/types.js';
import { llamaCppBin } from '../../bench/llama-cpp-source.js';
import { SlmError } from '../errors.js';
import { print } from './common.js';
import { native } from '../engine/runtime.js';

type Runner = (o: BenchOptions) => Promise<BenchReport>;
/** Benchmarks by kind; a kind whose subsystem has not landed yet is listed with null. */
const KINDS: Record<string, (() => Promise<Runner>) | null> = {
  engine: async () => (await import('../../bench/engine.js')).runBench,
  train: async () => (await import('../../bench/train.js')).runBench,
  sandbox: async () => (await import('../../bench/sandbox.js')).runBench,
  retrieval: async () => (await import('../../bench/retrieval.js')).runBench,
  rollout: async () => (await import('../../bench/rollout.js')).runBench,
  serve: async () => (await import('../../bench/serve.js')).runBench,
  recall: async () => (await import('../../bench/recall.js')).runBench,
};
/** Kinds run only when named: they need data and a model folder that `slm-train bench` alone has not got. */
const NAMED_ONLY = new Set(['recall']);
/** The most rounds `bench rollout --rounds` / `bench serve --rounds` run (each ~20 s on the small preset). */
const MAX_ROUNDS = 50;

interface Args {
  kind?: string;
  json?: boolean;
  quick?: boolean;
  out?: string;
  readme?: string;
  model?: string;
  compareUnshared?: boolean;
  rounds?: number;
  data?: string;
  llamaCppBin?: string;
}

/**
 * The markers of the benchmark block a run writes: `<!-- bench:LEVEL -->` ... `<!-- /bench:LEVEL -->`
 * for the CPU kernels' instruction-set level in force (avx512-bf16, avx512, avx2, none), so that a
 * README keeps one block per kind of CPU; a file without them gets the plain `<!-- bench -->` block.
 */
function markers(text: string | null): { begin: string; end: string; level: string } {
  const level = native().version().cpuIsa;
  const own = { begin: `<!-- bench:${level} -->`, end: `<!-- /bench:${level} -->`, level };
  return text === null || text.includes(own.begin) || !text.includes('<!-- bench -->')
    ? own
    : { begin: '<!-- bench -->', end: '<!-- /bench -->', level };
}

/** Where the benchmark block of a markdown file begins and ends (checked before any benchmark runs). */
function readmeBlock(file: string): { text: string; a: number; b: number; begin: string } {
  if (!existsSync(file)) {
    const m = markers(null);
    throw new SlmError('FILE_NOT_FOUND', `--readme ${file}: no such file; expected a markdown file holding ${m.begin} ... ${m.end}.`);
  }
  const text = readFileSync(file, 'utf8');
  const { begin, end, level } = markers(text);
  const a = text.indexOf(begin);
  const b = text.indexOf(end, a + begin.length);
  if (a < 0 || b < 0)
    throw new SlmError(
      'ARGUMENT_INVALID',
      `--readme ${file}: expected the markers ${begin} and ${end} (in that order; this CPU's kernels run at ${level}; or <!-- bench --> and <!-- /bench -->) around the benchmark tables, found ${a < 0 ? `no ${begin}` : `no ${end} after it`}. Add them where the tables belong.`,
    );
  return { text, a, b, begin };
}

/** Replaces what lies between the block's markers in a markdown file with `md`. */
function writeReadmeBlock(file: string, md: string): void {
  const { text, a, b, begin } = readmeBlock(file);
  writeFileSync(file, `${text.slice(0, a + begin.length)}\n${md.trim()}\n${text.slice(b)}`);
}

/** The CPU's vector extensions that decide matmul speed (Linux /proc/cpuinfo); empty elsewhere. */
function cpuFlags(): string[] {
  try {
    const line =
      readFileSync('/proc/cpuinfo', 'utf8')
        .split('\n')
        .find((l) => l.startsWith('flags')) ?? '';
    const have = new Set(line.split(':')[1]?.trim().split(/\s+/) ?? []);
    return ['avx2', 'avx512f', 'avx512_bf16', 'amx_bf16'].filter((f) => have.has(f));
  } catch {
    return [];
  }
}

function machineLine(): string {
  const cpu = cpus()[0]?.model ?? 'unknown CPU';
  const flags = cpuFlags();
  return `${new Date().toISOString().slice(0, 10)}, ${cpu}${flags.length ? ` (${flags.join(', ')})` : ''}, ${cpus().length} cores, ${(totalmem() / 2 ** 30).toFixed(0)} GiB`;
}

/** What ran the figures: the engine's CPU kernels, ATen's and OpenBLAS's instruction sets, and the caps set. */
interface BenchSoftware {
  /** The engine's CPU kernels' level in force (doctor's "CPU kernels") and the one the CPU has. */
  kernels: string;
  detected: string;
  /** ATen's CPU capability in force (libtorch's "CPU capability usage"; ATEN_CPU_CAPABILITY caps it). */
  aten?: string;
  /** OPENBLAS_CORETYPE as OpenBLAS saw it (slm-train sets SKYLAKEX on AVX-512 CPUs unless it is set). */
  openblas_coretype?: string;
  /** SLM_TRAIN_CPU_ISA when set: a run capped below the CPU's level says so. */
  cap?: string;
}

function software(): BenchSoftware | undefined {
  try {
    const v = native().version();
    return {
      kernels: v.cpuIsa,
      detected: v.cpuIsaDetected,
      aten: /CPU capability usage: (\S+)/.exec(v.config)?.[1],
      openblas_coretype: process.env.OPENBLAS_CORETYPE,
      cap: process.env.SLM_TRAIN_CPU_ISA,
    };
  } catch {
    return undefined; // no addon: the benchmarks that need it say so themselves
  }
}

/** The software line of a table's header: "CPU kernels avx2 (SLM_TRAIN_CPU_ISA=avx2; the CPU has avx512-bf16), ATen AVX2, OpenBLAS HASWELL". */
function softwareLine(s: BenchSoftware): string {
  const capped = s.kernels !== s.detected ? ` (${s.cap ? `SLM_TRAIN_CPU_ISA=${s.cap}; ` : ''}the CPU has ${s.detected})` : '';
  return [`CPU kernels ${s.kernels}${capped}`, s.aten && `ATen ${s.aten}`, s.openblas_coretype && `OpenBLAS ${s.openblas_coretype}`]
    .filter(Boolean)
    .join(', ');
}

export const benchCommand: CommandModule<object, Args> = {
  command: 'bench [kind]',
  describe: 'benchmarks (JSON and a table), each figure next to the limit measured in the same run',
  builder: (yargs) =>
    yargs
      .positional('kind', { choices: Object.keys(KINDS), describe: 'one benchmark; all when omitted' })
      .option('json', { type: 'boolean', describe: 'print JSON only' })
      .option('quick', { type: 'boolean', describe: 'smaller sizes (all benchmarks in ~2 minutes on 2 cores)' })
      .option('out', { type: 'string', describe: 'also write the JSON report here (and the table to FILE.md)' })
      .option('readme', {
        type: 'string',
        describe:
          "replace the tables between <!-- bench:LEVEL --> and <!-- /bench:LEVEL --> (LEVEL: the CPU kernels' instruction set, as doctor shows it), or <!-- bench --> and <!-- /bench -->, in this markdown file (README.md)",
      })
      .option('model', {
        type: 'string',
        describe:
          'a model folder instead of the generated small preset (engine, train, rollout, serve; recall: the all-MiniLM-L6-v2 folder)',
      })
      .option('data', {
        type: 'string',
        describe:
          'recall: the folder holding wiki-excerpts/page_excerpts.jsonl and wiki-trivia/questions.jsonl (default $SLM_SHARED_DIR/data, else ../shared/data)',
      })
      .option('compare-unshared', {
        type: 'boolean',
        describe:
          'rollout: also measure the old generate path (no shared prefixes, no multi-turn cache reuse) beside each K in the same run',
      })
      .option('rounds', {
        type: 'number',
        describe:
          'rollout: rounds of the largest K against K 1 back to back, alternating which goes first, for a median of K / K 1 over the rooflines; serve: rounds of 16 clients each beside the batch-16 decode measured just before and after it, for a median of their fractions; engine: rounds of the batch-16 decode in float32 and bfloat16 (default 3; --quick 1; 0: none)',
      })
      .option('llama-cpp-bin', {
        type: 'string',
        describe:
          'engine: the bin folder of llama.cpp built from source (llama-bench, llama-batched-bench), run on the same model as F32 and BF16 GGUFs beside slm-train (default $SLM_TRAIN_LLAMA_CPP_BIN)',
      }) as never,
  handler: async (args) => {
    if (args.readme) readmeBlock(args.readme); // a bad file fails now, not after the benchmarks
    if (args.llamaCppBin !== undefined) llamaCppBin(args.llamaCppBin); // so does a folder without llama.cpp's tools
    if (args.rounds !== undefined && !(Number.isInteger(args.rounds) && args.rounds >= 0 && args.rounds <= MAX_ROUNDS))
      throw new SlmError(
        'ARGUMENT_INVALID',
        `--rounds expects an integer from 0 to ${MAX_ROUNDS} (rounds of the largest K against K 1 in bench rollout, of 16 clients in bench serve, of the batch-16 decode in bench engine), found ${args.rounds}.`,
      );
    const kinds = args.kind ? [args.kind] : Object.keys(KINDS).filter((k) => !NAMED_ONLY.has(k));
    const log = (s: string) => process.stderr.write(`[bench] ${s}\n`);
    const reports: BenchReport[] = [];
    const skipped: string[] = [];
    const seconds: Record<string, number> = {};
    const t0 = performance.now();
    for (const k of kinds) {
      const load = KINDS[k];
      if (!load) {
        if (args.kind)
          throw new SlmError(
            'NOT_SUPPORTED',
            `the ${k} benchmark is not available yet (its subsystem has not landed); available: ${Object.keys(KINDS)
              .filter((x) => KINDS[x])
              .join(', ')}.`,
          );
        skipped.push(k);
        continue;
      }
      const run = await load();
      const t = performance.now();
      reports.push(
        await run({
          quick: args.quick,
          model: args.model,
          compareUnshared: args.compareUnshared,
          rounds: args.rounds,
          data: args.data,
          llamaCppBin: args.llamaCppBin,
          log,
        }),
      );
      seconds[k] = +((performance.now() - t) / 1e3).toFixed(1);
    }
    const total = +((performance.now() - t0) / 1e3).toFixed(1);
    const sw = software();
    const doc = {
      machine: machineLine(),
      software: sw,
      quick: !!args.quick,
      seconds: { ...seconds, total },
      reports: Object.fromEntries(reports.map((r) => [r.kind, r.results])),
      not_available: skipped,
    };
    const took = `${Object.entries(seconds)
      .map(([k, v]) => `${k} ${v} s`)
      .join(', ')}; total ${total} s`;
    const md = [
      `Measured ${doc.machine}${sw ? `; ${softwareLine(sw)}` : ''}${args.quick ? ' (--quick)' : ''}; the benchmarks took ${took}.`,
      '',
      ...reports.flatMap((r) => [r.table, '']),
    ].join('\n');
    if (args.out) {
      writeFileSync(args.out, JSON.stringify(doc, null, 2) + '\n');
      writeFileSync(args.out.replace(/\.json$/, '') + '.md', md);
    }
    if (args.readme) writeReadmeBlock(args.readme, md);
    print(args.json ? JSON.stringify(doc, null, 2) : md);
  },
};

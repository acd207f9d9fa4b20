/**
 * The engine benchmark's second llama.cpp peer, the one issue 30 sets as the bar: llama.cpp built from
 * its source for the machine (nothing of it ships with slm-train; build it beside the project:
 * `cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF && cmake --build build`),
 * found through `slm-train bench --llama-cpp-bin DIR` or $SLM_TRAIN_LLAMA_CPP_BIN (DIR holds its tools
 * llama-bench and llama-batched-bench: build/bin). In the same `bench engine` run, on the same model
 * written as an F32 and a BF16 GGUF (scripts/hf-to-gguf.py), with slm-train's thread count and a 16-bit
 * KV cache (f16 for F32, bf16 for BF16: see KV), each tool in a process of its own under a timeout:
 *  - `llama-bench -m F.gguf -t T -p PREFILL -n STEPS -r REPS -ctk D -ctv D -o json`: the prefill rate
 *    (its pp test) and the batch-1 decode rate (its tg test), each its `avg_ts` over the repetitions;
 *  - `llama-batched-bench -m F.gguf -t T -tb T -c C -npp 32,..(REPS times) -ntg STEPS -npl 16
 *    -ctk D -ctv D --output-format jsonl`: 16 sequences, each with its own 32-token prompt, decoding
 *    STEPS steps together (the shape of bench/engine.ts's batch-16 rows); the rate is the tool's own
 *    S_TG (`speed_tg` = 16 x STEPS / the decode time), the median over the REPS runs.
 * No folder given: the rows say so and are skipped; a folder given that lacks the tools: a coded error.
 */
import { spawnSync } from 'node:child_process';
import { accessSync, constants, existsSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { SlmError } from '../lib/errors.js';
import { benchGguf, ggufPython, NO_GGUF_PYTHON } from './llama-cpp.js';
import { harmonicMean, median } from './stats.js';

export const LLAMA_CPP_TOOLS = ['llama-bench', 'llama-batched-bench'] as const;
export const LLAMA_CPP_BIN_ENV = 'SLM_TRAIN_LLAMA_CPP_BIN';
/** The decode batch llama-batched-bench runs, and the prompt length of each of its sequences. */
export const BATCH = 16;
export const PROMPT_TOKENS = 32;

/**
 * The llama.cpp build folder the user named (`--llama-cpp-bin DIR`, else $SLM_TRAIN_LLAMA_CPP_BIN),
 * or undefined when neither is set. A named folder without both tools is a coded error, raised before
 * any benchmark runs.
 */
export function llamaCppBin(flag: string | undefined, env: NodeJS.ProcessEnv = process.env): string | undefined {
  const given = flag ?? (env[LLAMA_CPP_BIN_ENV] || undefined);
  if (given === undefined) return undefined;
  const how = flag !== undefined ? `--llama-cpp-bin ${flag}` : `${LLAMA_CPP_BIN_ENV}=${given}`;
  const dir = resolve(given);
  const absent = LLAMA_CPP_TOOLS.filter((tool) => {
    try {
      accessSync(join(dir, tool), constants.X_OK);
      return !statSync(join(dir, tool)).isFile();
    } catch {
      return true;
    }
  });
  if (absent.length)
    throw new SlmError(
      'FILE_NOT_FOUND',
      `${how}: expected a folder holding llama.cpp's executables ${LLAMA_CPP_TOOLS.join(' and ')} (a build from source: cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF && cmake --build build, then build/bin), found ${existsSync(dir) ? `no executable ${absent.join(' or ')} in ${dir}` : `no folder ${dir}`}. Name the build's bin folder, or leave the option out to skip the llama.cpp source-build rows.`,
    );
  return dir;
}

/** One test of llama-bench's `-o json` array (the fields read here). */
export interface LlamaBenchTest {
  build_commit: string;
  build_number: number;
  cpu_info: string;
  backends: string;
  model_type: string;
  n_threads: number;
  type_k: string;
  type_v: string;
  flash_attn: number;
  n_prompt: number;
  n_gen: number;
  n_depth?: number;
  avg_ts: number;
  stddev_ts: number;
}

function fail(tool: string, expected: string, found: string): never {
  throw new Error(`${tool}: expected ${expected}, found ${found}`);
}

/** llama-bench's `-o json` output: its tests. */
function llamaBenchTests(stdout: string): LlamaBenchTest[] {
  const a = stdout.indexOf('[');
  const b = stdout.lastIndexOf(']');
  if (a < 0 || b < a) fail('llama-bench -o json', 'a JSON array of tests', JSON.stringify(stdout.slice(0, 200)));
  try {
    return JSON.parse(stdout.slice(a, b + 1)) as LlamaBenchTest[];
  } catch (e) {
    return fail('llama-bench -o json', 'a JSON array of tests', `unparsable JSON (${(e as Error).message})`);
  }
}

/** The test of `tests` with n_prompt `p` and n_gen `g` (no depth) and a positive rate. */
function findTest(tests: LlamaBenchTest[], p: number, g: number): LlamaBenchTest {
  const t = tests.find((x) => x.n_prompt === p && x.n_gen === g && !x.n_depth);
  if (!t || !(t.avg_ts > 0))
    fail(
      'llama-bench -o json',
      `a test with n_prompt ${p}, n_gen ${g} and avg_ts > 0`,
      `tests ${JSON.stringify(tests.map((x) => [x.n_prompt, x.n_gen, x.avg_ts]))}`,
    );
  return t;
}

/** llama-bench's `-o json` output: its prefill test (n_prompt P, n_gen 0) and its decode test (n_prompt 0, n_gen S). */
export function parseLlamaBench(
  stdout: string,
  want: { prefill: number; steps: number },
): { prefill: LlamaBenchTest; decode: LlamaBenchTest } {
  const tests = llamaBenchTests(stdout);
  return { prefill: findTest(tests, want.prefill, 0), decode: findTest(tests, 0, want.steps) };
}

/** One line of llama-batched-bench's `--output-format jsonl` (the fields read here). */
export interface BatchedBenchRun {
  n_threads: number;
  flash_attn: number;
  pp: number;
  tg: number;
  pl: number;
  t_tg: number;
  speed_tg: number;
}

/**
 * llama-batched-bench's jsonl output: the runs with `pl` sequences of `pp` prompt tokens decoding `tg`
 * steps; the decode rate is the tool's S_TG (speed_tg, pl x tg / t_tg), the median over those runs.
 */
export function parseBatchedBench(
  stdout: string,
  want: { pp: number; tg: number; pl: number },
): { runs: BatchedBenchRun[]; tokens_per_s: number; step_ms: number } {
  const runs = stdout
    .split('\n')
    .filter((l) => l.trim().startsWith('{'))
    .map((l) => JSON.parse(l) as BatchedBenchRun)
    .filter((r) => r.pp === want.pp && r.tg === want.tg && r.pl === want.pl);
  if (!runs.length || runs.some((r) => !(r.speed_tg > 0)))
    fail(
      'llama-batched-bench --output-format jsonl',
      `lines with pp ${want.pp}, tg ${want.tg}, pl ${want.pl} and speed_tg > 0 (a run the context -c does not hold is left out)`,
      JSON.stringify(stdout.slice(0, 300)),
    );
  const speeds = runs.map((r) => r.speed_tg).sort((x, y) => x - y);
  const tokensPerS = speeds[Math.floor(speeds.length / 2)];
  return { runs, tokens_per_s: tokensPerS, step_ms: (want.pl / tokensPerS) * 1e3 };
}

export type GgufDtype = 'F32' | 'BF16';
/**
 * The KV cache type each GGUF runs with: bf16 beside slm-train's bfloat16; f16 (llama.cpp's default)
 * beside float32, as llama-bench offers no f32 cache (-ctk: f16, bf16 and quantized types only).
 */
const KV: Record<GgufDtype, string> = { F32: 'f16', BF16: 'bf16' };

export interface LlamaCppSourceRun {
  dtype: GgufDtype;
  gguf: string;
  build_commit: string;
  build_number: number;
  cpu_info: string;
  threads: number;
  kv_cache: string;
  flash_attn: number;
  prefill: { tokens: number; tokens_per_s: number; stddev_ts: number; passes?: number[] };
  decode: Array<{ batch: number; steps: number; tokens_per_s: number; step_ms: number; how: string; passes?: number[] }>;
}
export type LlamaCppSource = { bin: string; runs: Array<LlamaCppSourceRun | { dtype: GgufDtype; skipped: string }> } | { skipped: string };

/** One tool of the build, its stdout; an error saying why when it fails or outlives `timeoutS`. */
function tool(bin: string, name: string, args: string[], timeoutS: number): string {
  const r = spawnSync(join(bin, name), args, { encoding: 'utf8', timeout: timeoutS * 1000, killSignal: 'SIGKILL', maxBuffer: 64 << 20 });
  if (r.error || r.signal)
    throw new Error(
      `${name} did not finish${r.signal ? ` (killed by ${r.signal} after the ${timeoutS} s limit)` : `: ${r.error!.message}`}`,
    );
  if (r.status !== 0) throw new Error(`${name} failed (exit ${r.status}): ${(r.stderr || '').trim().split('\n').slice(-2).join(' ')}`);
  return r.stdout;
}

/** Both tools on one GGUF. */
export function runSourceBuild(
  bin: string,
  gguf: string,
  dtype: GgufDtype,
  o: { threads: number; prefill: number; steps: number; reps: number; timeoutS: number },
): LlamaCppSourceRun {
  const t = String(o.threads);
  const kv = ['-ctk', KV[dtype], '-ctv', KV[dtype]];
  const lb = parseLlamaBench(
    tool(
      bin,
      'llama-bench',
      ['-m', gguf, '-t', t, '-p', String(o.prefill), '-n', String(o.steps), '-r', String(o.reps), ...kv, '-o', 'json'],
      o.timeoutS,
    ),
    o,
  );
  const want = { pp: PROMPT_TOKENS, tg: o.steps, pl: BATCH };
  const bb = parseBatchedBench(
    tool(
      bin,
      'llama-batched-bench',
      [
        ...['-m', gguf, '-t', t, '-tb', t, '-c', String(BATCH * (PROMPT_TOKENS + o.steps))],
        ...['-npp', Array(o.reps).fill(PROMPT_TOKENS).join(','), '-ntg', String(o.steps), '-npl', String(BATCH)],
        ...kv,
        ...['--output-format', 'jsonl'],
      ],
      o.timeoutS,
    ),
    want,
  );
  const p = lb.prefill;
  return {
    dtype,
    gguf,
    build_commit: p.build_commit,
    build_number: p.build_number,
    cpu_info: p.cpu_info,
    threads: p.n_threads,
    kv_cache: `${p.type_k}/${p.type_v}`,
    flash_attn: p.flash_attn,
    prefill: { tokens: o.prefill, tokens_per_s: p.avg_ts, stddev_ts: p.stddev_ts },
    decode: [
      {
        batch: 1,
        steps: o.steps,
        tokens_per_s: lb.decode.avg_ts,
        step_ms: 1e3 / lb.decode.avg_ts,
        how: `llama-bench tg${o.steps}, avg_ts`,
      },
      {
        batch: BATCH,
        steps: o.steps,
        tokens_per_s: bb.tokens_per_s,
        step_ms: bb.step_ms,
        how: `llama-batched-bench S_TG, ${PROMPT_TOKENS}-token prompts, median of ${bb.runs.length}`,
      },
    ],
  };
}

/**
 * llama.cpp built from source (`bin`, from llamaCppBin) on `dir` written as F32 and BF16 GGUFs; each
 * dtype's figures or why it was skipped; the whole peer skipped, saying why, without a folder or gguf.
 */
export function runLlamaCppSource(
  dir: string,
  o: {
    bin: string | undefined;
    threads: number;
    prefill: number;
    steps: number;
    reps: number;
    timeoutS: number;
    log?: (s: string) => void;
  },
): LlamaCppSource {
  if (!o.bin)
    return {
      skipped: `no llama.cpp build from source named (--llama-cpp-bin DIR or ${LLAMA_CPP_BIN_ENV}=DIR: the folder holding ${LLAMA_CPP_TOOLS.join(' and ')})`,
    };
  const python = ggufPython();
  if (!python) return { skipped: NO_GGUF_PYTHON };
  const runs: Array<LlamaCppSourceRun | { dtype: GgufDtype; skipped: string }> = [];
  for (const dtype of ['F32', 'BF16'] as const) {
    try {
      const gguf = benchGguf(dir, dtype === 'F32' ? 'f32' : 'bf16', python, o.log);
      o.log?.(`engine: llama.cpp source build (${o.bin}) on the ${dtype} GGUF: llama-bench, llama-batched-bench`);
      runs.push(runSourceBuild(o.bin, gguf, dtype, o));
    } catch (e) {
      o.log?.(`engine: llama.cpp source build, ${dtype}: ${(e as Error).message}`);
      runs.push({ dtype, skipped: (e as Error).message });
    }
  }
  return { bin: o.bin, runs };
}

/**
 * Two passes of the source build as one: each rate that of the two passes' mean time (harmonic mean), the
 * passes' own rates kept in `passes`. A dtype skipped in either pass is the first
 * pass's run, as it was (the table then shows one pass).
 */
export function mergeSourcePasses(a: LlamaCppSource, b: LlamaCppSource): LlamaCppSource {
  if ('skipped' in a || 'skipped' in b) return a;
  return {
    bin: a.bin,
    runs: a.runs.map((r) => {
      const q = b.runs.find((x) => x.dtype === r.dtype);
      if ('skipped' in r || !q || 'skipped' in q) return r;
      // The rate of the mean time (as slm-train's passes are combined: combinePasses in bench/engine.ts).
      const mean = (x: number, y: number) => harmonicMean([x, y]);
      return {
        ...r,
        prefill: {
          ...r.prefill,
          tokens_per_s: mean(r.prefill.tokens_per_s, q.prefill.tokens_per_s),
          passes: [r.prefill.tokens_per_s, q.prefill.tokens_per_s],
        },
        decode: r.decode.map((d) => {
          const e = q.decode.find((x) => x.batch === d.batch);
          if (!e) return d;
          const tps = mean(d.tokens_per_s, e.tokens_per_s);
          return {
            ...d,
            tokens_per_s: tps,
            step_ms: (1e3 * d.batch) / tps,
            passes: [d.tokens_per_s, e.tokens_per_s],
            how: `${d.how}; the mean of two passes`,
          };
        }),
      };
    }),
  };
}

const OURS: Record<GgufDtype, 'float32' | 'bfloat16'> = { F32: 'float32', BF16: 'bfloat16' };
/** llama_flash_attn_type as llama-bench's JSON gives it. */
const FA: Record<number, string> = { [-1]: 'auto', 0: 'off', 1: 'on' };

/** The table rows of the source build beside slm-train's figures of the same run in the same dtype. */
export function llamaCppSourceRows(
  l: LlamaCppSource,
  ours: {
    prefill: (dtype: 'float32' | 'bfloat16') => number | undefined;
    decode: (dtype: 'float32' | 'bfloat16', batch: number) => number | undefined;
    /** slm-train's rates per pass (two passes, reversed order: mergeSourcePasses), for each pass's own ratio. */
    passes?: {
      prefill: (dtype: 'float32' | 'bfloat16') => number[] | undefined;
      decode: (dtype: 'float32' | 'bfloat16', batch: number) => number[] | undefined;
    };
  },
): string[] {
  if ('skipped' in l) return [`| llama.cpp (source build) | skipped: ${l.skipped} | | |`];
  return l.runs.flatMap((r) => {
    if ('skipped' in r) return [`| llama.cpp (source build), ${r.dtype} GGUF | skipped: ${r.skipped} | | |`];
    const who = `llama.cpp source build ${r.build_commit} (build ${r.build_number}), ${r.dtype} GGUF, KV ${r.kv_cache}, flash attention ${FA[r.flash_attn] ?? r.flash_attn}, ${r.threads} threads`;
    const ratio = (x: number | undefined, y: number, mine?: number[], theirs?: number[]) => {
      if (x === undefined) return 'not measured';
      const each =
        mine && theirs && mine.length === theirs.length && mine.length > 1
          ? ` (passes: ${mine.map((v, i) => `${(v / theirs[i]).toFixed(2)}x`).join(' / ')})`
          : '';
      return `${(x / y).toFixed(2)}x${each}`;
    };
    const vs = `slm-train ${OURS[r.dtype]} / llama.cpp ${r.dtype}`;
    return [
      `| ${who}: prefill ${r.prefill.tokens} tokens, batch 1 (llama-bench pp${r.prefill.tokens}) | ${r.prefill.tokens_per_s.toFixed(1)} tok/s | | |`,
      `| ${vs}, prefill ${r.prefill.tokens} tokens | ${ratio(ours.prefill(OURS[r.dtype]), r.prefill.tokens_per_s, ours.passes?.prefill(OURS[r.dtype]), r.prefill.passes)} | | |`,
      ...r.decode.flatMap((d) => [
        `| ${who}: decode batch ${d.batch} (${d.how}) | ${d.tokens_per_s.toFixed(1)} tok/s (${d.step_ms.toFixed(2)} ms/step) | | |`,
        `| ${vs}, decode batch ${d.batch} | ${ratio(ours.decode(OURS[r.dtype], d.batch), d.tokens_per_s, ours.passes?.decode(OURS[r.dtype], d.batch), d.passes)} | | |`,
      ]),
    ];
  });
}

/**
 * llama-bench's batch-1 decode alone on one GGUF (`-p 0 -n STEPS -r REPS`, the KV cache as in
 * runSourceBuild): ms per step, from its avg_ts. One llama.cpp turn of the alternated batch-1 rounds.
 */
export function llamaBenchDecodeMs(
  bin: string,
  gguf: string,
  dtype: GgufDtype,
  o: { threads: number; steps: number; reps: number; timeoutS: number },
): number {
  const args = ['-m', gguf, '-t', String(o.threads), '-p', '0', '-n', String(o.steps), '-r', String(o.reps)];
  const out = tool(bin, 'llama-bench', [...args, '-ctk', KV[dtype], '-ctv', KV[dtype], '-o', 'json'], o.timeoutS);
  return 1e3 / findTest(llamaBenchTests(out), 0, o.steps).avg_ts;
}

/**
 * One round of the alternated batch-1 comparison: the read bandwidth, one side's batch-1 decode, the
 * read bandwidth, the other side's, the read bandwidth (which side goes first alternating from round
 * to round). Both sides of a round run within seconds of each other; the reads say whether the
 * machine's memory stayed at one speed meanwhile: this project's VMs switch between about 35 and
 * 55-65 GB/s over seconds to minutes, and a round that straddles a switch compares two machines.
 */
export interface Batch1Round {
  first: 'slm-train' | 'llama.cpp';
  ours_ms: number;
  llama_ms: number;
  /** slm-train's rate over llama.cpp's: llama_ms / ours_ms. */
  ratio: number;
  /** The read bandwidth before the round, between its two sides and after it (GB/s). */
  read_GBps: [number, number, number];
}

/** Reads within this fraction of their largest count as one memory speed (the two modes differ by 40 % and more). */
export const STEADY_SPREAD = 0.15;

/** A round whose three reads agree: both sides ran at one memory speed. */
export function steadyRound(r: Batch1Round): boolean {
  const hi = Math.max(...r.read_GBps);
  return Math.min(...r.read_GBps) >= (1 - STEADY_SPREAD) * hi;
}

export interface Batch1Rounds {
  dtype: GgufDtype;
  steps: number;
  rounds: Batch1Round[];
  /** The rounds at one memory speed (steadyRound), which the figures below are of; all rounds where none is. */
  steady: number;
  median_ratio: number;
  min_ratio: number;
  max_ratio: number;
  /** Of those rounds, the ones where slm-train's step took no longer than llama.cpp's. */
  ahead: number;
  /** The median over those rounds of each side's fraction of the memory bound (the weights' bytes at the reads around that side). */
  fraction_of_memory_bound: { slm_train: number; llama_cpp: number };
}

/**
 * The rounds of one dtype summed up, over the rounds run at one memory speed (all of them when none
 * was): the median of the rounds' own ratios (not the ratio of medians: each ratio compares two
 * figures of one moment), their range, how many slm-train led, and each side's median fraction of its
 * memory bound, a side's bound being `bytes` at the harmonic mean of the two reads around it.
 */
export function summarizeRounds(dtype: GgufDtype, steps: number, rounds: Batch1Round[], bytes: number): Batch1Rounds {
  if (!rounds.length) throw new Error('summarizeRounds: no rounds');
  const steady = rounds.filter(steadyRound);
  const used = steady.length ? steady : rounds;
  const ratios = used.map((r) => r.ratio);
  const bound = (g1: number, g2: number) => (bytes / (harmonicMean([g1, g2]) * 1e9)) * 1e3; // ms
  const boundOf = (r: Batch1Round, side: 'slm-train' | 'llama.cpp') =>
    side === r.first ? bound(r.read_GBps[0], r.read_GBps[1]) : bound(r.read_GBps[1], r.read_GBps[2]);
  return {
    dtype,
    steps,
    rounds,
    steady: steady.length,
    median_ratio: median(ratios),
    min_ratio: Math.min(...ratios),
    max_ratio: Math.max(...ratios),
    ahead: ratios.filter((x) => x >= 1).length,
    fraction_of_memory_bound: {
      slm_train: median(used.map((r) => boundOf(r, 'slm-train') / r.ours_ms)),
      llama_cpp: median(used.map((r) => boundOf(r, 'llama.cpp') / r.llama_ms)),
    },
  };
}

/** The table rows of the alternated batch-1 rounds, one per dtype (a skipped one says why). */
export function batch1RoundsRows(all: Array<Batch1Rounds | { dtype: string; skipped: string }>): string[] {
  return all.map((s) => {
    if ('skipped' in s) return `| slm-train / llama.cpp ${s.dtype}, decode batch 1, alternated rounds | skipped: ${s.skipped} | | |`;
    const each = s.rounds.map((r) => `${r.ratio.toFixed(2)}${steadyRound(r) ? '' : '*'}`).join(', ');
    const used = s.steady ? s.rounds.filter(steadyRound) : s.rounds;
    const reads = used.flatMap((r) => r.read_GBps);
    const of = s.steady
      ? `the ${s.steady} of ${s.rounds.length} rounds at one memory speed`
      : `all ${s.rounds.length} rounds (none at one memory speed)`;
    return (
      `| slm-train ${OURS[s.dtype]} / llama.cpp ${s.dtype}, decode batch 1, ${s.rounds.length} alternated rounds (tg${s.steps} each side; per round: ${each}; * the memory speed moved within the round) ` +
      `| median ${s.median_ratio.toFixed(2)}x (${s.min_ratio.toFixed(2)}-${s.max_ratio.toFixed(2)}; slm-train ahead in ${s.ahead}) over ${of} ` +
      `| memory bound at the reads around each side (${Math.min(...reads).toFixed(1)}-${Math.max(...reads).toFixed(1)} GB/s): slm-train ${s.fraction_of_memory_bound.slm_train.toFixed(3)}, llama.cpp ${s.fraction_of_memory_bound.llama_cpp.toFixed(3)} (medians) | |`
    );
  });
}

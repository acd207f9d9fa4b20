/**
 * Engine benchmark: prefill and batched decode on the `small` preset (~103M parameters, weights far
 * larger than the caches), each next to its roofline measured in the same run:
 *  - decode: bytes of weights read per step / the read bandwidth measured just before and after that
 *    decode (memory bound: aroundRead); at batch 16 the compute bound 2 x params x batch / the matmul
 *    rate of its dtype measured around that decode too (aroundRead's `rate`), and the bound is the
 *    larger of both; the fraction at the run's best matmul rate is given beside it;
 *  - prefill: each part of the work at its own limit, the larger of its compute time (FLOPs / measured
 *    matmul rate) and its memory time (bytes / measured read bandwidth), summed (prefillRoofline);
 *    the parts: the decoder layers' projections (2 x their parameters x tokens; the embedding lookup
 *    is no matmul), causal attention (QK^T and PV), and the vocab projection, which runs once per
 *    sequence, for the last position only (one row: reading the V x H weights bounds it);
 *  - the per-call overhead of crossing into native code (a sync call and an async worker round trip);
 *  - beside the decode rows, in the same run: float32 batch 16 with the engine's CPU kernels off
 *    (ATen's generic path, the one other devices take), and a plain eager PyTorch decode of the same
 *    model (bench/eager_decode.py: Hugging Face's eager Qwen3 written out in torch, under
 *    /usr/bin/python3 with Debian's python3-torch, same thread count) at batch 1 and 16, with the
 *    ratio slm-train / eager; skipped, saying why, where that python has no torch;
 *  - llama.cpp on the same model (bench/llama-cpp.ts: written as an F32 GGUF by llama.cpp's own writer,
 *    run by node-llama-cpp's prebuilt build, same thread count and prompts): prefill, decode at batch 1
 *    and 16, each beside slm-train's float32 figure; skipped, saying why, without node-llama-cpp or gguf;
 *  - llama.cpp built from source for the machine (bench/llama-cpp-source.ts: --llama-cpp-bin DIR or
 *    $SLM_TRAIN_LLAMA_CPP_BIN; llama-bench and llama-batched-bench on F32 and BF16 GGUFs): prefill,
 *    decode at batch 1 and 16, each beside slm-train's figure in the same dtype (float32, bfloat16);
 *    in two passes, the second in reverse order (slm-train, llama.cpp, llama.cpp, slm-train), each
 *    side's figure the rate of its passes' mean time, each pass's ratio beside it; skipped, saying
 *    why, where no folder is named; then batch 1 in 8 short alternated rounds per dtype (2 under
 *    --quick), each bracketed by three reads of the memory bandwidth, the median of the ratios of the
 *    rounds run at one memory speed (summarizeRounds in bench/llama-cpp-source.ts);
 *  - decode at batch 16 in float32 and bfloat16 again in `--rounds N` alternated rounds (default 3,
 *    --quick 1; the order flipping each round), each decode beside its roofline at the read and matmul
 *    rate measured around it: the median fraction per dtype and the rounds where bfloat16 was the
 *    faster (summarizeDecodeRounds).
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Model } from '../lib/engine/model.js';
import { native } from '../lib/engine/runtime.js';
import { initModel } from '../lib/model/init.js';
import { llamaCppRows, runLlamaCpp } from './llama-cpp.js';
import {
  batch1RoundsRows,
  llamaBenchDecodeMs,
  llamaCppBin,
  llamaCppSourceRows,
  mergeSourcePasses,
  runLlamaCppSource,
  summarizeRounds,
  type Batch1Round,
  type Batch1Rounds,
} from './llama-cpp-source.js';
import { harmonicMean, median } from './stats.js';
import type { BenchOptions, BenchReport } from './types.js';

export async function benchModelDir(preset: 'small' | 'tiny', log?: (s: string) => void): Promise<string> {
  const dir = join(process.env.SLM_TRAIN_CACHE ?? join(tmpdir(), 'slm-train-cache'), `preset-${preset}-seed0`);
  if (!existsSync(join(dir, 'model.safetensors'))) {
    mkdirSync(dir, { recursive: true });
    log?.(`writing the ${preset} preset to ${dir} ...`);
    initModel({ preset, out: dir, seed: 0 });
  }
  return dir;
}

/**
 * Causal attention's FLOPs over T positions (QK^T and PV, 2 x head_dim multiply-adds per query-key
 * pair per head, T (T + 1) / 2 pairs), all layers. The forward's; its backward to Q, K and V is twice that.
 */
export function attentionFlops(cfg: { num_hidden_layers: number; num_attention_heads: number; head_dim: number }, T: number): number {
  return 2 * 2 * cfg.head_dim * cfg.num_attention_heads * ((T * (T + 1)) / 2) * cfg.num_hidden_layers;
}

/**
 * A batch-1 prefill of T tokens at the machine's limits: each part at the larger of its compute and
 * memory time, summed. The layers' projections (compute bound from a few tokens on), causal attention
 * (compute), and the vocabulary projection of the last position (one row: memory bound).
 */
export function prefillRoofline(
  cfg: { num_hidden_layers: number; num_attention_heads: number; head_dim: number; hidden_size: number; vocab_size: number },
  layerParams: number,
  bytesPerParam: number,
  T: number,
  lim: { f32: number; read: number },
): { seconds: number; parts: { projections: number; attention: number; head: number } } {
  const part = (flops: number, bytes: number) => Math.max(flops / (lim.f32 * 1e9), bytes / (lim.read * 1e9));
  const VH = cfg.vocab_size * cfg.hidden_size;
  const parts = {
    projections: part(2 * layerParams * T, layerParams * bytesPerParam),
    attention: part(attentionFlops(cfg, T), 0),
    head: part(2 * VH, VH * bytesPerParam),
  };
  return { seconds: parts.projections + parts.attention + parts.head, parts };
}

/**
 * One decode step's roofline at batch B: the larger of its memory bound (every weight read once, at
 * `readGBps`) and its compute bound (2 FLOPs per weight and row, at `gflops`). Seconds.
 */
export function decodeBounds(
  weights: number,
  bytesPerParam: number,
  B: number,
  readGBps: number,
  gflops: number,
): { memBound: number; computeBound: number; bound: number } {
  const memBound = (weights * bytesPerParam) / (readGBps * 1e9);
  const computeBound = (2 * weights * B) / (gflops * 1e9);
  return { memBound, computeBound, bound: Math.max(memBound, computeBound) };
}

/**
 * The read bandwidth around a measurement: the best of `windows` short reads just before it and just
 * after it. A shared machine's bandwidth moves within seconds (here 31 to 57 GB/s between one second
 * and the next, 2026-11-27), so a memory-bound figure is set beside the bandwidth of its own moment:
 * against the day's best it would read low for a dip it did not cause, against a dip, high. With
 * `rate` (a matmul rate measure), the arithmetic rate around it too, the better of the two likewise:
 * the same VMs' rate switches opposite to their read (207-213 GFLOP/s with the slow read, 180-192
 * with the fast, 2026-11-28), so a compute-bound figure is set beside the rate of its own moment.
 */
export async function aroundRead<T>(
  f: () => Promise<T>,
  read: () => Promise<number> = readNow,
  rate?: () => Promise<number>,
): Promise<{ value: T; readGBps: number; reads: [number, number]; rateGFLOPs?: number; rates?: [number, number] }> {
  const before = await read();
  const rateBefore = rate && (await rate());
  const value = await f();
  const after = await read();
  const rateAfter = rate && (await rate());
  const r = { value, readGBps: Math.max(before, after), reads: [before, after] as [number, number] };
  return rate ? { ...r, rateGFLOPs: Math.max(rateBefore!, rateAfter!), rates: [rateBefore!, rateAfter!] } : r;
}

/** The read bandwidth now: the best of three 50 ms windows (GB/s). */
export function readNow(): Promise<number> {
  return machineLimit(LIMITS.read, 0.15, 3);
}

/**
 * The float32 matmul rate now: the best of three 100 ms windows (GFLOP/s). A shared VM's arithmetic
 * rate switches too, between levels opposite to the read's (here, 2026-11-28: 180-192 GFLOP/s while
 * reads ran at 55-66 GB/s, 207-213 while they ran at 34-36), so a compute-bound run is set beside
 * the rate measured around it, as a memory-bound one beside the read (bench rollout).
 */
export function matmulNow(): Promise<number> {
  return machineLimit(LIMITS.f32, 0.3, 3);
}

/** The bfloat16 matmul rate now, as matmulNow (GFLOP/s). */
export function matmulBf16Now(): Promise<number> {
  return machineLimit(LIMITS.bf16, 0.3, 3);
}

/**
 * The decoder layers' parameters (their matrices and norms): all of them but the embedding, the
 * final norm and an untied vocabulary head.
 */
export function layerMatmulParams(
  numParameters: number,
  cfg: { hidden_size: number; vocab_size: number; tie_word_embeddings: boolean },
): number {
  const VH = cfg.vocab_size * cfg.hidden_size;
  return numParameters - VH - cfg.hidden_size - (cfg.tie_word_embeddings ? 0 : VH);
}

/** The eager baseline's python: Debian's, which python3-torch installs torch into. */
export const EAGER_PYTHON = '/usr/bin/python3';

type MeasureRequest = Parameters<ReturnType<typeof native>['measure']>[0];

/**
 * A machine limit (read bandwidth, matmul rate): the best of `windows` short measurements, `seconds`
 * in all. The limit is what the machine can do; one long average on a shared machine folds other
 * tenants' load into it (a 1 s average here once read 26 GB/s where the machine copies 34, which put
 * a decode figure at 1.3 of its "limit"). The best window is also the strict choice for the
 * fractions beside it: a higher limit, a lower fraction.
 */
async function machineLimit(req: Omit<MeasureRequest, 'seconds'>, seconds: number, windows = 5): Promise<number> {
  const a = native();
  let best = 0;
  for (let w = 0; w < windows; w++) best = Math.max(best, await a.measure({ ...req, seconds: seconds / windows }));
  return best;
}

/** Alternated batch-1 rounds per dtype against the llama.cpp source build (2 under --quick). */
export const BATCH1_ROUNDS = 8;

const LIMITS = {
  read: { kind: 'read', n: 256 << 20 }, // GB/s read: a decode reads its weights and writes little
  f32: { kind: 'matmul', n: 1024, dtype: 'float32' }, // GFLOP/s
  bf16: { kind: 'matmul', n: 1024, dtype: 'bfloat16' },
} as const;

/**
 * The limits a benchmark's figures stand beside, measured before its runs (`measure`) and again after
 * them (`again`), each keeping the better of its measurements: a limit taken in a dip of a shared
 * machine would flatter every figure computed from it, so figures are computed after `again`.
 */
export class MachineLimits<K extends keyof typeof LIMITS> {
  private constructor(
    private readonly names: K[],
    private readonly seconds: number,
    readonly v: Record<K, number>,
  ) {}
  static async measure<K extends keyof typeof LIMITS>(names: K[], seconds: number): Promise<MachineLimits<K>> {
    const v = {} as Record<K, number>;
    for (const k of names) v[k] = await machineLimit(LIMITS[k], seconds);
    return new MachineLimits(names, seconds, v);
  }
  async again(): Promise<void> {
    for (const k of this.names) this.v[k] = Math.max(this.v[k], await machineLimit(LIMITS[k], this.seconds));
  }
}

/** bench/eager_decode.py beside this file (run from source) or in the checkout above dist/bench/. */
function eagerScript(): string | undefined {
  for (const rel of ['./eager_decode.py', '../../bench/eager_decode.py']) {
    const p = fileURLToPath(new URL(rel, import.meta.url));
    if (existsSync(p)) return p;
  }
  return undefined;
}

export interface EagerDecode {
  torch: string;
  threads: number;
  batch: number;
  steps: number;
  dtype: string;
  prefill_ms: number;
  step_ms: number;
  tokens_per_s: number;
}

/**
 * Runs bench/eager_decode.py (plain eager PyTorch decode of `dir`, temperature-1 sampling) and returns
 * its figures, or why it was skipped: no such python, no torch in it, no script, or the script failed
 * (e.g. a --model it does not implement). `python`: default /usr/bin/python3 (tests pass others).
 */
export function runEagerDecode(
  dir: string,
  o: { batch: number; steps: number; threads: number; dtype?: string; timeoutS: number; python?: string },
): EagerDecode | { skipped: string } {
  const python = o.python ?? EAGER_PYTHON;
  const script = eagerScript();
  if (!script) return { skipped: 'bench/eager_decode.py not found (run from a checkout of the repository)' };
  const probe = spawnSync(python, ['-c', 'import torch'], { encoding: 'utf8', timeout: 60_000 });
  if ((probe.error as NodeJS.ErrnoException | undefined)?.code === 'ENOENT')
    return { skipped: `${python} not found (apt-get install python3-torch)` };
  if (probe.error || probe.status !== 0) return { skipped: `${python} has no torch (apt-get install python3-torch)` };
  const r = spawnSync(
    python,
    [
      script,
      '--model',
      dir,
      '--batch',
      String(o.batch),
      '--steps',
      String(o.steps),
      '--threads',
      String(o.threads),
      '--dtype',
      o.dtype ?? 'float32',
    ],
    { encoding: 'utf8', timeout: o.timeoutS * 1000, maxBuffer: 16 << 20 },
  );
  if (r.error) return { skipped: `eager PyTorch decode did not finish: ${r.error.message}` };
  if (r.status !== 0)
    return { skipped: `eager PyTorch decode failed (exit ${r.status}): ${(r.stderr || '').trim().split('\n').slice(-1)[0]}` };
  try {
    return JSON.parse(r.stdout.trim().split('\n').slice(-1)[0]) as EagerDecode;
  } catch {
    return { skipped: `eager PyTorch decode printed no JSON: ${r.stdout.slice(-200)}` };
  }
}

export interface DecodeRow {
  dtype: 'float32' | 'bfloat16';
  batch: number;
  step_ms: number;
  tokens_per_s: number;
  roofline_step_ms: number;
  memory_bound_step_ms: number;
  compute_bound_step_ms: number;
  /** The read bandwidth the memory bound is at: measured around this row's decode. */
  read_GBps: number;
  /** The matmul rate (of the row's dtype) the compute bound is at: measured around this row's decode. */
  matmul_GFLOPs: number;
  roofline_tokens_per_s: number;
  fraction_of_roofline: number;
  /** The fraction with the compute bound at the run's best matmul rate instead (the same where memory binds). */
  fraction_at_best_rate: number;
}

/** Batch-16 decodes in alternated rounds: each round's rows, the median fraction per dtype. */
export interface DecodeRounds {
  batch: number;
  rounds: Array<Array<Pick<DecodeRow, 'dtype' | 'step_ms' | 'fraction_of_roofline' | 'read_GBps' | 'matmul_GFLOPs'>>>;
  median_fraction: { float32: number; bfloat16: number };
  /** Rounds in which the bfloat16 step took less time than the float32 one. */
  bfloat16_faster: number;
}

export function summarizeDecodeRounds(rounds: DecodeRow[][]): DecodeRounds {
  if (!rounds.length) throw new Error('summarizeDecodeRounds: no rounds');
  const of = (r: DecodeRow[], dt: DecodeRow['dtype']) => {
    const d = r.find((x) => x.dtype === dt);
    if (!d) throw new Error(`summarizeDecodeRounds: a round without its ${dt} decode`);
    return d;
  };
  const med = (dt: DecodeRow['dtype']) => +median(rounds.map((r) => of(r, dt).fraction_of_roofline)).toFixed(3);
  return {
    batch: rounds[0][0].batch,
    rounds: rounds.map((r) =>
      r.map(({ dtype, step_ms, fraction_of_roofline, read_GBps, matmul_GFLOPs }) => ({
        dtype,
        step_ms,
        fraction_of_roofline,
        read_GBps,
        matmul_GFLOPs,
      })),
    ),
    median_fraction: { float32: med('float32'), bfloat16: med('bfloat16') },
    bfloat16_faster: rounds.filter((r) => of(r, 'bfloat16').step_ms < of(r, 'float32').step_ms).length,
  };
}

/** The table row of the rounds. */
export function decodeRoundsRow(d: DecodeRounds): string {
  const list = (dt: DecodeRow['dtype']) =>
    `${dt} ${d.rounds.map((r) => r.find((x) => x.dtype === dt)!.fraction_of_roofline).join(', ')} (median ${d.median_fraction[dt]})`;
  return `| decode batch ${d.batch}, ${d.rounds.length} alternated round${d.rounds.length === 1 ? '' : 's'} (fraction of the roofline at the read and matmul rate around each decode) | ${list('float32')}; ${list('bfloat16')}; bfloat16 faster in ${d.bfloat16_faster} of ${d.rounds.length} | | |`;
}

interface RawDecode {
  dtype: 'float32' | 'bfloat16';
  batch: number;
  stepS: number;
  /** The read bandwidth around the measurement (aroundRead), GB/s. */
  readGBps: number;
  /** The matmul rate of its dtype around the measurement (aroundRead), GFLOP/s. */
  rateGFLOPs: number;
}

/** slm-train's figures beside the llama.cpp source build, one pass: seconds per prefill and per decode step. */
export interface OursPass {
  prefillS: number;
  prefillBf16S: number;
  decode: RawDecode[];
}

/**
 * Two passes as one: each time the mean of the two (the decodes matched by dtype and batch), and each
 * decode's read bandwidth the one at which the mean of the two passes' memory bounds is read (the
 * harmonic mean of the two).
 */
export function combinePasses(a: OursPass, b: OursPass): OursPass {
  return {
    prefillS: (a.prefillS + b.prefillS) / 2,
    prefillBf16S: (a.prefillBf16S + b.prefillBf16S) / 2,
    decode: a.decode.map((d) => {
      const e = b.decode.find((x) => x.dtype === d.dtype && x.batch === d.batch);
      return e
        ? {
            ...d,
            stepS: (d.stepS + e.stepS) / 2,
            readGBps: harmonicMean([d.readGBps, e.readGBps]),
            rateGFLOPs: harmonicMean([d.rateGFLOPs, e.rateGFLOPs]),
          }
        : d;
    }),
  };
}

/**
 * A decode row's table line: its rate and step, its roofline at the read and the matmul rate measured
 * around it, and its fraction, with the fraction at the run's best matmul rate beside it where that
 * differs (a compute-bound row).
 */
export function decodeLine(label: string, d: DecodeRow): string {
  const best = d.fraction_at_best_rate !== d.fraction_of_roofline ? ` (at the run's best matmul rate: ${d.fraction_at_best_rate})` : '';
  return `| ${label} | ${d.tokens_per_s} tok/s (${d.step_ms} ms/step) | ${d.roofline_tokens_per_s} tok/s (${d.roofline_step_ms} ms/step; read ${d.read_GBps} GB/s, matmul ${d.matmul_GFLOPs} GFLOP/s around it) | ${d.fraction_of_roofline}${best} |`;
}

export async function runBench(opts: BenchOptions = {}): Promise<BenchReport> {
  const log = opts.log ?? (() => {});
  const quick = !!opts.quick;
  // A named llama.cpp folder without its tools fails now, before any measurement.
  const llamaBin = llamaCppBin(opts.llamaCppBin);
  const a = native();
  const dir = opts.model ?? (await benchModelDir('small', log));
  log(`engine: loading ${dir}`);
  const m = await Model.load(dir);
  const info = m.info();
  const cfg = m.config;
  const H = cfg.hidden_size,
    V = cfg.vocab_size;
  const layerParams = layerMatmulParams(info.numParameters, cfg);
  const bytesPerParam = info.parameterBytes / info.numParameters;
  // Weights read per decode step: every layer matrix + the vocab projection (+ one embedding row).
  const decodeBytes = (layerParams + V * H) * bytesPerParam;
  // (bfloat16 rows below read half as many bytes and use the bf16 matmul rate.)

  log('engine: measuring the machine (read bandwidth, matmul rate)');
  // The limits are measured before and again after the runs, and each is the better of the two: on a
  // shared machine another tenant's load comes and goes, and a limit taken in a dip alone would
  // flatter every fraction beside it (a decode once read 1.02 of its memory roofline that way).
  const lim = await MachineLimits.measure(['read', 'f32', 'bf16'], quick ? 0.3 : 1);

  const reps = quick ? 2 : 3;
  const prefillTokens = quick ? 128 : 512;
  const prompt = Int32Array.from({ length: prefillTokens }, (_, i) => ((i * 7919) % 100000) + 100);
  await m.generate({ prompts: [prompt.subarray(0, 16)], maxNewTokens: 2, greedy: true }); // warm-up
  const measurePrefill = async (mm: Model, n: number): Promise<number> => {
    const pre: number[] = [];
    for (let r = 0; r < n; r++) pre.push((await mm.generate({ prompts: [prompt], maxNewTokens: 1, greedy: true })).prefillSeconds);
    return median(pre);
  };
  let prefillS = await measurePrefill(m, reps);
  // The same prefill in bfloat16 (beside llama.cpp's BF16 GGUF); one repetition under --quick, as its decode.
  const bf16 = await Model.load(dir, { dtype: 'bfloat16' });
  log('engine: prefill (bfloat16)');
  await bf16.generate({ prompts: [prompt.subarray(0, 16)], maxNewTokens: 2, greedy: true });
  const repsBf16 = quick ? 1 : reps;
  let prefillBf16S = await measurePrefill(bf16, repsBf16);

  const decode: DecodeRow[] = [];
  const steps = quick ? 16 : 48;
  const decodePrompts = (B: number) =>
    Array.from({ length: B }, (_, b) => Int32Array.from({ length: 32 }, (_, i) => (((b * 131 + i) * 7919) % 100000) + 100));
  // The roofline of one decode step at batch B: the larger of the memory and the compute bound.
  const bounds = (B: number, bytesPerP: number, readGBps: number, mmRate: number) =>
    decodeBounds(layerParams + V * H, bytesPerP, B, readGBps, mmRate);
  const measureDecode = async (dtype: 'float32' | 'bfloat16', mm: Model, B: number): Promise<RawDecode> => {
    const prompts = decodePrompts(B);
    const times: number[] = [];
    // --quick: bfloat16 decode is slow on CPUs without native bf16 matmul (seconds per step at batch
    // 16 here), so it gets 4 steps and one repetition (its step time: the mean of 3 decode steps).
    const slow = quick && dtype === 'bfloat16';
    const { readGBps, rateGFLOPs } = await aroundRead(
      async () => {
        for (let r = 0; r < (slow ? 1 : reps); r++) {
          const g = await mm.generate({ prompts, maxNewTokens: slow ? 4 : steps, temperature: 1, topK: 0, seed: r });
          // Rows never stop early here (no stop ids), so every step decodes all B rows.
          times.push(g.decodeSeconds / Math.max(1, g.steps - 1));
        }
      },
      readNow,
      dtype === 'bfloat16' ? matmulBf16Now : matmulNow,
    );
    return { dtype, batch: B, stepS: median(times), readGBps, rateGFLOPs: rateGFLOPs! };
  };
  // A decode row beside its roofline at the read and the matmul rate around it; beside it, the
  // fraction at the run's best matmul rate (the final limits).
  const decodeRow = ({ dtype, batch: B, stepS, readGBps, rateGFLOPs }: RawDecode): DecodeRow => {
    const bytesPerP = dtype === 'bfloat16' ? 2 : bytesPerParam;
    const { memBound, computeBound, bound } = bounds(B, bytesPerP, readGBps, rateGFLOPs);
    const atBest = bounds(B, bytesPerP, readGBps, dtype === 'bfloat16' ? lim.v.bf16 : lim.v.f32).bound;
    return {
      dtype,
      batch: B,
      step_ms: +(stepS * 1e3).toFixed(2),
      tokens_per_s: +(B / stepS).toFixed(1),
      roofline_step_ms: +(bound * 1e3).toFixed(2),
      memory_bound_step_ms: +(memBound * 1e3).toFixed(2),
      compute_bound_step_ms: +(computeBound * 1e3).toFixed(2),
      read_GBps: +readGBps.toFixed(1),
      matmul_GFLOPs: +rateGFLOPs.toFixed(1),
      roofline_tokens_per_s: +(B / bound).toFixed(1),
      fraction_of_roofline: +(bound / stepS).toFixed(3),
      fraction_at_best_rate: +(atBest / stepS).toFixed(3),
    };
  };
  const measureDecodes = async (): Promise<RawDecode[]> => {
    const out: RawDecode[] = [];
    for (const [dtype, mm] of [
      ['float32', m],
      ['bfloat16', bf16],
    ] as const)
      for (const B of [1, 16]) {
        log(`engine: decode at batch ${B} (${dtype})`);
        out.push(await measureDecode(dtype, mm, B));
      }
    return out;
  };
  let rawDecode = await measureDecodes();

  // The same float32 batch-16 decode through ATen's generic path (the engine's CPU kernels off: what
  // the engine did before them, and the path other devices take), in the same run.
  log('engine: decode at batch 16 (float32), CPU kernels off (ATen path)');
  a.setCpuKernels(false);
  let rawAten: RawDecode;
  try {
    rawAten = await measureDecode('float32', m, 16);
  } finally {
    a.setCpuKernels(true);
  }

  // Plain eager PyTorch (Hugging Face's eager Qwen3, written out) decoding the same model with the
  // same prompts, sampling and thread count, in the same run; float32 at batch 1 and 16.
  const threads = a.version().threads;
  const eager: Record<string, unknown>[] = [];
  const eagerRaw: Array<{ B: number; e: EagerDecode }> = [];
  for (const B of [1, 16]) {
    log(`engine: eager PyTorch decode at batch ${B} (float32, ${EAGER_PYTHON})`);
    const e = runEagerDecode(dir, { batch: B, steps: steps - 1, threads, timeoutS: quick ? 240 : 600 });
    if ('skipped' in e) {
      eager.push({ dtype: 'float32', batch: B, skipped: e.skipped });
      log(`engine: eager PyTorch decode skipped: ${e.skipped}`);
      continue;
    }
    eagerRaw.push({ B, e });
  }

  // llama.cpp on the same model, the same prompts and thread count (bench/llama-cpp.ts), in the same run.
  const llamaCpp = runLlamaCpp(dir, { threads, prefill: prefillTokens, steps, reps, batches: [1, 16], timeoutS: quick ? 300 : 900, log });
  if ('skipped' in llamaCpp) log(`engine: llama.cpp skipped: ${llamaCpp.skipped}`);
  const sourceOptions = { bin: llamaBin, threads, prefill: prefillTokens, steps, reps, timeoutS: quick ? 300 : 900, log };
  let llamaCppSource = runLlamaCppSource(dir, sourceOptions);
  if ('skipped' in llamaCppSource) log(`engine: llama.cpp source build skipped: ${llamaCppSource.skipped}`);
  // Against the source build, a second pass in the reverse order (slm-train, llama.cpp, llama.cpp,
  // slm-train): a shared machine's speed drifts over the minutes of a run (its copy bandwidth read 35
  // and 55 GB/s in two runs of the same day), and measured once each, one side first, a drift had
  // moved the ratios by more than the gaps they measure. Each side's figure is then the mean of its
  // two passes, so a drift that is linear over the run cancels; the passes' own ratios are kept.
  let oursPasses: OursPass[] = [];
  if (!('skipped' in llamaCppSource) && llamaCppSource.runs.some((r) => !('skipped' in r))) {
    const first: OursPass = { prefillS, prefillBf16S, decode: rawDecode };
    log('engine: llama.cpp source build again (the second pass, reversed: llama.cpp first)');
    const again = runLlamaCppSource(dir, sourceOptions);
    log('engine: slm-train again (the second pass)');
    const second: OursPass = {
      prefillS: await measurePrefill(m, reps),
      prefillBf16S: await measurePrefill(bf16, repsBf16),
      decode: await measureDecodes(),
    };
    oursPasses = [first, second];
    const mean = combinePasses(first, second);
    prefillS = mean.prefillS;
    prefillBf16S = mean.prefillBf16S;
    rawDecode = mean.decode;
    llamaCppSource = mergeSourcePasses(llamaCppSource, again);
  }

  // Batch 1 against the source build in short alternated rounds (read, one side, read, the other,
  // read; the order flipping each round): this project's VMs switch between two memory speeds (35 and
  // 55-65 GB/s) over seconds to minutes, a batch-1 decode is memory bound, and a pass of each side
  // minutes apart can land in different modes; within a round both sides run seconds apart, and the
  // reads tell a round that straddled a switch. The median of the rounds' own ratios is the comparison.
  // A llama-bench failure skips that dtype's rounds, saying why, as the passes above do.
  const batch1Rounds: Array<Batch1Rounds | { dtype: string; skipped: string }> = [];
  if (!('skipped' in llamaCppSource)) {
    const nRounds = quick ? 2 : BATCH1_ROUNDS;
    for (const run of llamaCppSource.runs) {
      if ('skipped' in run) continue;
      const mm = run.dtype === 'F32' ? m : bf16;
      const prompts = decodePrompts(1);
      const oursMs = async () => {
        const ts: number[] = [];
        for (let r = 0; r < 2; r++) {
          const g = await mm.generate({ prompts, maxNewTokens: steps, temperature: 1, topK: 0, seed: r });
          ts.push((g.decodeSeconds / Math.max(1, g.steps - 1)) * 1e3);
        }
        return median(ts);
      };
      const llamaMs = () => llamaBenchDecodeMs(llamaBin!, run.gguf, run.dtype, { threads, steps, reps: 2, timeoutS: quick ? 300 : 900 });
      log(`engine: batch 1, ${nRounds} alternated rounds against llama.cpp ${run.dtype}`);
      const rounds: Batch1Round[] = [];
      try {
        for (let i = 0; i < nRounds; i++) {
          const first = i % 2 === 0 ? 'slm-train' : 'llama.cpp';
          const before = await readNow();
          const a = first === 'slm-train' ? await oursMs() : llamaMs();
          const mid = await readNow();
          const b = first === 'slm-train' ? llamaMs() : await oursMs();
          const after = await readNow();
          const [ours, theirs] = first === 'slm-train' ? [a, b] : [b, a];
          rounds.push({ first, ours_ms: ours, llama_ms: theirs, ratio: theirs / ours, read_GBps: [before, mid, after] });
        }
      } catch (e) {
        log(`engine: batch-1 rounds, ${run.dtype}: ${(e as Error).message}`);
        batch1Rounds.push({ dtype: run.dtype, skipped: (e as Error).message });
        continue;
      }
      const bytes = (layerParams + V * H) * (run.dtype === 'F32' ? bytesPerParam : 2);
      batch1Rounds.push(summarizeRounds(run.dtype, steps, rounds, bytes));
    }
  }

  // Batch 16 in float32 and bfloat16 again, in alternated rounds (the order flipping each round):
  // the decode rows above are one measurement each (or two passes' mean), and on a shared VM the same
  // decode step has ranged 1.4x within minutes; each round's decodes stand beside the rates measured
  // around them, and the rounds' median fraction is given beside the rows.
  const nDecodeRounds = opts.rounds ?? (quick ? 1 : 3);
  const rawRounds: RawDecode[][] = [];
  for (let i = 0; i < nDecodeRounds; i++) {
    const order = i % 2 === 0 ? (['float32', 'bfloat16'] as const) : (['bfloat16', 'float32'] as const);
    log(`engine: decode at batch 16, round ${i + 1} of ${nDecodeRounds} (${order.join(', then ')})`);
    const round: RawDecode[] = [];
    for (const dt of order) round.push(await measureDecode(dt, dt === 'float32' ? m : bf16, 16));
    rawRounds.push(round);
  }

  log('engine: measuring the machine again (each limit: the better of the two measurements)');
  await lim.again();
  const pr = prefillRoofline(cfg, layerParams, bytesPerParam, prefillTokens, lim.v);
  const prefill = {
    tokens: prefillTokens,
    tokens_per_s: +(prefillTokens / prefillS).toFixed(1),
    roofline_tokens_per_s: +(prefillTokens / pr.seconds).toFixed(1),
    fraction_of_roofline: +(pr.seconds / prefillS).toFixed(3),
    roofline_parts_ms: Object.fromEntries(Object.entries(pr.parts).map(([k, v]) => [k, +(v * 1e3).toFixed(2)])),
    fraction_of_projections_only: +(pr.parts.projections / prefillS).toFixed(3),
  };
  const prBf16 = prefillRoofline(cfg, layerParams, 2, prefillTokens, { f32: lim.v.bf16, read: lim.v.read });
  const prefillBf16 = {
    tokens: prefillTokens,
    tokens_per_s: +(prefillTokens / prefillBf16S).toFixed(1),
    roofline_tokens_per_s: +(prefillTokens / prBf16.seconds).toFixed(1),
    fraction_of_roofline: +(prBf16.seconds / prefillBf16S).toFixed(3),
  };
  decode.push(...rawDecode.map(decodeRow));
  const decodeRounds = rawRounds.length ? summarizeDecodeRounds(rawRounds.map((r) => r.map(decodeRow))) : null;
  const decodeAten = decodeRow(rawAten);
  for (const { B, e } of eagerRaw) {
    const { bound } = bounds(B, bytesPerParam, lim.v.read, lim.v.f32);
    const ours = decode.find((d) => d.dtype === 'float32' && d.batch === B)!;
    eager.push({
      dtype: 'float32',
      batch: B,
      torch: e.torch,
      threads: e.threads,
      steps: e.steps,
      step_ms: +e.step_ms.toFixed(2),
      prefill_ms: +e.prefill_ms.toFixed(1),
      tokens_per_s: +(B / (e.step_ms / 1e3)).toFixed(1),
      roofline_tokens_per_s: +(B / bound).toFixed(1),
      fraction_of_roofline: +(bound / (e.step_ms / 1e3)).toFixed(3),
      slm_train_speedup: +(e.step_ms / ours.step_ms).toFixed(2),
    });
  }

  // Crossing into native code: a synchronous method, and an async worker round trip with no work.
  const N = quick ? 2000 : 10000;
  let t0 = process.hrtime.bigint();
  for (let i = 0; i < N; i++) m.info();
  const syncUs = Number(process.hrtime.bigint() - t0) / 1e3 / N;
  const M = quick ? 200 : 1000;
  t0 = process.hrtime.bigint();
  for (let i = 0; i < M; i++) await a.measure({ kind: 'copy', n: 1, seconds: 0 });
  const asyncUs = Number(process.hrtime.bigint() - t0) / 1e3 / M;
  m.dispose();
  bf16.dispose();

  const results = {
    model: { dir, parameters: info.numParameters, parameter_bytes: info.parameterBytes, dtype: info.dtype, threads: a.version().threads },
    machine: { read_GBps: +lim.v.read.toFixed(1), matmul_f32_GFLOPs: +lim.v.f32.toFixed(1), matmul_bf16_GFLOPs: +lim.v.bf16.toFixed(1) },
    decode_bytes_per_step: decodeBytes,
    prefill,
    prefill_bfloat16: prefillBf16,
    decode,
    decode_batch16_rounds: decodeRounds,
    decode_aten_path: decodeAten,
    eager_pytorch: eager,
    llama_cpp: llamaCpp,
    llama_cpp_source: llamaCppSource,
    llama_cpp_source_batch1_rounds: batch1Rounds,
    // slm-train's own figures per pass against the source build (seconds per prefill, per decode step).
    passes: oursPasses.map((p) => ({
      prefill_s: +p.prefillS.toPrecision(6),
      prefill_bfloat16_s: +p.prefillBf16S.toPrecision(6),
      decode_step_ms: p.decode.map((d) => ({ dtype: d.dtype, batch: d.batch, step_ms: +(d.stepS * 1e3).toPrecision(6) })),
    })),
    native_call_overhead_us: { sync: +syncUs.toFixed(2), async_worker: +asyncUs.toFixed(1) },
  };
  const rows = [
    '| engine (small preset) | measured | roofline (same run) | fraction |',
    '|---|---|---|---|',
    `| prefill ${prefillTokens} tokens, batch 1 | ${prefill.tokens_per_s} tok/s | ${prefill.roofline_tokens_per_s} tok/s (projections ${prefill.roofline_parts_ms.projections} + attention ${prefill.roofline_parts_ms.attention} + head ${prefill.roofline_parts_ms.head} ms) | ${prefill.fraction_of_roofline} (projections alone: ${prefill.fraction_of_projections_only}) |`,
    `| prefill ${prefillTokens} tokens, batch 1, bfloat16 | ${prefillBf16.tokens_per_s} tok/s | ${prefillBf16.roofline_tokens_per_s} tok/s | ${prefillBf16.fraction_of_roofline} |`,
    ...decode.map((d) => decodeLine(`decode ${d.dtype} batch ${d.batch}`, d)),
    ...(decodeRounds ? [decodeRoundsRow(decodeRounds)] : []),
    decodeLine('decode float32 batch 16, ATen path (CPU kernels off)', decodeAten),
    ...eager.flatMap((e) =>
      'skipped' in e
        ? [`| eager PyTorch decode ${e.dtype} batch ${e.batch} | skipped: ${e.skipped} | | |`]
        : [
            `| eager PyTorch decode ${e.dtype} batch ${e.batch} (torch ${e.torch}, ${e.threads} threads) | ${e.tokens_per_s} tok/s (${e.step_ms} ms/step) | ${e.roofline_tokens_per_s} tok/s | ${e.fraction_of_roofline} |`,
            `| slm-train / eager PyTorch, decode ${e.dtype} batch ${e.batch} | ${e.slm_train_speedup}x | | |`,
          ],
    ),
    ...llamaCppRows(llamaCpp, {
      prefill: prefill.tokens_per_s,
      decode: (B) => decode.find((d) => d.dtype === 'float32' && d.batch === B)?.tokens_per_s,
    }),
    ...llamaCppSourceRows(llamaCppSource, {
      prefill: (dtype) => (dtype === 'float32' ? prefill : prefillBf16).tokens_per_s,
      decode: (dtype, B) => decode.find((d) => d.dtype === dtype && d.batch === B)?.tokens_per_s,
      passes: oursPasses.length
        ? {
            prefill: (dtype) => oursPasses.map((p) => prefillTokens / (dtype === 'float32' ? p.prefillS : p.prefillBf16S)),
            decode: (dtype, B) =>
              oursPasses.map((p) => {
                const d = p.decode.find((x) => x.dtype === dtype && x.batch === B);
                return d ? B / d.stepS : Number.NaN;
              }),
          }
        : undefined,
    }),
    ...batch1RoundsRows(batch1Rounds),
    `| native call overhead | sync ${results.native_call_overhead_us.sync} µs, async ${results.native_call_overhead_us.async_worker} µs | | |`,
    `| machine | read ${results.machine.read_GBps} GB/s (the best of the run's windows), matmul f32 ${results.machine.matmul_f32_GFLOPs} / bf16 ${results.machine.matmul_bf16_GFLOPs} GFLOP/s, ${results.model.threads} threads | | |`,
  ];
  return { kind: 'engine', results, table: rows.join('\n') };
}

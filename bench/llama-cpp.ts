/**
 * The engine benchmark's llama.cpp peer: the same model folder written as a GGUF with llama.cpp's own
 * writer (scripts/hf-to-gguf.py: gguf.GGUFWriter from the PyPI package `gguf`, in a python that has
 * it: $SLM_TRAIN_HF_PYTHON or the checkout's .venv, scripts/setup-venv.sh) and run by llama.cpp
 * through node-llama-cpp's prebuilt binaries (a dev dependency; CPU only, never built from source),
 * in a process of its own (bench/llama-cpp-child.ts), with slm-train's thread count: a batch-1 prefill,
 * and greedy decode at batch 1 and 16 (16 sequences in one context). Where the python package or
 * node-llama-cpp is missing, the result says why (`skipped`) and the bench goes on.
 */
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The first of `rels` (relative to this file: bench/ from source, dist/bench/ compiled) that exists. */
function beside(...rels: string[]): string | undefined {
  for (const rel of rels) {
    const p = fileURLToPath(new URL(rel, import.meta.url));
    if (existsSync(p)) return p;
  }
  return undefined;
}

/** A python with gguf, torch and safetensors: $SLM_TRAIN_HF_PYTHON, else the checkout's .venv. */
export function ggufPython(): string | undefined {
  const venvs = ['../.venv/bin/python', '../../.venv/bin/python'].map((r) => fileURLToPath(new URL(r, import.meta.url)));
  for (const p of [process.env.SLM_TRAIN_HF_PYTHON, ...venvs])
    if (p && existsSync(p) && spawnSync(p, ['-c', 'import gguf, torch, safetensors'], { encoding: 'utf8' }).status === 0) return p;
  return undefined;
}

export const NO_GGUF_PYTHON =
  'no python with the gguf package (bash scripts/setup-venv.sh installs it in .venv, or set SLM_TRAIN_HF_PYTHON)';

/** Why the llama.cpp rows cannot run here, or undefined when they can. */
export function llamaCppMissing(python: string | undefined): string | undefined {
  if (!python) return NO_GGUF_PYTHON;
  try {
    import.meta.resolve('node-llama-cpp');
  } catch {
    return 'node-llama-cpp is not installed (a dev dependency: npm install in a checkout)';
  }
  return undefined;
}

/** Writes `dir` as `out` (GGUF, `dtype`) with scripts/hf-to-gguf.py; reuses a GGUF newer than the weights (returns false). */
export function writeGguf(dir: string, out: string, o: { python: string; dtype?: 'f32' | 'f16' | 'bf16' }): boolean {
  const weights = `${dir}/model.safetensors`;
  if (existsSync(out) && existsSync(weights) && statSync(out).mtimeMs > statSync(weights).mtimeMs) return false;
  const script = beside('../scripts/hf-to-gguf.py', '../../scripts/hf-to-gguf.py');
  if (!script) throw new Error('scripts/hf-to-gguf.py not found (run from a checkout of the repository)');
  const r = spawnSync(o.python, [script, dir, out, '--dtype', o.dtype ?? 'f32'], { encoding: 'utf8', timeout: 600_000 });
  if (r.status !== 0)
    throw new Error(
      `scripts/hf-to-gguf.py failed (exit ${r.status}): ${(r.stderr || r.error?.message || '').trim().split('\n').slice(-1)[0]}`,
    );
  return true;
}

/**
 * `dir` written as a GGUF of `dtype` in the benchmark cache (as the preset folders; named by the
 * folder's path: a --model folder may be read-only), reused while newer than the weights; its path.
 */
export function benchGguf(dir: string, dtype: 'f32' | 'bf16', python: string, log?: (s: string) => void): string {
  const cache = process.env.SLM_TRAIN_CACHE ?? join(tmpdir(), 'slm-train-cache');
  mkdirSync(cache, { recursive: true });
  const gguf = join(
    cache,
    `${basename(resolve(dir))}-${createHash('sha256').update(resolve(dir)).digest('hex').slice(0, 8)}.${dtype}.gguf`,
  );
  const wrote = writeGguf(dir, gguf, { python, dtype });
  log?.(`engine: ${wrote ? 'wrote' : 'reusing'} ${gguf} (scripts/hf-to-gguf.py --dtype ${dtype}, gguf.GGUFWriter)`);
  return gguf;
}

/** Runs bench/llama-cpp-child.ts (compiled, or from source under the TypeScript loader this process has) with one request. */
export function llamaCppChild<T>(request: Record<string, unknown>, timeoutS: number): T {
  const js = beside('./llama-cpp-child.js');
  const args = js
    ? [js]
    : [...process.execArgv.filter((a) => a.startsWith('--import')), fileURLToPath(new URL('./llama-cpp-child.ts', import.meta.url))];
  const r = spawnSync(process.execPath, [...args, JSON.stringify(request)], {
    encoding: 'utf8',
    timeout: timeoutS * 1000,
    maxBuffer: 16 << 20,
  });
  if (r.error) throw new Error(`the llama.cpp child did not finish: ${r.error.message}`);
  if (r.status !== 0)
    throw new Error(`the llama.cpp child failed (exit ${r.status}): ${(r.stderr || '').trim().split('\n').slice(-3).join(' ')}`);
  return JSON.parse(r.stdout.trim().split('\n').slice(-1)[0]) as T;
}

export interface LlamaCppBench {
  gguf: string;
  dtype: string;
  threads: number;
  build: string;
  release: string;
  system_info: string;
  flash_attention: string;
  kv_cache: string;
  prefill: { tokens: number; seconds: number; tokens_per_s: number };
  decode: Array<{ batch: number; step_ms: number; tokens_per_s: number; steps: number }>;
}

/**
 * llama.cpp (node-llama-cpp prebuilt) on `dir` written as an F32 GGUF beside it: prefill of `prefill`
 * tokens at batch 1, greedy decode of `steps` steps at each batch; or why it was skipped.
 */
export function runLlamaCpp(
  dir: string,
  o: { threads: number; prefill: number; steps: number; reps: number; batches: number[]; timeoutS: number; log?: (s: string) => void },
): LlamaCppBench | { skipped: string } {
  const python = ggufPython();
  const missing = llamaCppMissing(python);
  if (missing) return { skipped: missing };
  try {
    const gguf = benchGguf(dir, 'f32', python!, o.log);
    o.log?.(`engine: llama.cpp (node-llama-cpp prebuilt) prefill ${o.prefill} and decode at batch ${o.batches.join(', ')}`);
    const r = llamaCppChild<Omit<LlamaCppBench, 'gguf' | 'dtype'>>(
      { mode: 'bench', gguf, threads: o.threads, prefill: o.prefill, steps: o.steps, reps: o.reps, batches: o.batches },
      o.timeoutS,
    );
    return { gguf, dtype: 'F32', ...r };
  } catch (e) {
    return { skipped: (e as Error).message };
  }
}

/** The table rows of the llama.cpp peer beside slm-train's float32 figures of the same run. */
export function llamaCppRows(
  l: LlamaCppBench | { skipped: string },
  ours: { prefill: number; decode: (batch: number) => number | undefined },
): string[] {
  if ('skipped' in l) return [`| llama.cpp (node-llama-cpp prebuilt) | skipped: ${l.skipped} | | |`];
  const who = `llama.cpp ${l.release} (node-llama-cpp prebuilt, ${l.dtype} GGUF, KV ${l.kv_cache}, flash attention ${l.flash_attention}, ${l.threads} threads)`;
  const rows = [`| ${who}: prefill ${l.prefill.tokens} tokens, batch 1 | ${l.prefill.tokens_per_s.toFixed(1)} tok/s | | |`];
  rows.push(`| slm-train / llama.cpp, prefill ${l.prefill.tokens} tokens | ${(ours.prefill / l.prefill.tokens_per_s).toFixed(2)}x | | |`);
  for (const d of l.decode) {
    rows.push(`| ${who}: decode batch ${d.batch} (greedy) | ${d.tokens_per_s.toFixed(1)} tok/s (${d.step_ms.toFixed(2)} ms/step) | | |`);
    const o = ours.decode(d.batch);
    if (o !== undefined) rows.push(`| slm-train / llama.cpp, decode float32 batch ${d.batch} | ${(o / d.tokens_per_s).toFixed(2)}x | | |`);
  }
  return rows;
}

/**
 * One native generate call as Model makes it: the request checked and flattened, the result split
 * into rows, and the streaming variant (tokens to a callback as they are sampled, rows cancelled by
 * their abort signals).
 */
import type { NativeGenerateRequest, NativeGenerateResult, NativeModel } from '../binding/types.js';
import { SlmError, describe } from '../errors.js';
import type { GenerateRequest, StreamGenerateRequest, StreamGenerateResult, TokenEvent } from './types.js';

/** The native finish codes, in order. */
export const FINISH = ['length', 'stop_token', 'stop_string', 'cancelled'] as const;

/** A GenerateRequest checked (ids against the vocabulary with `checkIds`) and flattened into the native request. */
export function nativeGenerateRequest(req: GenerateRequest, checkIds: (ids: Int32Array) => void): NativeGenerateRequest {
  const B = req.prompts.length;
  if (!Number.isInteger(req.maxNewTokens) || req.maxNewTokens < 1)
    throw new SlmError('ARGUMENT_INVALID', `maxNewTokens must be a positive integer, found ${describe(req.maxNewTokens)}.`);
  const lengths = Int32Array.from(req.prompts.map((p) => p.length));
  const ids = new Int32Array(lengths.reduce((a, b) => a + b, 0));
  let off = 0;
  for (const p of req.prompts) {
    if (!p.length) throw new SlmError('ARGUMENT_INVALID', 'every prompt needs at least one token; found an empty prompt.');
    ids.set(p, off);
    off += p.length;
  }
  checkIds(ids);
  const temps = new Float32Array(B);
  const t = req.temperature ?? 1;
  for (let i = 0; i < B; i++) {
    const v = req.greedy ? 0 : typeof t === 'number' ? t : t[i];
    if (typeof v !== 'number' || !(v >= 0))
      throw new SlmError('ARGUMENT_INVALID', `temperature must be >= 0 for every row, found ${describe(v)} at row ${i}.`);
    temps[i] = v;
  }
  if (req.rowSeeds && (req.rowSeeds.length !== B || !req.rowSeeds.every((s) => Number.isSafeInteger(s) && s >= 0)))
    throw new SlmError('ARGUMENT_INVALID', `rowSeeds must hold one non-negative integer per row (${B}), found ${describe(req.rowSeeds)}.`);
  const topPs = typeof req.topP === 'object' && req.topP !== null ? Array.from(req.topP) : undefined;
  if (topPs && topPs.length !== B)
    throw new SlmError('ARGUMENT_INVALID', `topP: expected one value per row (${B}) or one number, found ${topPs.length}.`);
  for (const v of topPs ?? [req.topP ?? 1])
    if (!(typeof v === 'number' && v > 0 && v <= 1))
      throw new SlmError('ARGUMENT_INVALID', `topP must be in (0, 1], found ${describe(v)}.`);
  const topP = topPs ? 1 : ((req.topP as number | undefined) ?? 1);
  const topK = req.topK ?? 0;
  if (!Number.isInteger(topK) || topK < 0)
    throw new SlmError('ARGUMENT_INVALID', `topK must be a non-negative integer, found ${describe(req.topK)}.`);
  let cacheKeys: Array<string | null> | undefined;
  if (req.cacheKeys !== undefined) {
    if (
      !Array.isArray(req.cacheKeys) ||
      req.cacheKeys.length !== B ||
      !req.cacheKeys.every((k) => k == null || (typeof k === 'string' && k.length > 0))
    )
      throw new SlmError(
        'ARGUMENT_INVALID',
        `cacheKeys must hold one non-empty string (or null: none) per row (${B}), found ${describe(req.cacheKeys)}.`,
      );
    const keys = req.cacheKeys.filter((k): k is string => typeof k === 'string');
    if (new Set(keys).size !== keys.length)
      throw new SlmError(
        'ARGUMENT_INVALID',
        `cacheKeys must be distinct within a call (one per episode), found a repeated key in ${describe(req.cacheKeys)}.`,
      );
    if (keys.length) cacheKeys = req.cacheKeys.map((k) => k ?? null);
  }
  return {
    ids,
    lengths,
    maxNewTokens: req.maxNewTokens,
    temperature: temps,
    topK,
    topP,
    ...(topPs ? { rowTopP: Float32Array.from(topPs) } : {}),
    seed: req.seed ?? 0,
    ...(req.rowSeeds ? { rowSeeds: req.rowSeeds } : {}),
    stopTokenIds: Int32Array.from(req.stopTokenIds ?? []),
    stopStrings: req.stopStrings ?? [],
    ...(req.sharePrefix !== undefined ? { sharePrefix: !!req.sharePrefix } : {}),
    ...(req.prefillChunk ? { prefillChunk: req.prefillChunk } : {}),
    ...(cacheKeys ? { cacheKeys } : {}),
  };
}

/** The native result's flat tokens / log-probs split into rows. */
export function generatedRows(result: NativeGenerateResult, B: number): { tokens: Int32Array[]; logprobs: Float32Array[] } {
  const tokens: Int32Array[] = [];
  const logprobs: Float32Array[] = [];
  let o = 0;
  for (let i = 0; i < B; i++) {
    const n = result.lengths[i];
    tokens.push(result.tokens.slice(o, o + n));
    logprobs.push(result.logprobs.slice(o, o + n));
    o += n;
  }
  return { tokens, logprobs };
}

/**
 * Model.generateStream's native call: `base` (nativeGenerateRequest of `req`) with the streaming
 * options, every step's tokens delivered to req.onToken, aborted signals cancelling their rows.
 * Returns the native result (for its counters) and the rows.
 */
export async function streamGenerate(
  model: NativeModel,
  base: NativeGenerateRequest,
  req: StreamGenerateRequest,
  vocabSize: number,
): Promise<{ native: NativeGenerateResult; result: StreamGenerateResult }> {
  const B = req.prompts.length;
  const topN = req.topLogprobs ?? 0;
  if (!Number.isInteger(topN) || topN < 0 || topN > vocabSize)
    throw new SlmError(
      'ARGUMENT_INVALID',
      `topLogprobs must be an integer from 0 to the vocabulary size, found ${describe(req.topLogprobs)}.`,
    );
  let rowMax: Int32Array | undefined;
  if (req.rowMaxNewTokens) {
    if (req.rowMaxNewTokens.length !== B || !req.rowMaxNewTokens.every((n) => Number.isInteger(n) && n >= 1 && n <= req.maxNewTokens))
      throw new SlmError(
        'ARGUMENT_INVALID',
        `rowMaxNewTokens must hold one integer from 1 to maxNewTokens (${req.maxNewTokens}) per row (${B}), found ${describe(req.rowMaxNewTokens)}.`,
      );
    rowMax = Int32Array.from(req.rowMaxNewTokens);
  }
  if (req.signals && req.signals.length !== B)
    throw new SlmError('ARGUMENT_INVALID', `signals must hold one entry (or undefined) per row (${B}), found ${req.signals.length}.`);
  const seen = new Int32Array(B);
  let closed = false;
  let failure: unknown;
  const deliver = (ev: TokenEvent) => {
    if (!req.onToken || failure !== undefined) return;
    try {
      req.onToken(ev);
    } catch (e) {
      failure = e;
    }
  };
  const call = model.generateStream({ ...base, topN, ...(rowMax ? { rowMaxNewTokens: rowMax } : {}) }, (step) => {
    if (closed) return;
    const n = step.rows.length ? step.topIds.length / step.rows.length : 0;
    for (let k = 0; k < step.rows.length; k++) {
      const row = step.rows[k];
      seen[row]++;
      const f = step.finish[k];
      deliver({
        row,
        token: step.tokens[k],
        logprob: step.logprobs[k],
        ...(n ? { top: { ids: step.topIds.slice(k * n, (k + 1) * n), logprobs: step.topLogprobs.slice(k * n, (k + 1) * n) } } : {}),
        ...(f !== 255 ? { finish: FINISH[f] as 'length' | 'stop_token' | 'stop_string' } : {}),
      });
    }
  });
  const unlisten: Array<() => void> = [];
  req.signals?.forEach((sig, i) => {
    if (!sig) return;
    const stop = () => call.cancel(i);
    if (sig.aborted) stop();
    else {
      sig.addEventListener('abort', stop, { once: true });
      unlisten.push(() => sig.removeEventListener('abort', stop));
    }
  });
  let r: NativeGenerateResult;
  try {
    r = await call.done;
  } finally {
    closed = true;
    for (const u of unlisten) u();
  }
  const { tokens, logprobs } = generatedRows(r, B);
  const finishReasons = Array.from(r.finish, (f) => FINISH[f]);
  let topLogprobs: StreamGenerateResult['topLogprobs'];
  if (topN > 0) {
    topLogprobs = [];
    let o = 0;
    for (let i = 0; i < B; i++) {
      const n = r.lengths[i] * topN;
      topLogprobs.push({ ids: r.topIds!.slice(o, o + n), logprobs: r.topLogprobs!.slice(o, o + n) });
      o += n;
    }
  }
  // The last steps' events may still be queued behind the result: report those tokens from it.
  for (let i = 0; i < B; i++) {
    const f = finishReasons[i];
    for (let t = seen[i]; t < tokens[i].length; t++)
      deliver({
        row: i,
        token: tokens[i][t],
        logprob: logprobs[i][t],
        ...(topLogprobs
          ? {
              top: {
                ids: topLogprobs[i].ids.slice(t * topN, (t + 1) * topN),
                logprobs: topLogprobs[i].logprobs.slice(t * topN, (t + 1) * topN),
              },
            }
          : {}),
        ...(t === tokens[i].length - 1 && f !== 'cancelled' ? { finish: f } : {}),
      });
  }
  if (failure !== undefined) throw failure;
  return {
    native: r,
    result: {
      tokens,
      logprobs,
      ...(topLogprobs ? { topLogprobs } : {}),
      finishReasons,
      steps: r.steps,
      prefillTokens: r.prefillTokens,
      prefillTokensRequested: r.prefillTokensRequested,
      cacheReusedTokens: r.cacheReusedTokens,
    },
  };
}

/**
 * A loaded Qwen3 model on the native engine: logits, batched generation, teacher-forced log-probs.
 * Implements TextGenerator (one native call per batch, on a worker thread).
 */
import type { NativeModel, NativeModelInfo } from '../binding/types.js';
import { SlmError, describe } from '../errors.js';
import { nativeConfig, readModelConfig, type ModelConfig } from '../model/config.js';
import { resolveWeightFiles } from '../model/weights.js';
import type { GenerateRequest, GenerateResult, TextGenerator } from './types.js';
import { native } from './runtime.js';

export type ComputeDtype = 'float32' | 'bfloat16' | 'float16';

export interface LoadModelOptions {
  dtype?: ComputeDtype;
  device?: string;
  /** Adapters arrive with the LoRA work; until then a clear NOT_SUPPORTED. */
  adapter?: string;
}

const FINISH = ['length', 'stop_token', 'stop_string'] as const;

export class Model implements TextGenerator {
  private handle: NativeModel | null;

  private constructor(
    readonly dir: string,
    readonly config: ModelConfig,
    handle: NativeModel,
  ) {
    this.handle = handle;
  }

  static async load(dir: string, opts: LoadModelOptions = {}): Promise<Model> {
    if (opts.adapter)
      throw new SlmError('NOT_SUPPORTED', `--adapter is not supported yet (LoRA adapters arrive with the training core); run without --adapter.`);
    const config = readModelConfig(dir);
    const files = resolveWeightFiles(dir);
    const dtype = opts.dtype ?? 'float32';
    if (!['float32', 'bfloat16', 'float16'].includes(dtype))
      throw new SlmError('ARGUMENT_INVALID', `dtype must be float32, bfloat16 or float16, found ${describe(dtype)}.`);
    const handle = await native().loadModel({ files, config: nativeConfig(config), dtype, device: opts.device ?? 'cpu' });
    return new Model(dir, config, handle);
  }

  private get h(): NativeModel {
    if (!this.handle) throw new SlmError('HANDLE_DISPOSED', 'this model was disposed; load it again to use it.');
    return this.handle;
  }

  info(): NativeModelInfo {
    return this.h.info();
  }

  get vocabSize(): number {
    return this.config.vocab_size;
  }

  /** Gives the engine each token's bytes so that generation can stop on strings. */
  setVocab(tokenBytes: Uint8Array[]): void {
    const offsets = new Int32Array(tokenBytes.length + 1);
    let n = 0;
    tokenBytes.forEach((b, i) => {
      offsets[i] = n;
      n += b.length;
    });
    offsets[tokenBytes.length] = n;
    const all = new Uint8Array(n);
    tokenBytes.forEach((b, i) => all.set(b, offsets[i]));
    this.h.setVocab(all, offsets);
  }

  checkIds(ids: ArrayLike<number>): void {
    for (let i = 0; i < ids.length; i++) {
      const v = ids[i];
      if (!Number.isInteger(v) || v < 0 || v >= this.config.vocab_size)
        throw new SlmError('TOKEN_OUT_OF_RANGE', `token id ${v} at position ${i} is outside the vocabulary: expected integers in [0, ${this.config.vocab_size}).`);
    }
  }

  /**
   * Logits of every position for a batch of equal-length rows ([batch][seqLen][vocab] flattened).
   * attentionMask / positionIds as in HF's forward; positions default to cumsum(mask) - 1.
   */
  async logits(rows: number[][], opts: { attentionMask?: number[][]; positionIds?: number[][] } = {}): Promise<{ data: Float32Array; batch: number; seqLen: number; vocab: number }> {
    if (!rows.length || !rows[0].length) throw new SlmError('ARGUMENT_INVALID', 'logits needs at least one non-empty row of ids.');
    const T = rows[0].length;
    for (const r of rows) if (r.length !== T) throw new SlmError('ARGUMENT_INVALID', `all rows must have the same length (pad them and pass attentionMask); found ${T} and ${r.length}.`);
    const flat = Int32Array.from(rows.flat());
    this.checkIds(flat);
    const data = await this.h.logits({
      ids: flat,
      batch: rows.length,
      seqLen: T,
      attentionMask: opts.attentionMask ? Int32Array.from(opts.attentionMask.flat()) : undefined,
      positionIds: opts.positionIds ? Int32Array.from(opts.positionIds.flat()) : undefined,
    });
    return { data, batch: rows.length, seqLen: T, vocab: this.config.vocab_size };
  }

  async generate(req: GenerateRequest): Promise<GenerateResult & { steps: number; prefillSeconds: number; decodeSeconds: number }> {
    const B = req.prompts.length;
    if (B === 0) return { tokens: [], logprobs: [], finishReasons: [], steps: 0, prefillSeconds: 0, decodeSeconds: 0 };
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
    this.checkIds(ids);
    const temps = new Float32Array(B);
    const t = req.temperature ?? 1;
    for (let i = 0; i < B; i++) {
      const v = req.greedy ? 0 : typeof t === 'number' ? t : t[i];
      if (typeof v !== 'number' || !(v >= 0)) throw new SlmError('ARGUMENT_INVALID', `temperature must be >= 0 for every row, found ${describe(v)} at row ${i}.`);
      temps[i] = v;
    }
    const topP = req.topP ?? 1;
    if (!(topP > 0 && topP <= 1)) throw new SlmError('ARGUMENT_INVALID', `topP must be in (0, 1], found ${describe(req.topP)}.`);
    const topK = req.topK ?? 0;
    if (!Number.isInteger(topK) || topK < 0) throw new SlmError('ARGUMENT_INVALID', `topK must be a non-negative integer, found ${describe(req.topK)}.`);
    const r = await this.h.generate({
      ids,
      lengths,
      maxNewTokens: req.maxNewTokens,
      temperature: temps,
      topK,
      topP,
      seed: req.seed ?? 0,
      stopTokenIds: Int32Array.from(req.stopTokenIds ?? []),
      stopStrings: req.stopStrings ?? [],
    });
    const tokens: Int32Array[] = [];
    const logprobs: Float32Array[] = [];
    let o = 0;
    for (let i = 0; i < B; i++) {
      const n = r.lengths[i];
      tokens.push(r.tokens.slice(o, o + n));
      logprobs.push(r.logprobs.slice(o, o + n));
      o += n;
    }
    return {
      tokens,
      logprobs,
      finishReasons: Array.from(r.finish, (f) => FINISH[f]),
      steps: r.steps,
      prefillSeconds: r.prefillSeconds,
      decodeSeconds: r.decodeSeconds,
    };
  }

  /** Teacher forcing: per row, out[t] = log p(ids[t] | ids[<t]) (0 at t = 0). */
  async sequenceLogprobs(rows: ArrayLike<number>[], temperature = 1): Promise<Float32Array[]> {
    const lengths = Int32Array.from(rows.map((r) => r.length));
    const ids = new Int32Array(lengths.reduce((a, b) => a + b, 0));
    let off = 0;
    for (const r of rows) {
      ids.set(Array.from(r), off);
      off += r.length;
    }
    this.checkIds(ids);
    const flat = await this.h.sequenceLogprobs({ ids, lengths, temperature });
    const out: Float32Array[] = [];
    off = 0;
    for (const n of lengths) {
      out.push(flat.slice(off, off + n));
      off += n;
    }
    return out;
  }

  dispose(): void {
    this.handle?.dispose();
    this.handle = null;
  }
}

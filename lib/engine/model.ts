/**
 * A loaded Qwen3 model on the native engine: logits, batched generation, teacher-forced log-probs.
 * Implements TextGenerator (one native call per batch, on a worker thread).
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import type {
  NativeApplyResult,
  NativeCacheStats,
  NativeGenerateResult,
  NativeModel,
  NativeModelInfo,
  NativeOptimOptions,
  NativeTrainStats,
} from '../binding/types.js';
import {
  ADAPTER_WEIGHTS,
  CRITIC_ADAPTER,
  VALUE_HEAD,
  checkAdapterFits,
  nonFinite,
  checkLoraSpec,
  readAdapterConfig,
  writeAdapterConfig,
  type LoraSpec,
} from './adapter.js';
import { SlmError, describe } from '../errors.js';
import { nativeConfig, readModelConfig, type ModelConfig } from '../model/config.js';
import { resolveWeightFiles } from '../model/weights.js';
import {
  COMPUTE_DTYPES,
  type ComputeDtype,
  type GenerateRequest,
  type GenerateResult,
  type StreamGenerateRequest,
  type StreamGenerateResult,
  type TextGenerator,
} from './types.js';
import { native } from './runtime.js';
import { writeFolderFiles, type GenerateStats } from './merged-export.js';
import { DecodeSession, type SessionOptions } from './session.js';
import { FINISH, generatedRows, nativeGenerateRequest, streamGenerate } from './generate-call.js';
import { flatRows, nativeTrainRequest, type TrainBatch, type TrainOptions } from './train-request.js';

export type { ComputeDtype } from './types.js';
export type { GenerateStats } from './merged-export.js';
export type { TrainBatch, TrainOptions } from './train-request.js';

export interface LoadModelOptions {
  dtype?: ComputeDtype;
  device?: string;
  /** A PEFT LoRA adapter folder to load on top of the base weights. */
  adapter?: string;
}

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
    const config = readModelConfig(dir);
    const files = resolveWeightFiles(dir);
    const dtype = opts.dtype ?? 'float32';
    if (!(COMPUTE_DTYPES as readonly string[]).includes(dtype))
      throw new SlmError('ARGUMENT_INVALID', `dtype must be float32, bfloat16 or float16, found ${describe(dtype)}.`);
    const handle = await native().loadModel({ files, config: nativeConfig(config), dtype, device: opts.device ?? 'cpu' });
    const m = new Model(dir, config, handle);
    if (opts.adapter) await m.loadAdapter(opts.adapter);
    return m;
  }

  /** The adapter currently attached (undefined: the bare base model). */
  lora?: LoraSpec;

  /** A fresh LoRA adapter (A kaiming-uniform, B = 0: the model starts exactly at the base). */
  attachLora(spec: LoraSpec, seed = 0): void {
    checkLoraSpec(spec, this.config.num_hidden_layers);
    this.h.adapters.attach({ ...spec, seed });
    this.lora = spec;
  }

  /** Loads a PEFT adapter folder (and its value head and separate critic, if saved with them). */
  async loadAdapter(dir: string): Promise<void> {
    const { spec, raw, weights, valueHead, critic } = readAdapterConfig(dir, this.config.num_hidden_layers);
    checkAdapterFits(dir, spec, raw, weights, this.config, this.dir);
    await this.h.adapters.load({ ...spec, file: weights });
    if (valueHead) this.h.valueHead.load(valueHead);
    if (critic) this.h.valueHead.loadCritic(critic);
    else this.h.valueHead.detachCritic();
    this.lora = spec;
    const bad = nonFinite(this.h.adapters.trainable());
    if (bad) {
      this.detachLora();
      throw new SlmError(
        'ADAPTER_INVALID',
        `${weights}${valueHead ? ` (or ${valueHead})` : ''} holds ${bad.count} non-finite values (NaN or inf) in ${bad.tensors.length} tensor(s), first ${bad.tensors[0]}; expected finite weights. The file is damaged or comes from a run that diverged: use an earlier checkpoint or train again.`,
        { file: weights, nonFinite: bad.count },
      );
    }
  }

  /** The trainable values (adapter and value head) that are NaN or inf, or undefined when all are finite. */
  nonFinite(): { count: number; tensors: string[] } | undefined {
    return nonFinite(this.h.adapters.trainable());
  }

  detachLora(): void {
    this.h.adapters.detach();
    this.lora = undefined;
  }

  /** Writes the adapter in PEFT format (plus value_head.safetensors and critic_adapter.safetensors when they exist). */
  async saveAdapter(dir: string): Promise<void> {
    if (!this.lora) throw new SlmError('NOT_SUPPORTED', 'there is no adapter to save: attach or load one first.');
    mkdirSync(dir, { recursive: true });
    await this.h.adapters.save({
      file: join(dir, ADAPTER_WEIGHTS),
      valueHeadFile: join(dir, VALUE_HEAD),
      criticFile: join(dir, CRITIC_ADAPTER),
    });
    writeAdapterConfig(dir, this.lora, this.dir);
  }

  attachValueHead(seed = 0): void {
    this.h.valueHead.attach(seed);
  }

  /**
   * PPO's separate critic (NativeValueHead.attachCritic): a second LoRA adapter on the same frozen base,
   * a copy of the actor's adapter now. detachCritic: the value head reads the actor's adapter again.
   */
  attachCritic(): void {
    if (!this.lora)
      throw new SlmError('NOT_SUPPORTED', "a separate critic starts as a copy of the actor's adapter: attach or load one first.");
    this.h.valueHead.attachCritic();
  }
  detachCritic(): void {
    this.h.valueHead.detachCritic();
  }
  hasCritic(): boolean {
    return this.h.valueHead.hasCritic();
  }

  /** Whether a PPO value head is attached (or was loaded with the adapter). */
  hasValueHead(): boolean {
    return 'value_head.bias' in this.h.adapters.trainable();
  }

  /**
   * The value head's predictions, aligned with the ids like the log-probs: out[t] = V(state before
   * token t) = w . h[t-1] + b where `masks[i][t]` is 1 (everywhere but t = 0 without masks); 0
   * elsewhere. One native forward for the batch (the separate critic's adapter when attached, else
   * the actor's; no dropout, no gradient), as verl's critic computes values before the update.
   */
  async values(rows: ArrayLike<number>[], masks?: ArrayLike<number>[]): Promise<Float32Array[]> {
    if (masks && masks.length !== rows.length)
      throw new SlmError('ARGUMENT_INVALID', `values: expected one mask per row (${rows.length}), found ${masks.length}.`);
    if (!this.hasValueHead())
      throw new SlmError('NOT_SUPPORTED', 'values: no value head is attached; call attachValueHead() or load an adapter saved with one.');
    rows.forEach((r, i) => {
      if (masks && masks[i].length !== r.length)
        throw new SlmError('ARGUMENT_INVALID', `values: mask ${i} has ${masks[i].length} entries for ${r.length} tokens.`);
    });
    const { ids, lengths } = this.#flatten(rows);
    const out = this.#split(await this.h.valueHead.values({ ids, lengths }), lengths);
    if (masks)
      out.forEach((v, i) => {
        for (let t = 0; t < v.length; t++) if (!masks[i][t]) v[t] = 0;
      });
    return out;
  }

  /** The final hidden state (after the last norm) of each row's last token: what embedding models pool. */
  async lastHidden(rows: ArrayLike<number>[]): Promise<Float32Array[]> {
    if (rows.some((r) => r.length === 0)) throw new SlmError('ARGUMENT_INVALID', 'lastHidden: every row needs at least one token.');
    const { ids, lengths } = this.#flatten(rows);
    const flat = await this.h.lastHidden({ ids, lengths });
    const H = this.config.hidden_size;
    return rows.map((_, i) => flat.slice(i * H, (i + 1) * H));
  }

  /** A flat per-token result back into rows of the given lengths. */
  #split(flat: Float32Array, lengths: Int32Array): Float32Array[] {
    let off = 0;
    return Array.from(lengths, (n) => flat.slice(off, (off += n)));
  }

  /** Rows of ids as one Int32Array + lengths (what the native teacher-forced calls take), checked. */
  #flatten(rows: ArrayLike<number>[]): { ids: Int32Array; lengths: Int32Array } {
    const lengths = Int32Array.from(rows.map((r) => r.length));
    const ids = new Int32Array(lengths.reduce((a, b) => a + b, 0));
    let off = 0;
    for (const r of rows) {
      ids.set(Array.from(r), off);
      off += r.length;
    }
    this.checkIds(ids);
    return { ids, lengths };
  }

  /**
   * Teacher-forced log-probs of the KL reference policy, as sequenceLogprobs: the adapter frozen by
   * setReferenceAdapter() (the SFT adapter an RL stage starts from), else the base model (adapter
   * off). One native forward with the reference option; the trained adapter is not touched.
   */
  async referenceLogprobs(
    rows: ArrayLike<number>[],
    temperature: number | ArrayLike<number> = 1,
    masks?: ArrayLike<number>[],
  ): Promise<Float32Array[]> {
    const { ids, lengths } = this.#flatten(rows);
    return this.#split(
      await this.h.sequenceLogprobs({
        ids,
        lengths,
        temperature: temperatureOption(temperature),
        reference: true,
        mask: masks && flatRows(masks, lengths, Uint8Array, 'log-prob masks'),
      }),
      lengths,
    );
  }

  /**
   * Freezes the adapter attached now as the KL reference policy of training (the loss's KL term and
   * referenceLogprobs). It survives replacing the trained adapter (a checkpoint restored on resume).
   */
  setReferenceAdapter(): void {
    if (!this.lora) throw new SlmError('NOT_SUPPORTED', 'there is no adapter to freeze as the KL reference: load or attach one first.');
    this.h.adapters.setReference();
  }

  /** The KL reference is the base model again. */
  clearReferenceAdapter(): void {
    this.h.adapters.clearReference();
  }

  /** Whether a frozen reference adapter is set (else the reference is the base model). */
  hasReferenceAdapter(): boolean {
    return this.h.adapters.hasReference();
  }

  /**
   * Merges the adapter into the base weights and writes a Hugging Face model folder (config.json,
   * model.safetensors, and the tokenizer / chat template / generation config files of the base).
   */
  async exportMerged(out: string, dtype: ComputeDtype = 'float32'): Promise<void> {
    mkdirSync(out, { recursive: true });
    await this.h.saveMerged({ file: join(out, 'model.safetensors'), dtype });
    writeFolderFiles(this.dir, out, { ...this.config.raw, torch_dtype: dtype });
  }

  /**
   * Data-parallel training (lib/distributed/data-parallel.ts): when set, every trainStep is one step
   * over the batches of all ranks (gradients all-reduced before the optimizer).
   */
  dataParallel?: { trainStep(model: Model, batch: TrainBatch, opts: TrainOptions): Promise<NativeTrainStats> };

  /**
   * One optimizer step in one native call: micro-batched forward/backward (per-layer checkpointing
   * by default), the loss, gradient clipping, AdamW. `masks[i][t] = 1` trains token t of sequence i.
   * With `dataParallel` set, the step spans every rank.
   */
  trainStep(batch: TrainBatch, opts: TrainOptions): Promise<NativeTrainStats> {
    return this.dataParallel ? this.dataParallel.trainStep(this, batch, opts) : this.trainStepLocal(batch, opts);
  }

  /** trainStep on this process alone (with `update: false` it leaves the gradients for gradients()). */
  async trainStepLocal(batch: TrainBatch, opts: TrainOptions): Promise<NativeTrainStats> {
    return this.h.optimizer.trainStep(nativeTrainRequest(batch, opts, (ids) => this.checkIds(ids)));
  }

  saveOptimizer(file: string): Promise<void> {
    return this.h.optimizer.save(file);
  }
  loadOptimizer(file: string): Promise<void> {
    return this.h.optimizer.load(file);
  }
  trainable(opts?: { grad?: boolean }): Record<string, Float32Array> {
    return this.h.adapters.trainable(opts);
  }
  setTrainable(name: string, values: Float32Array): void {
    this.h.adapters.setTrainable(name, values);
  }
  /** Every trainable tensor's gradient flattened in trainable() order (zeros where none). */
  gradients(): Float32Array {
    return this.h.optimizer.gradients();
  }
  /** The optimizer half of a step (norm, NaN/inf skip, clipping, AdamW) on the given flat gradients. */
  applyGradients(opts: NativeOptimOptions & { loss?: number; valueLoss?: number }, grads?: Float32Array): Promise<NativeApplyResult> {
    return this.h.optimizer.applyGradients(opts, grads);
  }
  baseDigest(): string {
    return this.h.baseDigest();
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
        throw new SlmError(
          'TOKEN_OUT_OF_RANGE',
          `token id ${v} at position ${i} is outside the vocabulary: expected integers in [0, ${this.config.vocab_size}).`,
        );
    }
  }

  /**
   * Logits of every position for a batch of equal-length rows ([batch][seqLen][vocab] flattened).
   * attentionMask / positionIds as in HF's forward; positions default to cumsum(mask) - 1.
   */
  async logits(
    rows: number[][],
    opts: { attentionMask?: number[][]; positionIds?: number[][] } = {},
  ): Promise<{ data: Float32Array; batch: number; seqLen: number; vocab: number }> {
    if (!rows.length || !rows[0].length) throw new SlmError('ARGUMENT_INVALID', 'logits needs at least one non-empty row of ids.');
    const T = rows[0].length;
    for (const r of rows)
      if (r.length !== T)
        throw new SlmError(
          'ARGUMENT_INVALID',
          `all rows must have the same length (pad them and pass attentionMask); found ${T} and ${r.length}.`,
        );
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

  async generate(req: GenerateRequest): Promise<GenerateResult & GenerateStats> {
    const B = req.prompts.length;
    if (B === 0)
      return {
        tokens: [],
        logprobs: [],
        finishReasons: [],
        steps: 0,
        prefillSeconds: 0,
        decodeSeconds: 0,
        prefillTokens: 0,
        prefillTokensRequested: 0,
        cacheReusedTokens: 0,
        cacheHits: 0,
        cacheEvicted: 0,
        cacheStale: 0,
      };
    const r = await this.h.generate(nativeGenerateRequest(req, (ids) => this.checkIds(ids)));
    this.#noteEvictions(r);
    const { tokens, logprobs } = generatedRows(r, B);
    return {
      tokens,
      logprobs,
      finishReasons: Array.from(r.finish, (f) => FINISH[f] as 'length' | 'stop_token' | 'stop_string'),
      steps: r.steps,
      prefillSeconds: r.prefillSeconds,
      decodeSeconds: r.decodeSeconds,
      prefillTokens: r.prefillTokens,
      prefillTokensRequested: r.prefillTokensRequested,
      cacheReusedTokens: r.cacheReusedTokens,
      cacheHits: r.cacheHits,
      cacheEvicted: r.cacheEvicted,
      cacheStale: r.cacheStale,
    };
  }

  /** Frees the episode KV caches kept under these keys (GenerateRequest.cacheKeys). */
  releaseCaches(keys: string[]): void {
    if (!Array.isArray(keys) || !keys.every((k) => typeof k === 'string'))
      throw new SlmError('ARGUMENT_INVALID', `releaseCaches expects an array of cache keys (strings), found ${describe(keys)}.`);
    if (keys.length) this.h.releaseCaches(keys);
  }
  /** Frees every episode KV cache of this model. */
  clearCaches(): void {
    this.h.clearCaches();
  }
  /**
   * The byte limit of the episode KV caches (default 2 GiB): beyond it the least recently used are
   * evicted and their episodes re-prefill. `log` gets one line the first time that happens.
   */
  setCacheLimit(bytes: number, opts: { log?: (line: string) => void } = {}): void {
    if (!Number.isSafeInteger(bytes) || bytes < 0)
      throw new SlmError(
        'ARGUMENT_INVALID',
        `the episode cache limit must be a non-negative integer number of bytes, found ${describe(bytes)}.`,
      );
    this.h.setCacheLimit(bytes);
    if (opts.log) this.#cacheLog = opts.log;
  }
  cacheStats(): NativeCacheStats {
    return this.h.cacheStats();
  }
  #cacheLog?: (line: string) => void;
  #evictionLogged = false;
  #noteEvictions(r: NativeGenerateResult): void {
    if (!r.cacheEvicted || this.#evictionLogged || !this.#cacheLog) return;
    this.#evictionLogged = true;
    const s = this.h.cacheStats();
    this.#cacheLog(
      `engine: the episode KV caches reached their limit (${(s.limitBytes / 2 ** 20).toFixed(0)} MiB): the least recently used are evicted and those episodes re-prefill their conversation (said once; raise rollout.kv_cache_mb to keep more)`,
    );
  }

  /**
   * generate in one batched native call, with each token reported to `onToken` as it is sampled
   * (step by step: what a streaming server sends), per-row token limits, the top-n log-probs of every
   * step, and rows that stop early when their signal aborts (finish 'cancelled'). Every token reaches
   * onToken before the promise resolves; an exception thrown by onToken rejects it once it ends.
   */
  async generateStream(req: StreamGenerateRequest): Promise<StreamGenerateResult> {
    if (req.prompts.length === 0)
      return { tokens: [], logprobs: [], finishReasons: [], steps: 0, prefillTokens: 0, prefillTokensRequested: 0, cacheReusedTokens: 0 };
    const { native: r, result } = await streamGenerate(
      this.h,
      nativeGenerateRequest(req, (ids) => this.checkIds(ids)),
      req,
      this.vocabSize,
    );
    this.#noteEvictions(r);
    return result;
  }

  /** Continuous batching: one decode loop that rows join while it runs (lib/engine/session.ts). */
  decodeSession(opts: SessionOptions = {}): DecodeSession {
    return new DecodeSession(this.h, opts, this.vocabSize);
  }

  /**
   * Teacher forcing: per row, out[t] = log p(ids[t] | ids[<t]) under softmax(logits / temperature)
   * (0 at t = 0). `temperature`: one for every row or one per row (rows sampled at different
   * temperatures share one forward). `masks` (one per row, one entry per token): only positions whose
   * entry is nonzero are scored, the others are 0 — the vocabulary head, most of a small model's
   * work, skips them (a prompt, a tool's output).
   */
  async sequenceLogprobs(
    rows: ArrayLike<number>[],
    temperature: number | ArrayLike<number> = 1,
    masks?: ArrayLike<number>[],
  ): Promise<Float32Array[]> {
    const { ids, lengths } = this.#flatten(rows);
    return this.#split(
      await this.h.sequenceLogprobs({
        ids,
        lengths,
        temperature: temperatureOption(temperature),
        mask: masks && flatRows(masks, lengths, Uint8Array, 'log-prob masks'),
      }),
      lengths,
    );
  }

  dispose(): void {
    this.handle?.dispose();
    this.handle = null;
  }
}

/** The native temperature option: a number as is, per-row values as a Float32Array. */
function temperatureOption(t: number | ArrayLike<number>): number | Float32Array {
  return typeof t === 'number' ? t : Float32Array.from(t);
}

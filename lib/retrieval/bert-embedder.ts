/**
 * Sentence embedders of the BERT family as an Embedder: all-MiniLM-L6-v2 (the reference system's
 * title embedder for `search_pages`) or any sentence-transformers folder of `model_type: bert`. The
 * folder's own tokenizer (WordPiece through @lenml/tokenizers, `[CLS] ... [SEP]`, cut at
 * sentence_bert_config.json's max_seq_length), the BERT encoder (post-norm blocks, erf GELU,
 * bidirectional attention) with every matrix product on the native engine (`linear`, libtorch) and
 * the rest (embeddings, LayerNorm, softmax, GELU) here, then the pooling that 1_Pooling/config.json
 * names (mean over the tokens, as sentence-transformers' default, or CLS) and L2 normalisation: what
 * sentence-transformers' Transformer -> Pooling -> Normalize modules compute. Weights are read from
 * the folder's model.safetensors (F32, F16 or BF16) into memory once (all-MiniLM-L6-v2: 90 MB).
 */
import { closeSync, existsSync, openSync, readFileSync, readSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { SlmError } from '../errors.js';
import { native } from '../engine/runtime.js';
import { readSafetensorsHeader } from '../model/safetensors.js';
import { loadTokenizer, type HfTokenizer } from '../model/tokenizer.js';
import type { Embedder } from './embedders.js';

export interface BertConfig {
  hidden: number;
  layers: number;
  heads: number;
  intermediate: number;
  eps: number;
  maxPositions: number;
  /** Tokens per text, [CLS] and [SEP] included (sentence_bert_config.json max_seq_length, else max_position_embeddings). */
  maxTokens: number;
  pooling: 'mean' | 'cls';
}

type Weights = Map<string, Float32Array>;

function readJsonIn(dir: string, file: string): Record<string, unknown> | undefined {
  const p = join(dir, file);
  if (!existsSync(p)) return undefined;
  try {
    return JSON.parse(readFileSync(p, 'utf8'));
  } catch (e) {
    throw new SlmError('MODEL_CONFIG_INVALID', `${p} is not valid JSON (${(e as Error).message}).`);
  }
}

/** The encoder's shape and pooling from config.json, sentence_bert_config.json and 1_Pooling/config.json. */
export function bertConfig(dir: string): BertConfig {
  const c = readJsonIn(dir, 'config.json') ?? {};
  if (c.model_type !== 'bert')
    throw new SlmError(
      'MODEL_TYPE_UNSUPPORTED',
      `${dir}: expected a BERT sentence embedder (config.json model_type "bert", e.g. all-MiniLM-L6-v2), found model_type ${JSON.stringify(c.model_type)}.`,
    );
  const num = (k: string, dflt?: number): number => {
    const v = c[k] ?? dflt;
    if (typeof v !== 'number' || !(v > 0))
      throw new SlmError('MODEL_CONFIG_INVALID', `${dir}/config.json: expected a positive number ${k}, found ${JSON.stringify(c[k])}.`);
    return v;
  };
  const act = c.hidden_act ?? 'gelu';
  if (act !== 'gelu')
    throw new SlmError('NOT_SUPPORTED', `${dir}/config.json: hidden_act ${JSON.stringify(act)}; the BERT embedder runs "gelu" (erf) only.`);
  const pos = c.position_embedding_type ?? 'absolute';
  if (pos !== 'absolute')
    throw new SlmError(
      'NOT_SUPPORTED',
      `${dir}/config.json: position_embedding_type ${JSON.stringify(pos)}; the BERT embedder runs "absolute" only.`,
    );
  const hidden = num('hidden_size'),
    heads = num('num_attention_heads');
  if (hidden % heads)
    throw new SlmError(
      'MODEL_CONFIG_INVALID',
      `${dir}/config.json: hidden_size ${hidden} is not a multiple of num_attention_heads ${heads}.`,
    );
  const maxPositions = num('max_position_embeddings');
  const st = readJsonIn(dir, 'sentence_bert_config.json');
  const maxTokens = Math.min(maxPositions, typeof st?.max_seq_length === 'number' ? st.max_seq_length : maxPositions);
  const p = readJsonIn(dir, join('1_Pooling', 'config.json'));
  let pooling: BertConfig['pooling'] = 'mean'; // sentence-transformers' default for a folder without modules
  if (p) {
    const on = Object.entries(p)
      .filter(([k, v]) => k.startsWith('pooling_mode_') && v === true)
      .map(([k]) => k.slice('pooling_mode_'.length));
    if (on.length !== 1 || !['mean_tokens', 'cls_token'].includes(on[0]))
      throw new SlmError(
        'NOT_SUPPORTED',
        `${dir}/1_Pooling/config.json: expected one pooling mode, mean_tokens or cls_token, found ${JSON.stringify(on)}.`,
      );
    pooling = on[0] === 'cls_token' ? 'cls' : 'mean';
  }
  return {
    hidden,
    layers: num('num_hidden_layers'),
    heads,
    intermediate: num('intermediate_size'),
    eps: num('layer_norm_eps', 1e-12),
    maxPositions,
    maxTokens,
    pooling,
  };
}

function toF32(buf: Buffer, dtype: string, name: string, file: string): Float32Array {
  if (dtype === 'F32') return new Float32Array(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.length));
  const n = buf.length / 2;
  const out = new Float32Array(n);
  const u = new Uint32Array(out.buffer);
  for (let i = 0; i < n; i++) {
    const h = buf.readUInt16LE(2 * i);
    if (dtype === 'BF16') u[i] = h << 16;
    else if (dtype === 'F16') {
      const e = (h >> 10) & 31,
        m = h & 1023,
        s = h & 0x8000 ? -1 : 1;
      out[i] = e === 0 ? s * m * 2 ** -24 : e === 31 ? (m ? NaN : s * Infinity) : s * (1 + m / 1024) * 2 ** (e - 15);
    } else throw new SlmError('DTYPE_UNSUPPORTED', `${file}: tensor ${name} is ${dtype}; expected F32, F16 or BF16.`);
  }
  return out;
}

/** The encoder's tensors (with or without a `bert.` prefix), checked against the config's shapes. */
function loadWeights(dir: string, cfg: BertConfig): Weights {
  const file = join(dir, 'model.safetensors');
  if (!existsSync(file)) throw new SlmError('WEIGHTS_MISSING', `${dir}: expected the BERT weights in model.safetensors, found none.`);
  const header = readSafetensorsHeader(file);
  const prefix = 'embeddings.word_embeddings.weight' in header ? '' : 'bert.embeddings.word_embeddings.weight' in header ? 'bert.' : null;
  if (prefix === null)
    throw new SlmError(
      'WEIGHTS_MISMATCH',
      `${file}: expected BERT tensors (embeddings.word_embeddings.weight), found ${Object.keys(header).slice(0, 4).join(', ')}...`,
    );
  const H = cfg.hidden,
    I = cfg.intermediate;
  const want: Array<[string, number[]]> = [
    ['embeddings.position_embeddings.weight', [cfg.maxPositions, H]],
    ['embeddings.token_type_embeddings.weight', [-1, H]],
    ['embeddings.LayerNorm.weight', [H]],
    ['embeddings.LayerNorm.bias', [H]],
  ];
  for (let l = 0; l < cfg.layers; l++) {
    const b = `encoder.layer.${l}.`;
    for (const m of ['attention.self.query', 'attention.self.key', 'attention.self.value', 'attention.output.dense'])
      want.push([`${b}${m}.weight`, [H, H]], [`${b}${m}.bias`, [H]]);
    want.push(
      [`${b}intermediate.dense.weight`, [I, H]],
      [`${b}intermediate.dense.bias`, [I]],
      [`${b}output.dense.weight`, [H, I]],
      [`${b}output.dense.bias`, [H]],
    );
    for (const n of ['attention.output.LayerNorm', 'output.LayerNorm']) want.push([`${b}${n}.weight`, [H]], [`${b}${n}.bias`, [H]]);
  }
  want.push(['embeddings.word_embeddings.weight', [-1, H]]);
  const w: Weights = new Map();
  const fd = openSync(file, 'r');
  try {
    const len = Buffer.alloc(8);
    readSync(fd, len, 0, 8, 0);
    const dataStart = 8 + Number(len.readBigUInt64LE());
    for (const [name, shape] of want) {
      const e = header[prefix + name];
      if (!e || e.shape.length !== shape.length || shape.some((d, i) => d !== -1 && d !== e.shape[i]))
        throw new SlmError(
          'WEIGHTS_MISMATCH',
          `${file}: expected ${prefix}${name} of shape [${shape.map((d) => (d < 0 ? 'N' : d)).join(', ')}] (config.json), found ${e ? `[${e.shape.join(', ')}]` : 'none'}.`,
        );
      const [a, b] = e.data_offsets;
      const buf = Buffer.alloc(b - a);
      readSync(fd, buf, 0, b - a, dataStart + a);
      w.set(name, toF32(buf, e.dtype, prefix + name, file));
    }
  } finally {
    closeSync(fd);
  }
  return w;
}

/** erf by Numerical Recipes' erfc (fractional error below 1.2e-7 everywhere): JavaScript has no Math.erf. */
export function erf(x: number): number {
  const z = Math.abs(x);
  const t = 1 / (1 + 0.5 * z);
  const r =
    t *
    Math.exp(
      -z * z -
        1.26551223 +
        t *
          (1.00002368 +
            t *
              (0.37409196 +
                t *
                  (0.09678418 +
                    t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))),
    );
  return x >= 0 ? 1 - r : r - 1;
}

/** LayerNorm over rows of `x` [rows, n] in place (float64 sums). */
function layerNorm(x: Float32Array, n: number, g: Float32Array, b: Float32Array, eps: number): void {
  for (let o = 0; o < x.length; o += n) {
    let s = 0,
      s2 = 0;
    for (let i = 0; i < n; i++) s += x[o + i];
    const mean = s / n;
    for (let i = 0; i < n; i++) s2 += (x[o + i] - mean) ** 2;
    const inv = 1 / Math.sqrt(s2 / n + eps);
    for (let i = 0; i < n; i++) x[o + i] = (x[o + i] - mean) * inv * g[i] + b[i];
  }
}

export class BertEmbedder implements Embedder {
  readonly name: string;
  readonly dim: number;
  private constructor(
    readonly dir: string,
    readonly config: BertConfig,
    private w: Weights,
    private tok: HfTokenizer,
    readonly batchTokens: number,
  ) {
    this.name = `bert:${dir}`;
    this.dim = config.hidden;
  }

  /**
   * A sentence-transformers BERT folder: config.json (model_type bert), model.safetensors,
   * tokenizer.json, and optionally sentence_bert_config.json and 1_Pooling/config.json.
   */
  static load(dir: string, opts: { batchTokens?: number } = {}): BertEmbedder {
    const abs = resolve(dir);
    const cfg = bertConfig(abs);
    const w = loadWeights(abs, cfg);
    if (!existsSync(join(abs, 'tokenizer.json')))
      throw new SlmError('TOKENIZER_MISSING', `${abs}: expected the BERT model's tokenizer.json (WordPiece), found none.`);
    return new BertEmbedder(abs, cfg, w, loadTokenizer(abs), opts.batchTokens ?? 4096);
  }

  /** Token ids as sentence-transformers feeds them: [CLS] text [SEP], cut to max_seq_length (keeping [SEP]). */
  ids(text: string): number[] {
    const e = this.tok.encode(text || ' ', { addSpecialTokens: true }); // '' gives no ids at all, ' ' gives [CLS] [SEP] as in Python
    return e.length > this.config.maxTokens ? [...e.slice(0, this.config.maxTokens - 1), e[e.length - 1]] : e;
  }

  private linear(x: Float32Array, m: number, name: string, n: number, k: number): Float32Array {
    const y = native().linear({ x, w: this.w.get(`${name}.weight`)!, m, n, k });
    const b = this.w.get(`${name}.bias`)!;
    for (let r = 0; r < y.length; r += n) for (let j = 0; j < n; j++) y[r + j] += b[j];
    return y;
  }

  /** Unit vectors of token-id sequences (one forward over all their tokens, attention within each). */
  embedIds(seqs: number[][]): Float32Array[] {
    const { hidden: H, heads, eps, intermediate: I } = this.config;
    const d = H / heads;
    const T = seqs.reduce((a, s) => a + s.length, 0);
    const starts: number[] = [];
    const word = this.w.get('embeddings.word_embeddings.weight')!,
      pos = this.w.get('embeddings.position_embeddings.weight')!,
      type = this.w.get('embeddings.token_type_embeddings.weight')!;
    const vocab = word.length / H;
    let x: Float32Array = new Float32Array(T * H);
    let t = 0;
    for (const s of seqs) {
      starts.push(t);
      s.forEach((id, p) => {
        if (!(id >= 0 && id < vocab))
          throw new SlmError('TOKEN_OUT_OF_RANGE', `${this.dir}: token id ${id} is outside the embedding table's ${vocab} rows.`);
        for (let i = 0; i < H; i++) x[(t + p) * H + i] = word[id * H + i] + pos[p * H + i] + type[i];
      });
      t += s.length;
    }
    layerNorm(x, H, this.w.get('embeddings.LayerNorm.weight')!, this.w.get('embeddings.LayerNorm.bias')!, eps);
    const scale = 1 / Math.sqrt(d);
    for (let l = 0; l < this.config.layers; l++) {
      const b = `encoder.layer.${l}.`;
      const q = this.linear(x, T, `${b}attention.self.query`, H, H),
        k = this.linear(x, T, `${b}attention.self.key`, H, H),
        v = this.linear(x, T, `${b}attention.self.value`, H, H);
      const ctx = new Float32Array(T * H);
      seqs.forEach((s, si) => {
        const L = s.length,
          o = starts[si];
        const qh = new Float32Array(L * d),
          kh = new Float32Array(L * d),
          vt = new Float32Array(d * L);
        for (let h = 0; h < heads; h++) {
          for (let p = 0; p < L; p++)
            for (let j = 0; j < d; j++) {
              const src = (o + p) * H + h * d + j;
              qh[p * d + j] = q[src] * scale;
              kh[p * d + j] = k[src];
              vt[j * L + p] = v[src];
            }
          const sc = native().linear({ x: qh, w: kh, m: L, n: L, k: d }); // [L, L]
          for (let r = 0; r < L * L; r += L) {
            let mx = -Infinity,
              sum = 0;
            for (let j = 0; j < L; j++) mx = Math.max(mx, sc[r + j]);
            for (let j = 0; j < L; j++) sum += sc[r + j] = Math.exp(sc[r + j] - mx);
            for (let j = 0; j < L; j++) sc[r + j] /= sum;
          }
          const out = native().linear({ x: sc, w: vt, m: L, n: d, k: L }); // [L, d]
          for (let p = 0; p < L; p++) for (let j = 0; j < d; j++) ctx[(o + p) * H + h * d + j] = out[p * d + j];
        }
      });
      const a = this.linear(ctx, T, `${b}attention.output.dense`, H, H);
      for (let i = 0; i < a.length; i++) a[i] += x[i];
      layerNorm(a, H, this.w.get(`${b}attention.output.LayerNorm.weight`)!, this.w.get(`${b}attention.output.LayerNorm.bias`)!, eps);
      const inter = this.linear(a, T, `${b}intermediate.dense`, I, H);
      for (let i = 0; i < inter.length; i++) inter[i] = 0.5 * inter[i] * (1 + erf(inter[i] * Math.SQRT1_2));
      x = this.linear(inter, T, `${b}output.dense`, H, I);
      for (let i = 0; i < x.length; i++) x[i] += a[i];
      layerNorm(x, H, this.w.get(`${b}output.LayerNorm.weight`)!, this.w.get(`${b}output.LayerNorm.bias`)!, eps);
    }
    return seqs.map((s, si) => {
      const o = starts[si] * H;
      const out = new Float32Array(H);
      const acc = new Float64Array(H);
      const rows = this.config.pooling === 'cls' ? 1 : s.length;
      for (let p = 0; p < rows; p++) for (let i = 0; i < H; i++) acc[i] += x[o + p * H + i];
      let n = 0;
      for (let i = 0; i < H; i++) n += (acc[i] / rows) ** 2;
      n = Math.sqrt(n) || 1;
      for (let i = 0; i < H; i++) out[i] = acc[i] / rows / n;
      return out;
    });
  }

  async embed(texts: string[], _kind: 'query' | 'document' = 'document'): Promise<Float32Array[]> {
    const ids = texts.map((s) => this.ids(s));
    const out: Float32Array[] = new Array(texts.length);
    // Similar lengths together; up to batchTokens tokens per forward.
    const order = ids.map((_, i) => i).sort((a, b) => ids[a].length - ids[b].length);
    for (let s = 0; s < order.length; ) {
      const part: number[] = [];
      let n = 0;
      while (s < order.length && (part.length === 0 || n + ids[order[s]].length <= this.batchTokens)) {
        n += ids[order[s]].length;
        part.push(order[s++]);
      }
      this.embedIds(part.map((i) => ids[i])).forEach((v, j) => (out[part[j]] = v));
      await new Promise((r) => setImmediate(r)); // let timers and I/O run between forwards
    }
    return out;
  }
}

/**
 * Token bytes: the raw bytes every vocabulary entry of a `tokenizer.json` stands for (byte-level
 * BPE pieces through the inverse of GPT-2's byte-to-unicode table, SentencePiece byte fallback and
 * `▁`, WordPiece prefixes, added tokens), packed into one buffer for `HfTokenizer.tokenBytes()`.
 */

/** The subset of `tokenizer.json` slm-train reads itself (the library reads the rest). */
export interface TokenizerJson {
  model: {
    type?: string;
    vocab?: Record<string, number> | Array<[string, number]>;
    byte_fallback?: boolean;
    continuing_subword_prefix?: string;
  };
  added_tokens?: Array<{ id: number; content: string; special?: boolean }>;
  decoder?: Component | null;
  pre_tokenizer?: Component | null;
}
interface Component {
  type?: string;
  decoders?: Component[];
  pretokenizers?: Component[];
  pattern?: { String?: string };
  content?: string;
}

/** What `tokenBytes()` needs to know about a tokenizer.json besides its pieces. */
export interface BytesPlan {
  byteLevel: boolean;
  metaspace: boolean;
  byteFallback: boolean;
  wordPiecePrefix?: string;
  added: Array<{ id: number; content: string }>;
}

/** GPT-2's byte-to-unicode table, inverted: code point of the printable stand-in -> byte. */
export function byteLevelDecodeTable(): Map<number, number> {
  const bs: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n++);
    }
  }
  const inv = new Map<number, number>();
  bs.forEach((b, i) => inv.set(cs[i], b));
  return inv;
}

function hasComponent(c: Component | null | undefined, type: string): boolean {
  if (!c) return false;
  if (c.type === type) return true;
  return [...(c.decoders ?? []), ...(c.pretokenizers ?? [])].some((s) => hasComponent(s, type));
}

export function bytesPlan(json: TokenizerJson): BytesPlan {
  return {
    byteLevel: hasComponent(json.decoder, 'ByteLevel') || hasComponent(json.pre_tokenizer, 'ByteLevel'),
    metaspace:
      hasComponent(json.decoder, 'Metaspace') ||
      hasComponent(json.pre_tokenizer, 'Metaspace') ||
      JSON.stringify(json.decoder ?? null).includes('"▁"'),
    byteFallback: json.model.byte_fallback === true,
    wordPiecePrefix: json.model.type === 'WordPiece' ? (json.model.continuing_subword_prefix ?? '##') : undefined,
    added: (json.added_tokens ?? []).map((t) => ({ id: t.id, content: t.content })),
  };
}

/** `pieces[id]` is the vocabulary's spelling of id (as the tokenizer library holds it). */
export function packTokenBytes(pieces: ArrayLike<string | undefined>, plan: BytesPlan): { bytes: Uint8Array; offsets: Uint32Array } {
  const vocabSize = pieces.length;
  const enc = new TextEncoder();
  const out: Array<Uint8Array | undefined> = new Array(vocabSize);
  const inv = plan.byteLevel ? byteLevelDecodeTable() : undefined;

  for (let id = 0; id < vocabSize; id++) {
    const piece = pieces[id];
    if (piece === undefined) continue;
    if (inv) {
      const buf = new Uint8Array(piece.length * 4);
      let k = 0;
      for (const ch of piece) {
        const b = inv.get(ch.codePointAt(0)!);
        if (b !== undefined) buf[k++] = b;
        else k += enc.encodeInto(ch, buf.subarray(k)).written; // not a byte-level stand-in: its UTF-8
      }
      out[id] = buf.slice(0, k);
    } else if (plan.byteFallback && /^<0x[0-9A-Fa-f]{2}>$/.test(piece)) {
      out[id] = Uint8Array.of(parseInt(piece.slice(3, 5), 16));
    } else {
      let text = piece;
      if (plan.metaspace) text = text.replaceAll('▁', ' ');
      if (plan.wordPiecePrefix && text.startsWith(plan.wordPiecePrefix)) text = text.slice(plan.wordPiecePrefix.length);
      out[id] = enc.encode(text);
    }
  }
  // Added tokens (special or not) are matched on their content before the model runs: their bytes are their UTF-8.
  for (const t of plan.added) if (t.id >= 0 && t.id < vocabSize) out[t.id] = enc.encode(t.content);

  const offsets = new Uint32Array(vocabSize + 1);
  let total = 0;
  for (let i = 0; i < vocabSize; i++) {
    offsets[i] = total;
    total += out[i]?.length ?? 0;
  }
  offsets[vocabSize] = total;
  const bytes = new Uint8Array(total);
  for (let i = 0; i < vocabSize; i++) if (out[i]) bytes.set(out[i]!, offsets[i]);
  return { bytes, offsets };
}

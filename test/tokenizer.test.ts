import t from 'tap';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { QWEN3_PACKAGE, byteLevelDecodeTable, loadTokenizer, qwen3Tokenizer } from '../lib/model/tokenizer.js';
import { fixture, haveShared, needs } from './helpers/shared.js';

const utf8 = (s: string) => Buffer.from(s, 'utf8');
const joinBytes = (pieces: Uint8Array[], ids: number[]) => Buffer.concat(ids.map((i) => pieces[i]));

const MIXED =
  'Héllo wörld — naïve café, 東京タワー, emoji 🙂👍🏽 and math ∑x².\n' +
  'def f(x):\n    return {"k": [x ** 2 for x in range(10)]}  # comment\r\n\t<python>print(search_pages("x"))</python>\n' +
  '<|im_start|>assistant\n<think>\nhmm\n</think>\n\n<answer>42</answer><|im_end|>\n<|endoftext|>   trailing  ';

const tmp = mkdtempSync(join(tmpdir(), 'slm-tok-'));
t.teardown(() => rmSync(tmp, { recursive: true, force: true }));
function folder(name: string, files: Record<string, string | object>): string {
  const dir = join(tmp, name);
  mkdirSync(dir, { recursive: true });
  for (const [f, v] of Object.entries(files)) writeFileSync(join(dir, f), typeof v === 'string' ? v : JSON.stringify(v));
  return dir;
}

t.test('packaged Qwen3 tokenizer: known ids', async (t) => {
  const tok = qwen3Tokenizer();
  t.equal(tok.source, QWEN3_PACKAGE);
  t.equal(tok.packaged, true);
  t.equal(tok.vocabSize, 151669);
  t.same(tok.encode('Hello <|im_start|>user\n'), [9707, 220, 151644, 872, 198]);
  t.equal(tok.tokenId('<|im_end|>'), 151645);
  t.equal(tok.tokenId('<|endoftext|>'), 151643);
  t.equal(tok.tokenId('<think>'), 151667);
  t.equal(tok.tokenId('no such token'), undefined);
  t.same(tok.stopTokenIds, [151645, 151643], 'eos <|im_end|> first, then <|endoftext|>');
  t.equal(tok.eosToken, '<|im_end|>');
  t.equal(tok.bosToken, '');
  t.same(tok.encode(''), []);
  t.equal(tok.decode([]), '');
  t.equal(qwen3Tokenizer(), tok, 'loaded once per process');
});

t.test('decode(encode(x)) round trip on mixed text', async (t) => {
  const tok = qwen3Tokenizer();
  const ids = tok.encode(MIXED);
  t.equal(tok.decode(ids), MIXED);
  for (const special of ['<|im_start|>', '<|im_end|>', '<|endoftext|>', '<think>', '</think>']) {
    t.ok(ids.includes(tok.tokenId(special)!), `${special} is one token`);
  }
  t.equal(tok.decode(Int32Array.from(ids)), MIXED, 'typed arrays decode too');
  const skipped = tok.decode(ids, { skipSpecialTokens: true });
  t.notOk(
    skipped.includes('<|im_start|>') || skipped.includes('<|im_end|>') || skipped.includes('<|endoftext|>'),
    'special tokens skipped',
  );
  t.ok(skipped.includes('<think>'), '<think> is an added but not special token: kept');
  // A multi-byte character split over tokens decodes back whole once all its tokens are there.
  const emoji = tok.encode('👍🏽');
  t.ok(emoji.length > 1);
  t.equal(tok.decode(emoji), '👍🏽');
});

t.test('decode rejects ids outside the vocabulary', async (t) => {
  const tok = qwen3Tokenizer();
  t.throws(() => tok.decode([1, 151669]), { code: 'TOKEN_OUT_OF_RANGE', message: /\[0, 151669\).*position 1 holds 151669/ });
  t.throws(() => tok.decode([-1]), { code: 'TOKEN_OUT_OF_RANGE' });
  t.throws(() => tok.decode([1.5]), { code: 'TOKEN_OUT_OF_RANGE' });
  t.throws(() => tok.encode(42 as unknown as string), { code: 'ARGUMENT_INVALID' });
});

t.test('tokenBytes: the bytes of an encoding are the UTF-8 of the text', async (t) => {
  const tok = qwen3Tokenizer();
  const pieces = tok.tokenBytes();
  t.equal(pieces.length, tok.vocabSize);
  t.equal(tok.tokenBytes(), pieces, 'computed once');
  for (const text of [MIXED, ' leading space', 'a\u00a0b\u200bc', '\u0000\u0001\u007f control']) {
    t.ok(joinBytes(pieces, tok.encode(text)).equals(utf8(text)), JSON.stringify(text.slice(0, 20)));
  }
  // The Qwen3 tokenizer normalises to NFC first: the bytes are those of the NFC form.
  const nfd = 'cafe\u0301';
  t.ok(joinBytes(pieces, tok.encode(nfd)).equals(utf8(nfd.normalize('NFC'))));
  t.ok(Buffer.from(pieces[tok.tokenId('<|im_end|>')!]).equals(utf8('<|im_end|>')), 'special token: its content');
  t.ok(Buffer.from(pieces[tok.tokenId('<think>')!]).equals(utf8('<think>')));
  t.ok(Buffer.from(pieces[220]).equals(Buffer.from([0x20])), 'id 220 (Ġ) is a space');
  t.ok(Buffer.from(pieces[198]).equals(Buffer.from([0x0a])), 'id 198 (Ċ) is a newline');
  // Emoji tokens carry partial UTF-8 sequences: raw bytes, not replacement characters.
  const emoji = tok.encode('🙂');
  t.ok(joinBytes(pieces, emoji).equals(Buffer.from([0xf0, 0x9f, 0x99, 0x82])));
  const { bytes, offsets } = tok.packedTokenBytes();
  t.equal(offsets.length, tok.vocabSize + 1);
  t.equal(offsets[tok.vocabSize], bytes.length);
  t.ok(Buffer.from(bytes.subarray(offsets[9707], offsets[9708])).equals(utf8('Hello')));
});

t.test('byte-level table is GPT-2 bytes_to_unicode inverted', async (t) => {
  const inv = byteLevelDecodeTable();
  t.equal(inv.size, 256);
  t.same(new Set(inv.values()).size, 256, 'a bijection onto all bytes');
  t.equal(inv.get('!'.codePointAt(0)!), 0x21);
  t.equal(inv.get('Ġ'.codePointAt(0)!), 0x20);
  t.equal(inv.get('Ċ'.codePointAt(0)!), 0x0a);
  t.equal(inv.get(256), 0x00);
  t.equal(inv.get(256 + 67), 0xad, 'soft hyphen: the 68th non-printable byte');
});

/** GPT-2 byte-to-unicode, written out independently of the module under test. */
function byteChars(): string[] {
  const printable = (b: number) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  const out: string[] = [];
  let n = 0;
  for (let b = 0; b < 256; b++) out[b] = String.fromCodePoint(printable(b) ? b : 256 + n++);
  return out;
}

/** A tiny byte-level BPE tokenizer.json: 256 byte ids, merges spelling "Hello", one special token. */
function tinyTokenizerJson() {
  const chars = byteChars();
  const vocab: Record<string, number> = {};
  chars.forEach((c, b) => (vocab[c] = b));
  const merges = [
    ['H', 'e'],
    ['He', 'l'],
    ['Hel', 'l'],
    ['Hell', 'o'],
    ['Ġ', 'w'],
  ];
  let id = 256;
  for (const [a, b] of merges) vocab[a + b] = id++;
  return {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: [{ id: 261, content: '<|im_end|>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }],
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: '',
      end_of_word_suffix: '',
      fuse_unk: false,
      byte_fallback: false,
      vocab,
      merges,
    },
  };
}

t.test("a model folder's own tokenizer.json is used instead of the packaged one", async (t) => {
  const dir = folder('tiny', {
    'tokenizer.json': tinyTokenizerJson(),
    'tokenizer_config.json': {
      tokenizer_class: 'PreTrainedTokenizerFast',
      eos_token: '<|im_end|>',
      bos_token: null,
      clean_up_tokenization_spaces: false,
    },
    'config.json': { model_type: 'qwen3', eos_token_id: 7 },
  });
  const tok = loadTokenizer(dir);
  t.equal(tok.packaged, false);
  t.equal(tok.source, join(dir, 'tokenizer.json'));
  t.equal(tok.vocabSize, 262);
  t.same(tok.encode('Hello'), [259]);
  t.same(tok.encode('Hello world<|im_end|>'), [259, 260, ...[...'orld'].map((c) => c.charCodeAt(0)), 261]);
  t.same(tok.stopTokenIds, [7, 261], 'config.json eos_token_id, then the tokenizer_config eos');
  const text = 'Hello wörld 🙂\n<|im_end|>';
  const ids = tok.encode(text);
  t.equal(tok.decode(ids), text);
  t.equal(tok.decode(ids, { skipSpecialTokens: true }), 'Hello wörld 🙂\n');
  t.ok(joinBytes(tok.tokenBytes(), ids).equals(utf8(text)));
  t.equal(qwen3Tokenizer().encode('Hello')[0], 9707, 'the packaged tokenizer is unaffected');
  t.equal(loadTokenizer(dir), tok, 'loaded once while the files are unchanged');
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ model_type: 'qwen3', eos_token_id: 12 }));
  const reloaded = loadTokenizer(dir);
  t.not(reloaded, tok, 'reloaded after a file changed');
  t.same(reloaded.stopTokenIds, [12, 261]);
});

t.test('folders without tokenizer.json use the packaged Qwen3 tokenizer', async (t) => {
  const empty = folder('empty', {});
  t.equal(loadTokenizer(empty), qwen3Tokenizer(), 'an empty folder: the packaged tokenizer itself');
  const withEos = folder('eos', { 'config.json': { eos_token_id: [151645, 151643, 151662] } });
  const tok = loadTokenizer(withEos);
  t.equal(tok.packaged, true);
  t.same(tok.stopTokenIds, [151645, 151643, 151662], 'generation eos ids from config.json');
  t.same(tok.encode('Hello <|im_start|>user\n'), [9707, 220, 151644, 872, 198]);
});

t.test(
  'the real Qwen3-2507 tokenizer files (no tokenizer.json) load on the packaged vocabulary',
  { skip: needs(!haveShared && 'needs ../shared beside the checkout (fixtures and data)', t) },
  async (t) => {
    const tok = loadTokenizer(fixture('qwen3-tokenizer'));
    t.equal(tok.packaged, true);
    t.equal(tok.config.model_max_length, 1010000, "the folder's tokenizer_config wins over the package's");
    t.equal(tok.eosToken, '<|im_end|>');
    t.same(tok.stopTokenIds, [151645, 151643]);
    t.same(tok.encode('Hello <|im_start|>user\n'), [9707, 220, 151644, 872, 198]);
  },
);

t.test('bad tokenizer folders give coded errors', async (t) => {
  t.throws(() => loadTokenizer(join(tmp, 'missing')), { code: 'MODEL_NOT_FOUND', message: /nothing is there/ });
  t.throws(() => loadTokenizer(folder('badjson', { 'tokenizer.json': '{"model": ' })), {
    code: 'TOKENIZER_MISSING',
    message: /tokenizer\.json to be JSON/,
  });
  const unreadable = folder('unreadable', {});
  mkdirSync(join(unreadable, 'tokenizer.json'));
  t.throws(() => loadTokenizer(unreadable), { code: 'TOKENIZER_MISSING', message: /readable file/ });
  t.throws(() => loadTokenizer(folder('nomodel', { 'tokenizer.json': { version: '1.0' } })), {
    code: 'TOKENIZER_MISSING',
    message: /without "model"/,
  });
  t.throws(() => loadTokenizer(folder('spm', { 'tokenizer.model': 'x' })), {
    code: 'TOKENIZER_MISSING',
    message: /tokenizer\.model.*save_pretrained/,
  });
  t.throws(() => loadTokenizer(folder('llama', { 'tokenizer_config.json': { tokenizer_class: 'LlamaTokenizer' } })), {
    code: 'TOKENIZER_MISSING',
    message: /LlamaTokenizer/,
  });
  t.throws(() => loadTokenizer(folder('badconfig', { 'tokenizer_config.json': '[1]' })), {
    code: 'TOKENIZER_MISSING',
    message: /JSON object/,
  });
});

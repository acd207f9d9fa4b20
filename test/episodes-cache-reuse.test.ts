// The EpisodeRunner over the real engine (the tiny Qwen3 fixture, random weights) with multi-turn
// KV-cache reuse on and off (issue 19, item 2): for both protocols the episodes must be identical
// (ids, masks, log-probs within 1e-5, turns, answers, texts), reuse must actually happen (prompt
// tokens taken from the caches), and every cache must be freed when the batch ends, those of
// episodes that ended early as soon as they ended.
import t, { type Test } from 'tap';
import { readFileSync } from 'node:fs';
import { Model } from '../lib/engine/model.js';
import type { GenerateRequest, TextGenerator } from '../lib/engine/types.js';
import {
  codeProtocol,
  EpisodeRunner,
  tagsProtocol,
  type CodeExecutor,
  type Episode,
  type EpisodeProtocol,
  type ProgramResult,
} from '../lib/episodes/index.js';
import { ChatFormatter } from '../lib/model/chat.js';
import { packagedQwen3Config } from '../lib/model/tokenizer.js';
import { fixture, haveShared } from './helpers/shared.js';

const IM_END = '<|im_end|>';
const template = haveShared
  ? readFileSync(fixture('qwen3-tokenizer', 'chat_template.jinja'), 'utf8')
  : (packagedQwen3Config().chat_template as string);
const formatter = new ChatFormatter(template, { eosToken: IM_END });

// A tokenizer for the 512-id fixture: printable ASCII bytes are themselves, and ids from 256 on are
// the protocols' tags and a few words, cycled, so that a random model writes actions now and then.
const PIECES = [
  IM_END,
  '<python>',
  '</python>',
  '<answer>',
  '</answer>',
  '<search>',
  '</search>',
  '<think>',
  '</think>',
  ' x = 1\n',
  'print(x)',
  ' the ',
  '\n',
  '<|im_start|>',
];
const pieces: string[] = Array.from({ length: 512 }, (_, id) =>
  id < 256 ? (id === 10 || (id >= 32 && id < 127) ? String.fromCharCode(id) : '') : PIECES[(id - 256) % PIECES.length],
);
const firstId = new Map<string, number>();
pieces.forEach((p, id) => {
  if (id >= 256 && !firstId.has(p)) firstId.set(p, id);
});
const specials = [...firstId.keys()].sort((a, b) => b.length - a.length);
const tok = {
  encode(text: string): number[] {
    const out: number[] = [];
    for (let i = 0; i < text.length; ) {
      const sp = text[i] === '<' ? specials.find((s) => text.startsWith(s, i)) : undefined;
      if (sp) {
        out.push(firstId.get(sp)!);
        i += sp.length;
        continue;
      }
      const c = text.charCodeAt(i);
      out.push(c === 10 || (c >= 32 && c < 127) ? c : 63);
      i++;
    }
    return out;
  },
  decode: (ids: ArrayLike<number>) => Array.from(ids, (id) => pieces[id] ?? '').join(''),
  stopTokenIds: [firstId.get(IM_END)!],
  specialTokens: [IM_END, '<|im_start|>'],
};

class EchoExecutor implements CodeExecutor {
  async run(code: string): Promise<ProgramResult> {
    return { stdout: `ran ${code.length} chars\n`, error: null, timed_out: false, calls: [], truncated: false, duration_ms: 1 };
  }
}

/** The model, recording the cache keys it was sent and the keys released. */
class Recording implements TextGenerator {
  keysSent = 0;
  released: string[][] = [];
  reused = 0;
  constructor(private m: Model) {}
  async generate(req: GenerateRequest) {
    if (req.cacheKeys) this.keysSent++;
    const r = await this.m.generate(req);
    this.reused += r.cacheReusedTokens;
    return r;
  }
  releaseCaches(keys: string[]): void {
    this.released.push(keys);
    this.m.releaseCaches(keys);
  }
}

const short = (q: string) => [
  { role: 'system' as const, content: 'Answer with <python>code</python> or <answer>text</answer>; search with <search>q</search>.' },
  { role: 'user' as const, content: q },
];

function same(t: Test, a: Episode[], b: Episode[], what: string) {
  t.equal(a.length, b.length);
  a.forEach((x, i) => {
    const y = b[i];
    t.same(Array.from(x.ids), Array.from(y.ids), `${what} episode ${i}: the same ids`);
    t.same(Array.from(x.lossMask), Array.from(y.lossMask), `${what} episode ${i}: the same mask`);
    let d = 0;
    x.logprobs.forEach((v, k) => (d = Math.max(d, Math.abs(v - y.logprobs[k]))));
    t.ok(d <= 1e-5, `${what} episode ${i}: log-probs within 1e-5 (${d.toExponential(2)})`);
    t.same([x.finish, x.turns, x.answer], [y.finish, y.turns, y.answer], `${what} episode ${i}: the same end`);
    t.same(x.segments, y.segments, `${what} episode ${i}: the same texts`);
  });
}

for (const name of ['code', 'tags'] as const) {
  t.test(`${name} protocol: episodes with cache reuse equal those without`, async (t) => {
    const m = await Model.load(fixture('qwen3', 'tiny-qwen3-f32'));
    t.teardown(() => m.dispose());
    m.setVocab(pieces.map((p) => new TextEncoder().encode(p)));
    const protocol: EpisodeProtocol =
      name === 'code'
        ? codeProtocol({ executor: new EchoExecutor() })
        : tagsProtocol({ search: { searchPassages: (q: string) => [{ title: 'T', text: `about ${q.slice(0, 20)}` }] } });
    // Greedy and sampled episodes (own seeds), two with the protocol's own long prompt: those run out
    // of context (maxTotalTokens) before the others end, so their caches are released first.
    const reqs = Array.from({ length: 6 }, (_, i) => ({
      question: `question ${i % 3}?`,
      temperature: i % 2 ? 1 : 0,
      seed: 11 + i,
      ...(i < 4 ? { messages: short(`question ${i % 3}?`) } : {}),
    }));
    const run = async (cacheReuse: boolean) => {
      const g = new Recording(m);
      const r = new EpisodeRunner({
        generator: g,
        tokenizer: tok,
        formatter,
        protocol,
        maxTurns: 4,
        maxNewTokens: 24,
        maxTotalTokens: name === 'code' ? 2750 : 1000,
        cacheReuse,
      });
      const res = await r.run(reqs);
      return { g, res };
    };
    const on = await run(true);
    const off = await run(false);
    same(t, on.res.episodes, off.res.episodes, name);
    t.ok(
      on.res.episodes.some((e) => e.turns > 1),
      `multi-turn episodes (turns ${on.res.episodes.map((e) => e.turns).join(', ')})`,
    );
    t.ok(on.res.stats.generateCalls > 1);
    t.ok(on.g.reused > 0 && on.res.stats.cacheReusedTokens === on.g.reused, `reuse on: ${on.g.reused} prompt tokens from the caches`);
    t.equal(off.g.keysSent, 0, 'reuse off: no cache keys sent');
    t.equal(off.res.stats.cacheReusedTokens, 0);
    const keys = on.g.released.flat();
    t.equal(new Set(keys).size, reqs.length, 'every episode key released once');
    t.equal(m.cacheStats().entries, 0, 'no cache left after the batch');
    t.ok(
      on.res.episodes.some((e) => e.finish === 'context') && new Set(on.res.episodes.map((e) => e.turns)).size > 1,
      'episodes end at different turns',
    );
    t.ok(
      on.g.released.length > 1 && on.g.released[0].length < reqs.length,
      `episodes are released as they end (${on.g.released.map((k) => k.length).join(' + ')} keys)`,
    );
  });
}

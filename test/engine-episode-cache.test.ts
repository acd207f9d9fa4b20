// Multi-turn KV-cache reuse (issue 19, item 2): a generate row with a cache key reuses the KV its
// previous call stored under the key for the longest prefix it shares with the new prompt, and
// prefills only the rest. Every result must equal re-prefilling the whole conversation (no keys):
// the same greedy and seeded tokens, log-probs within 1e-5, the same finish reasons; with rows of
// different past lengths in one batch, a row that dropped tokens of its cached output, a row without
// a key, a LoRA adapter on, weights changed between calls (the cache is dropped), a byte limit that
// evicts caches (those rows re-prefill, one log line), and released caches freed.
import t, { type Test } from 'tap';
import { native } from '../lib/engine/runtime.js';
import { Model } from '../lib/engine/model.js';
import type { GenerateRequest } from '../lib/engine/types.js';
import { configFromObject } from '../lib/config/load.js';
import { fixture } from './helpers/shared.js';

const dir = fixture('qwen3', 'tiny-qwen3-f32');
const SYS = [151, 33, 402, 87, 19, 260, 311, 45, 98, 7, 188, 230];
const I = (a: ArrayLike<number>) => Int32Array.from(a as number[]);
// Five episodes' first prompts, of different lengths (the first two share the system prompt).
const firsts = [
  [...SYS, 204, 125, 373],
  [...SYS, 457, 205, 161, 125, 489, 119, 182],
  [17, 300, 4, 9],
  [...SYS, 204, 125, 373],
  [88, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
];
// Tool output appended after each turn, of a different length per row.
const reply = (row: number, turn: number) =>
  Array.from({ length: 2 + ((row * 3 + turn) % 5) }, (_, i) => (row * 37 + turn * 11 + i * 5) % 500);

function maxDiff(a: Float32Array[], b: Float32Array[]): number {
  let d = 0;
  a.forEach((r, i) => r.forEach((x, j) => (d = Math.max(d, Math.abs(x - b[i][j])))));
  return d;
}

type Req = Omit<GenerateRequest, 'prompts' | 'cacheKeys'>;

/** One call with keys and the same call without (the whole conversation prefilled); checks they agree. */
async function both(t: Test, m: Model, prompts: Int32Array[], keys: Array<string | null>, req: Req, what: string) {
  const cached = await m.generate({ ...req, prompts, cacheKeys: keys });
  const fresh = await m.generate({ ...req, prompts, sharePrefix: false });
  t.same(
    cached.tokens.map((x) => Array.from(x)),
    fresh.tokens.map((x) => Array.from(x)),
    `${what}: the same tokens with and without the caches`,
  );
  t.same(cached.finishReasons, fresh.finishReasons, `${what}: the same finish reasons`);
  const d = maxDiff(cached.logprobs, fresh.logprobs);
  t.ok(d <= 1e-5, `${what}: log-probs within 1e-5 (${d.toExponential(2)})`);
  t.equal(cached.prefillTokensRequested, fresh.prefillTokensRequested);
  t.equal(fresh.cacheReusedTokens, 0, `${what}: no reuse without keys`);
  // Rows continuing from a cache compute the rest of their prompt; without any, the call takes the
  // shared-prefix path (repeated prompts and the common prefix computed once).
  if (cached.cacheHits > 0)
    t.equal(
      cached.prefillTokens + cached.cacheReusedTokens,
      cached.prefillTokensRequested,
      `${what}: computed + reused = requested (${cached.prefillTokens} + ${cached.cacheReusedTokens})`,
    );
  else
    t.ok(
      cached.cacheReusedTokens === 0 && cached.prefillTokens <= cached.prefillTokensRequested,
      `${what}: nothing reused, at most the prompts computed`,
    );
  return { cached, fresh };
}

/**
 * Three turns of five episodes: each turn's prompt is the last prompt + the output + a reply. Row 1
 * drops the last 3 tokens of its output (as the runner drops tokens after an action), row 4 has no
 * key. `expectReuse` checks the reused count: prompt + output - 1 tokens (the last sampled token was
 * never fed back) per keyed row, less what a row dropped.
 */
async function conversation(t: Test, m: Model, req: Req, tag: string, expectReuse = true, starts = firsts, unkeyed = 4) {
  const keys = starts.map((_, i) => (i === unkeyed ? null : `${tag}-${i}`));
  let prompts = starts.map(I);
  let prev: { prompts: Int32Array[]; tokens: Int32Array[] } | null = null;
  for (let turn = 1; turn <= 3; turn++) {
    const { cached }: { cached: Awaited<ReturnType<Model['generate']>> } = await both(t, m, prompts, keys, req, `${tag} turn ${turn}`);
    if (prev && expectReuse) {
      const p: { prompts: Int32Array[]; tokens: Int32Array[] } = prev;
      const want: number[] = keys.map((k, i): number => {
        if (k === null) return 0;
        const out = p.tokens[i];
        const kept = i === 1 ? Math.max(0, out.length - 3) : out.length;
        return Math.min(p.prompts[i].length + Math.min(kept, out.length - 1), prompts[i].length - 1);
      });
      t.equal(
        cached.cacheReusedTokens,
        want.reduce((a, b) => a + b, 0),
        `${tag} turn ${turn}: reused ${cached.cacheReusedTokens} tokens (the past of every keyed row)`,
      );
      t.equal(cached.cacheHits, want.filter((x) => x > 0).length, `${tag} turn ${turn}: every keyed row reused its cache`);
      t.ok(
        cached.prefillTokens < cached.prefillTokensRequested / 2,
        `${tag} turn ${turn}: computed ${cached.prefillTokens} of ${cached.prefillTokensRequested} prompt tokens`,
      );
    }
    prev = { prompts, tokens: cached.tokens };
    prompts = prompts.map((p, i) => {
      const out = Array.from(cached.tokens[i]);
      return I([...p, ...(i === 1 ? out.slice(0, Math.max(0, out.length - 3)) : out), ...reply(i, turn)]);
    });
  }
  m.releaseCaches(keys.filter((k): k is string => k !== null));
}

t.test('multi-turn: reusing the caches equals re-prefilling the conversation', async (t) => {
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  await conversation(t, m, { maxNewTokens: 9, greedy: true }, 'greedy');
  await conversation(t, m, { maxNewTokens: 9, temperature: [1, 0.8, 0, 1.2, 1], rowSeeds: [5, 6, 7, 8, 9] }, 'sampled');
  // Rows stopping early (a stop token), so that the rows' pasts end at different lengths.
  const free = await m.generate({ prompts: firsts.map(I), maxNewTokens: 9, greedy: true });
  await conversation(t, m, { maxNewTokens: 9, greedy: true, stopTokenIds: [free.tokens[0][3], free.tokens[2][1]] }, 'stop tokens');
  t.equal(m.cacheStats().entries, 0, 'released caches are gone');
});

t.test(
  'rows that all share the system prompt: one prefix in the cache, read by every row, in the first turn and (every row keyed) in the next',
  async (t) => {
    const m = await Model.load(dir);
    t.teardown(() => m.dispose());
    const sysFirsts = firsts.map((f) => (f[0] === SYS[0] ? f : [...SYS, ...f]));
    await conversation(t, m, { maxNewTokens: 9, greedy: true }, 'shared system prompt', true, sysFirsts);
    await conversation(t, m, { maxNewTokens: 9, greedy: true }, 'shared system prompt, every row keyed', true, sysFirsts, -1);
    await conversation(
      t,
      m,
      { maxNewTokens: 9, temperature: [1, 0.8, 0, 1.2, 1], rowSeeds: [5, 6, 7, 8, 9] },
      'shared system prompt, every row keyed, sampled',
      true,
      sysFirsts,
      -1,
    );
    const free = await m.generate({ prompts: sysFirsts.map(I), maxNewTokens: 9, greedy: true });
    await conversation(
      t,
      m,
      { maxNewTokens: 9, greedy: true, stopTokenIds: [free.tokens[0][3], free.tokens[2][1]] },
      'shared system prompt, every row keyed, stop tokens',
      true,
      sysFirsts,
      -1,
    );
    const a = native();
    a.setCpuKernels(false);
    t.teardown(() => a.setCpuKernels(true));
    await conversation(t, m, { maxNewTokens: 9, greedy: true }, 'shared system prompt, every row keyed, kernels off', true, sysFirsts, -1);
  },
);

t.test('a LoRA adapter on; weights changed between calls drop the caches', async (t) => {
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  m.attachLora(
    {
      r: 4,
      alpha: 8,
      dropout: 0,
      rslora: false,
      targets: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'],
    } as never,
    3,
  );
  const setB = (k: number) => {
    for (const [name, v] of Object.entries(m.trainable()))
      if (name.endsWith('lora_B.weight'))
        m.setTrainable(
          name,
          v.map((_, i) => Math.sin(i * k + name.length) * 0.2),
        );
  };
  setB(1);
  await conversation(t, m, { maxNewTokens: 8, greedy: true }, 'lora');

  const prompts = firsts.map(I);
  const keys = firsts.map((_, i) => `w-${i}`);
  const first = await m.generate({ prompts, maxNewTokens: 6, greedy: true, cacheKeys: keys });
  const next = prompts.map((p, i) => I([...p, ...first.tokens[i], ...reply(i, 1)]));
  // An in-place update of the adapter (as an optimizer step does) makes every cache stale.
  setB(2);
  const { cached } = await both(t, m, next, keys, { maxNewTokens: 6, greedy: true }, 'after setTrainable');
  t.equal(cached.cacheStale, keys.length, 'every cache was stale');
  t.equal(cached.cacheReusedTokens, 0, 'nothing reused across a weight change');
  t.equal(cached.prefillTokens, cached.prefillTokensRequested, 'the whole conversation prefilled');
  // The caches just stored are valid for these weights: the next call reuses them.
  const again = prompts.map((_p, i) => I([...next[i], ...cached.tokens[i], ...reply(i, 2)]));
  const r2 = await both(t, m, again, keys, { maxNewTokens: 6, greedy: true }, 'after the re-prefill');
  t.equal(r2.cached.cacheHits, keys.length, 'the re-stored caches are reused');
  // An optimizer step (trainStep) updates the adapter in place: stale again.
  const seq = Array.from(again[0]);
  await m.trainStep({ sequences: [seq], masks: [seq.map((_, i) => (i > 3 ? 1 : 0))] }, { loss: 'sft', lr: 1e-2 });
  const after = prompts.map((_p, i) => I([...again[i], ...r2.cached.tokens[i], ...reply(i, 3)]));
  const r5 = await both(t, m, after, keys, { maxNewTokens: 6, greedy: true }, 'after trainStep');
  t.equal(r5.cached.cacheStale, keys.length, 'trainStep: every cache stale');
  // A new adapter (attachLora) and no adapter (detachLora) also invalidate them.
  m.attachLora({ r: 4, alpha: 8, dropout: 0, rslora: false, targets: ['q_proj', 'v_proj'] } as never, 9);
  const r3 = await both(t, m, after, keys, { maxNewTokens: 6, greedy: true }, 'after attachLora');
  t.equal(r3.cached.cacheStale, keys.length, 'attachLora: every cache stale');
  m.detachLora();
  const r4 = await both(t, m, after, keys, { maxNewTokens: 6, greedy: true }, 'after detachLora');
  t.equal(r4.cached.cacheStale, keys.length, 'detachLora: every cache stale');
  t.equal(m.cacheStats().stale, 4 * keys.length);
});

t.test('a byte limit evicts the oldest caches: those rows re-prefill, one log line', async (t) => {
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  const prompts = firsts.map(I);
  const keys = firsts.map((_, i) => `cap-${i}`);
  const first = await m.generate({ prompts, maxNewTokens: 6, greedy: true, cacheKeys: keys });
  const s0 = m.cacheStats();
  t.equal(s0.entries, keys.length, 'one cache per keyed row');
  t.ok(
    s0.bytes > 0 && s0.tokens === prompts.reduce((a, p, i) => a + p.length + first.tokens[i].length - 1, 0),
    `tokens kept: prompt + output - 1 per row (${s0.tokens})`,
  );
  // A limit for about two of them: lowering it evicts the least recently used at once.
  const lines: string[] = [];
  const limit = Math.floor((s0.bytes / s0.entries) * 2.5);
  m.setCacheLimit(limit, { log: (l) => lines.push(l) });
  const s1 = m.cacheStats();
  t.ok(s1.entries < keys.length && s1.entries >= 1 && s1.bytes <= limit, `${s1.entries} caches left within ${limit} bytes`);
  let next = prompts.map((p, i) => I([...p, ...first.tokens[i], ...reply(i, 1)]));
  for (let turn = 2; turn <= 4; turn++) {
    const { cached } = await both(t, m, next, keys, { maxNewTokens: 6, greedy: true }, `capped turn ${turn}`);
    t.ok(cached.cacheHits < keys.length, `turn ${turn}: some rows re-prefilled (${cached.cacheHits} of ${keys.length} reused)`);
    t.ok(cached.cacheEvicted > 0, `turn ${turn}: ${cached.cacheEvicted} caches evicted by the limit`);
    t.ok(m.cacheStats().bytes <= limit, 'the store stays within its limit');
    next = next.map((p, i) => I([...p, ...cached.tokens[i], ...reply(i, turn)]));
  }
  t.equal(lines.length, 1, 'one log line, however many evictions');
  t.match(lines[0], /limit.*re-prefill/);
  // A limit of 0 keeps nothing: every row re-prefills, outputs unchanged.
  m.setCacheLimit(0);
  t.equal(m.cacheStats().entries, 0);
  const { cached } = await both(t, m, next, keys, { maxNewTokens: 4, greedy: true }, 'limit 0');
  t.equal(cached.cacheReusedTokens, 0);
  t.throws(() => m.setCacheLimit(-1), { code: 'ARGUMENT_INVALID' });
  t.throws(() => m.setCacheLimit(1.5), { code: 'ARGUMENT_INVALID' });
});

t.test('releaseCaches / clearCaches free the caches; bad keys are refused', async (t) => {
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  const prompts = firsts.map(I);
  const keys = firsts.map((_, i) => `rel-${i}`);
  const first = await m.generate({ prompts, maxNewTokens: 5, greedy: true, cacheKeys: keys });
  const s0 = m.cacheStats();
  m.releaseCaches([keys[0], keys[2], 'no-such-key']);
  const s1 = m.cacheStats();
  t.equal(s1.entries, keys.length - 2, 'two released');
  t.ok(s1.bytes < s0.bytes && s1.tokens < s0.tokens, `bytes ${s0.bytes} -> ${s1.bytes}`);
  const next = prompts.map((p, i) => I([...p, ...first.tokens[i], 7]));
  const r = await m.generate({ prompts: next, maxNewTokens: 3, greedy: true, cacheKeys: keys });
  t.equal(r.cacheHits, keys.length - 2, 'released keys re-prefill, the others reuse');
  m.clearCaches();
  t.same(
    { entries: m.cacheStats().entries, bytes: m.cacheStats().bytes, tokens: m.cacheStats().tokens },
    { entries: 0, bytes: 0, tokens: 0 },
    'clearCaches frees every cache',
  );
  // A prompt that shares nothing with its cache (another first token) reuses nothing.
  await m.generate({ prompts: [I([5, 6, 7])], maxNewTokens: 3, greedy: true, cacheKeys: ['x'] });
  const d = await m.generate({ prompts: [I([6, 6, 7, 8])], maxNewTokens: 3, greedy: true, cacheKeys: ['x'] });
  t.equal(d.cacheReusedTokens, 0, 'no common prefix: nothing reused');
  await t.rejects(
    m.generate({ prompts: [I([1, 2]), I([3, 4])], maxNewTokens: 2, greedy: true, cacheKeys: ['a', 'a'] }),
    { code: 'ARGUMENT_INVALID' },
    'repeated key',
  );
  await t.rejects(
    m.generate({ prompts: [I([1, 2]), I([3, 4])], maxNewTokens: 2, greedy: true, cacheKeys: ['a'] }),
    { code: 'ARGUMENT_INVALID' },
    'one key for two rows',
  );
  await t.rejects(
    m.generate({ prompts: [I([1, 2])], maxNewTokens: 2, greedy: true, cacheKeys: [''] }),
    { code: 'ARGUMENT_INVALID' },
    'empty key',
  );
  t.throws(() => m.releaseCaches([3 as never]), { code: 'ARGUMENT_INVALID' });
});

t.test('config: rollout.kv_cache_reuse / kv_cache_mb default on / 2048 MiB; bad values are CONFIG_INVALID', async (t) => {
  const base = { stage: 'grpo', model: { path: 'm' }, data: { questions: 'q.jsonl', corpus: 'c.jsonl' } };
  const c = configFromObject(base);
  t.equal(c.rollout.kv_cache_reuse, true);
  t.equal(c.rollout.kv_cache_mb, 2048);
  t.equal(configFromObject({ ...base, rollout: { kv_cache_reuse: false, kv_cache_mb: 0 } }).rollout.kv_cache_mb, 0);
  for (const bad of [
    { kv_cache_mb: -1 },
    { kv_cache_mb: 2 ** 40 },
    { kv_cache_mb: 1.5 },
    { kv_cache_mb: 'lots' },
    { kv_cache_reuse: 'yes' },
  ]) {
    const e = (() => {
      try {
        configFromObject({ ...base, rollout: bad });
      } catch (err) {
        return err as { code?: string; message: string };
      }
      return null;
    })();
    t.equal(e?.code, 'CONFIG_INVALID', `${JSON.stringify(bad)}: CONFIG_INVALID`);
    t.match(e?.message ?? '', /rollout\.kv_cache_(mb|reuse)/, 'the message names the key');
  }
});

t.test('the streaming path keeps and reuses caches too, a cancelled row included', async (t) => {
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  const prompts = firsts.map(I);
  const keys = firsts.map((_, i) => `s-${i}`);
  const ac = new AbortController();
  const seen: number[] = [];
  // Room for 256 tokens: the abort is seen on the JavaScript thread while the native loop goes on, so
  // the row must still be running when it lands (with 8 tokens a fast decode finished first).
  const a = await m.generateStream({
    prompts,
    maxNewTokens: 256,
    greedy: true,
    cacheKeys: keys,
    signals: prompts.map((_, i) => (i === 2 ? ac.signal : undefined)),
    onToken: (e) => {
      if (e.row !== 2) return;
      seen.push(e.token);
      if (seen.length === 3) ac.abort();
    },
  });
  t.equal(a.finishReasons[2], 'cancelled');
  const next = prompts.map((p, i) => I([...p, ...a.tokens[i], ...reply(i, 1)]));
  const s = await m.generateStream({ prompts: next, maxNewTokens: 8, greedy: true, cacheKeys: keys });
  const f = await m.generate({ prompts: next, maxNewTokens: 8, greedy: true, sharePrefix: false });
  t.same(
    s.tokens.map((x) => Array.from(x)),
    f.tokens.map((x) => Array.from(x)),
    'streamed with caches = generate without',
  );
  t.ok(maxDiff(s.logprobs, f.logprobs) <= 1e-5, 'log-probs within 1e-5');
  // Every generated token of the cancelled row was fed back before it stopped: all of them are kept;
  // the other rows keep all but their last token.
  const want = prompts.reduce((sum, p, i) => sum + p.length + a.tokens[i].length - (i === 2 ? 0 : 1), 0);
  t.equal(s.cacheReusedTokens, want, `reused ${s.cacheReusedTokens} tokens`);
  t.equal(s.prefillTokens + s.cacheReusedTokens, s.prefillTokensRequested);
});

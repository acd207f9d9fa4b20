// Every key the config schema accepts is read by the code: a key that validates, is documented and
// then changes nothing (optim.betas, optim.eps, retrieval.k and algorithm.entropy_coef in GRPO once
// were) is a lie to the user. Static: each schema path must be read somewhere in lib/ outside the
// files that declare it (the schema and the TypeScript shape), as `<section>.<key>` (cfg.optim.lr),
// through a variable bound to the section (const a = cfg.algorithm; a.clip_low), or by destructuring
// it (const { lr, eps } = cfg.optim).
import t from 'tap';
import { readFileSync, readdirSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { CONFIG_SCHEMA } from '../lib/config/schema.js';
import { repoRoot } from './helpers/shared.js';

type Schema = { properties?: Record<string, Schema>; type?: unknown };

/** Every leaf path of the schema: 'optim.lr', 'algorithm.fallbacks.center', ... */
function leafPaths(s: Schema, prefix: string[] = []): string[][] {
  const props = s.properties;
  if (!props || s.type !== 'object' || (prefix.length > 0 && prefix.join('.') === 'reward.judge')) return prefix.length ? [prefix] : [];
  return Object.entries(props).flatMap(([k, v]) => (v.properties && v.type === 'object' ? leafPaths(v, [...prefix, k]) : [[...prefix, k]]));
}

function sources(dir: string, skip: Set<string>): string {
  let out = '';
  for (const f of readdirSync(dir)) {
    const p = join(dir, f);
    if (statSync(p).isDirectory()) out += sources(p, skip);
    else if (f.endsWith('.ts') && !skip.has(relative(repoRoot, p))) out += readFileSync(p, 'utf8') + '\n';
  }
  return out;
}

const esc = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** Whether `path` is read in `src` (see the file comment). */
export function isRead(path: string[], src: string): boolean {
  const key = path[path.length - 1];
  const parent = path[path.length - 2];
  if (!parent) return new RegExp(`\\.${esc(key)}\\b`).test(src);
  if (new RegExp(`\\b${esc(parent)}\\??\\.${esc(key)}\\b`).test(src)) return true;
  // A parameter named after the section (distributedConfig: DistributedConfig): distributedConfig.key
  if (
    new RegExp(
      `\\b[a-z]\\w*${esc(parent.charAt(0).toUpperCase() + parent.slice(1))}\\??\\.${esc(key)}\\b|\\b${esc(parent)}[A-Z]\\w*\\??\\.${esc(key)}\\b`,
    ).test(src)
  )
    return true;
  // A variable bound to the parent section: const a = cfg.algorithm; ... a.key
  for (const m of src.matchAll(new RegExp(`(?:const|let)\\s+(\\w+)\\s*=\\s*[\\w.]*\\.${esc(parent)}\\s*[;,\\n]`, 'g')))
    if (new RegExp(`\\b${esc(m[1])}\\??\\.${esc(key)}\\b`).test(src)) return true;
  // Destructured from it: const { lr, key } = cfg.optim
  for (const m of src.matchAll(new RegExp(`\\{([^{}]*)\\}\\s*=\\s*[\\w.]*\\.${esc(parent)}\\b`, 'g')))
    if (new RegExp(`(^|[\\s,])${esc(key)}\\s*(,|:|$)`).test(m[1].trim())) return true;
  return false;
}

t.test('every key the schema accepts is read somewhere in lib/', async (t) => {
  const src = sources(join(repoRoot, 'lib'), new Set(['lib/config/schema.ts', 'lib/config/types.ts']));
  const paths = leafPaths(CONFIG_SCHEMA as Schema);
  t.ok(paths.length > 100, `${paths.length} schema paths`);
  const unread = paths.filter((p) => !isRead(p, src)).map((p) => p.join('.'));
  t.same(unread, [], 'schema keys that nothing reads (remove them, or make the code use them)');
});

t.test('the check itself: a key nothing reads is found', async (t) => {
  const src = 'const a = cfg.algorithm;\nx(a.clip_low);\nconst { lr, eps } = cfg.optim;\nf(cfg.protocol.max_turns, c.rollout.openai.urls);';
  t.ok(isRead(['protocol', 'max_turns'], src));
  t.ok(isRead(['algorithm', 'clip_low'], src), 'through a variable');
  t.ok(isRead(['optim', 'eps'], src), 'destructured');
  t.ok(isRead(['rollout', 'openai', 'urls'], src), 'nested');
  t.notOk(isRead(['optim', 'betas'], src), 'not read');
  t.notOk(isRead(['algorithm', 'kl_coef'], src), 'a sibling of a read key is not read');
  t.notOk(isRead(['rollout', 'openai', 'model'], src));
  const param = 'function launch(distributedConfig: DistributedConfig) {\n  use(distributedConfig.master_addr, other.master_port);\n}';
  t.ok(isRead(['distributed', 'master_addr'], param), 'through a parameter named after the section');
  t.notOk(isRead(['distributed', 'master_port'], param), 'not through another name');
});

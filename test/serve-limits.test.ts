// `slm-train serve` against hostile requests (issue 33): parameter names that Object.prototype
// also has are unknown parameters like any other (a 400, not a 500). The model is a stand-in: every
// request here is refused before anything is generated, so no native engine is needed.
import { join } from 'node:path';
import t, { type Test } from 'tap';
import type { Model } from '../lib/engine/model.js';
import { ChatFormatter } from '../lib/model/chat.js';
import { initModel } from '../lib/model/init.js';
import { loadTokenizer } from '../lib/model/tokenizer.js';
import { OpenAIServer, type ServeOptions } from '../lib/serve/server.js';

const dir = join(t.testdir(), 'model');
initModel({ preset: 'tiny', out: dir, seed: 6 });
const tokenizer = loadTokenizer(dir);
const formatter = ChatFormatter.forModel(dir);
/** The little of a Model that request checks read; generating would fail, and no test here does. */
const model = { vocabSize: tokenizer.vocabSize, config: { num_hidden_layers: 2 } } as unknown as Model;

async function start(t: Test, extra: Partial<ServeOptions> = {}): Promise<string> {
  const server = new OpenAIServer({ model, tokenizer, formatter, name: 'tiny', port: 0, ...extra });
  const port = await server.listen();
  t.teardown(() => server.close());
  return `http://127.0.0.1:${port}/v1`;
}

t.test('parameters named like Object.prototype members are unknown parameters (400)', async (t) => {
  const base = await start(t);
  for (const chat of [true, false]) {
    const head = chat ? '"messages":[{"role":"user","content":"hi"}]' : '"prompt":"hi"';
    // Raw JSON: a `__proto__` key in an object literal would set the prototype instead.
    for (const name of ['toString', 'constructor', '__proto__', 'hasOwnProperty', 'valueOf']) {
      const r = await fetch(`${base}${chat ? '/chat/completions' : '/completions'}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: `{${head},"${name}":1}` });
      const body = (await r.json()) as { error: { message: string; param: string } };
      t.equal(r.status, 400, `${chat ? 'chat' : 'completions'}: ${name} is a 400`);
      t.match(body.error, { param: name, message: new RegExp(`^Unrecognized request argument supplied: ${name}\\.`) });
    }
  }
});

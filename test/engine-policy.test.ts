// loadPolicy, the one bootstrap of a model with its adapter, tokenizer and chat template (training,
// evaluation, the native judge, serve, generate, logits and the rollout benchmark): what each
// option loads, and the coded errors of a bad folder, adapter or thread count.
import { resolve } from 'node:path';
import t from 'tap';
import { loadPolicy } from '../lib/engine/policy.js';
import { fixture } from './helpers/shared.js';

const tiny = fixture('qwen3', 'tiny-qwen3-f32');

t.test('by default: the model, its tokenizer and its chat template', async (t) => {
  const p = await loadPolicy(tiny);
  t.teardown(() => p.model.dispose());
  t.equal(p.dir, resolve(tiny), 'the local folder');
  t.equal(p.adapter, undefined, 'no adapter');
  t.equal(p.model.lora, undefined, 'the bare base model');
  t.ok(p.tokenizer.encode('hello').length > 0, 'a tokenizer (the packaged Qwen3 one for a folder without its own)');
  t.match(p.formatter.prompt([{ role: 'user', content: 'hi' }]), /hi/, 'a chat template');
});

t.test('tokenizer: false loads the model alone; chat: false leaves out the template', async (t) => {
  const bare = await loadPolicy(tiny, { tokenizer: false });
  t.teardown(() => bare.model.dispose());
  t.equal(bare.tokenizer, undefined);
  t.equal(bare.formatter, undefined, 'no template without a tokenizer unless asked');
  const noChat = await loadPolicy(tiny, { chat: false });
  t.teardown(() => noChat.model.dispose());
  t.ok(noChat.tokenizer);
  t.equal(noChat.formatter, undefined);
});

t.test('bad input keeps its codes', async (t) => {
  await t.rejects(loadPolicy('/nonexistent/model'), { code: 'MODEL_NOT_FOUND' });
  await t.rejects(loadPolicy(tiny, { adapter: '/nonexistent/adapter' }), { code: 'ADAPTER_NOT_FOUND' });
  await t.rejects(loadPolicy(tiny, { threads: 0 }), { code: 'ARGUMENT_INVALID' }, 'threads are checked before anything loads');
  await t.rejects(loadPolicy(tiny, { dtype: 'float64' as never }), { code: 'ARGUMENT_INVALID' });
});

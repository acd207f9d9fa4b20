// Every async native call runs on the addon's one engine thread (native/addon/workers.h): libgomp
// gives each thread that opens parallel regions its own team and, with more team threads than cores,
// stops spinning between regions. Concurrent calls, which libuv would spread over its pool threads,
// must all report the same native thread, and engine work must still overlap JS (the main thread is
// not that thread).
import t from 'tap';
import { native } from '../lib/engine/runtime.js';
import { Model } from '../lib/engine/model.js';
import { fixture } from './helpers/shared.js';

const a = native();

t.test('concurrent async calls all run on one native thread', async (t) => {
  // 8 calls of 30 ms each: libuv's pool (4 threads) would run four at a time on four threads.
  const ids = await Promise.all(Array.from({ length: 8 }, () => a.engineThread(30)));
  t.equal(new Set(ids).size, 1, `one thread for all: ${[...new Set(ids)].join(', ')}`);
  // And engine calls in between (a generate, a measurement) do not move it.
  const m = await Model.load(fixture('qwen3', 'tiny-qwen3-f32'));
  t.teardown(() => m.dispose());
  const [before, , , after] = await Promise.all([
    a.engineThread(5),
    m.generate({ prompts: [Int32Array.from([1, 2, 3])], maxNewTokens: 4, greedy: true }),
    a.measure({ kind: 'copy', n: 1 << 20, seconds: 0.05 }),
    a.engineThread(5),
  ]);
  t.equal(before, ids[0]);
  t.equal(after, ids[0], 'the same thread after a generate and a measurement');
});

t.test('the main thread keeps running JS while the engine thread works', async (t) => {
  let ticks = 0;
  const timer = setInterval(() => ticks++, 5);
  await a.engineThread(200);
  clearInterval(timer);
  t.ok(ticks >= 5, `timers fired ${ticks} times during a 200 ms engine call`);
});

// `slm-train serve` for agents (issue 36, item 5): OpenAI tools / tool_choice in Qwen's Hermes format,
// response_format, /metrics, and max_tokens' default and limit.
// - The <tool_call> parser as a unit: content and calls, text split anywhere (as a stream) gives the
//   same result as the whole text, malformed and unclosed blocks, parallel_tool_calls: false.
// - Through the official `openai` client against a server over a scripted model (a stand-in whose
//   decode session emits the tokens of a given text, and records the prompts it was given): a random
//   tiny model never writes a <tool_call> block, so the replies are scripted, and the prompts the
//   model received are checked (tools rendered by the template, or not for tool_choice 'none';
//   earlier tool calls and tool results rendered). Non-streaming replies carry message.tool_calls
//   and finish_reason 'tool_calls'; the stream carries delta.tool_calls that the client's own
//   stream helper (chat.completions.stream) accumulates into the same calls.
// - Hostile tools and unsupported choices are coded 400s, and the server answers afterwards; a chat
//   template that fails on the messages (a raise, a stack overflow) is a 400 chat_template_error.
// - /metrics is scraped and parsed; its counters equal the requests' usage.
// - The CLI's --max-tokens-default / --max-tokens-limit reach the server (real engine, tiny preset).
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import OpenAI from 'openai';
import t, { type Test } from 'tap';
import type { Model } from '../lib/engine/model.js';
import type { RowFinish, SessionOptions, SessionRow } from '../lib/engine/session.js';
import { ChatFormatter } from '../lib/model/chat.js';
import { initModel } from '../lib/model/init.js';
import { loadTokenizer } from '../lib/model/tokenizer.js';
import { OpenAIServer, type ServeOptions } from '../lib/serve/server.js';
import { ToolCallParser, parseTools } from '../lib/serve/tools.js';
import { runCli } from './helpers/cli.js';
import { repoRoot } from './helpers/shared.js';
import { failure } from './helpers/failure.js';

const dir = join(t.testdir(), 'model');
initModel({ preset: 'tiny', out: dir, seed: 6 });
const tokenizer = loadTokenizer(dir);
const formatter = ChatFormatter.forModel(dir);
const IM_END = tokenizer.tokenId('<|im_end|>')!;

const weather = {
  type: 'function' as const,
  function: {
    name: 'get_weather',
    description: 'The weather in a city now.',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};
const clock = {
  type: 'function' as const,
  function: {
    name: 'get_time',
    description: 'The time in a time zone.',
    parameters: { type: 'object', properties: { tz: { type: 'string' } } },
  },
};
/** An object nested `n` levels deep: {"a": {"a": ... 1}}. */
const deep = (n: number): unknown => JSON.parse(`${'{"a":'.repeat(n)}1${'}'.repeat(n)}`);
const CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';
const CALL2 = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>';

t.test('the <tool_call> parser', async (t) => {
  const run = (text: string, pieces: number[] = [], parallel = true) => {
    const p = new ToolCallParser(parallel);
    let content = '';
    const calls: Array<{ name: string; args: unknown }> = [];
    let at = 0;
    for (const n of [...pieces, text.length]) {
      const d = p.push(text.slice(at, at + n));
      at += n;
      content += d.content;
      calls.push(...d.calls.map((c) => ({ name: c.function.name, args: JSON.parse(c.function.arguments) })));
    }
    const e = p.end();
    content += e.content;
    calls.push(...e.calls.map((c) => ({ name: c.function.name, args: JSON.parse(c.function.arguments) })));
    t.equal(content, p.content ?? '', 'the content handed out = parser.content');
    t.equal(calls.length, p.calls.length);
    return { content: p.content, calls, ids: p.calls.map((c) => c.id) };
  };
  t.same(run('plain text, no call'), { content: 'plain text, no call', calls: [], ids: [] });
  const one = run(`Let me check.\n${CALL}`);
  t.same(one.content, 'Let me check.\n');
  t.same(one.calls, [{ name: 'get_weather', args: { city: 'Paris' } }]);
  t.match(one.ids[0], /^chatcmpl-tool-[0-9a-f]{32}$/);
  t.same(run(CALL).content, null, 'only a call: content null');
  const two = run(`${CALL}\n${CALL2}\n`);
  t.same(
    two.calls.map((c) => c.name),
    ['get_weather', 'get_time'],
    'two calls, the whitespace between and after them dropped',
  );
  t.equal(two.content, null);
  t.not(two.ids[0], two.ids[1], 'each call its own id');
  t.same(
    run(`${CALL}\n${CALL2}`, [], false).calls.map((c) => c.name),
    ['get_weather'],
    'parallel_tool_calls false: the first call only',
  );
  const open = run('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}');
  t.same(
    [open.content, open.calls],
    [null, [{ name: 'get_weather', args: { city: 'Oslo' } }]],
    'an unclosed block at the end is a call when its JSON parses',
  );
  t.same(
    run('<tool_call>\n{"name": "get_wea').content,
    '<tool_call>\n{"name": "get_wea',
    'an unclosed block that does not parse (a reply cut by max_tokens) stays content',
  );
  const bad = run('a <tool_call>{not json}</tool_call> b');
  t.same(
    bad,
    { content: 'a <tool_call>{not json}</tool_call> b', calls: [], ids: [] },
    'a block that is no call stays content, as written',
  );
  t.same(run('<tool_call>{"arguments": {}}</tool_call>').calls, [], 'a block without a name is no call');
  t.same(run('a < b <tool_ not a tag').content, 'a < b <tool_ not a tag', 'text that only starts like the tag is content');
  // Split anywhere (as stream pieces arrive): the same content and calls.
  const text = `Checking both.\n${CALL}\n${CALL2}\nDone <tool_call>{oops</tool_call>`;
  const whole = run(text);
  for (const size of [1, 2, 3, 5, 7, 11]) {
    const pieces = Array.from({ length: Math.ceil(text.length / size) }, () => size);
    const split = run(text, pieces);
    t.same({ content: split.content, calls: split.calls }, { content: whole.content, calls: whole.calls }, `pieces of ${size} characters`);
  }
  t.equal(
    whole.content,
    'Checking both.\n\nDone <tool_call>{oops</tool_call>',
    'text after the calls is content (with the whitespace before it)',
  );
  // Held back while it may be the tag: nothing of "<tool_c" goes out until the text shows it is not.
  const p = new ToolCallParser();
  t.same(p.push('Hi <tool_c').content, 'Hi ');
  t.same(p.push('all>{"name": "f", "arguments": {"a": 1}}').content, '', 'inside a call nothing is content');
  const d = p.push('</tool_call>');
  t.same(
    d.calls.map((c) => [c.function.name, c.function.arguments]),
    [['f', '{"a":1}']],
    'the call is handed out when its block closes; arguments as a JSON string',
  );
});

t.test('parseTools refuses malformed tools and unsupported choices with coded 400s', async (t) => {
  const cases: Array<[Record<string, unknown>, string, string, RegExp]> = [
    [{ tools: { type: 'function' } }, 'tools', 'invalid_tools', /tools must be a list/],
    [{ tools: ['get_weather'] }, 'tools', 'invalid_tools', /tools\[0\] must be \{type: 'function'/],
    [
      { tools: [{ type: 'function', function: { description: 'x' } }] },
      'tools',
      'invalid_tools',
      /tools\[0\]\.function\.name must be 1 to 64 letters/,
    ],
    [{ tools: [{ type: 'function', function: { name: 'a b' } }] }, 'tools', 'invalid_tools', /function\.name/],
    [
      { tools: [{ type: 'function', function: { name: 'f', parameters: 'x' } }] },
      'tools',
      'invalid_tools',
      /parameters must be a JSON-schema object/,
    ],
    [{ tools: [weather, weather] }, 'tools', 'invalid_tools', /'get_weather' is defined twice/],
    [
      { tools: Array.from({ length: 129 }, (_, i) => ({ type: 'function', function: { name: `f${i}` } })) },
      'tools',
      'invalid_tools',
      /at most 128/,
    ],
    [
      { tools: [{ type: 'function', function: { name: 'f', description: 'x'.repeat(300_000) } }] },
      'tools',
      'invalid_tools',
      /at most 262144/,
    ],
    [
      { tools: [{ type: 'function', function: { name: 'f', parameters: deep(64) } }] },
      'tools',
      'invalid_tools',
      /tools nests objects and lists more than 64 levels deep/,
    ],
    [{ tools: [weather], tool_choice: 'required' }, 'tool_choice', 'unsupported_tool_choice', /tool_choice "required" is not supported/],
    [
      { tools: [weather], tool_choice: { type: 'function', function: { name: 'get_weather' } } },
      'tool_choice',
      'unsupported_tool_choice',
      /"name":"get_weather".*is not supported/,
    ],
    [{ tools: [weather], tool_choice: 'sometimes' }, 'tool_choice', 'unsupported_tool_choice', /must be 'auto' or 'none'/],
    [{ tool_choice: 'auto' }, 'tool_choice', 'invalid_tools', /needs tools/],
    [{ tools: [weather], parallel_tool_calls: 'yes' }, 'parallel_tool_calls', 'invalid_tools', /true or false/],
    [
      { tools: [{ ...weather, function: { ...weather.function, strict: true } }] },
      'tools',
      'unsupported_tool_choice',
      /strict: true is not supported/,
    ],
  ];
  for (const [body, param, code, re] of cases) {
    const e = (() => {
      try {
        parseTools(body);
      } catch (e) {
        return e as any;
      }
      return null;
    })();
    t.ok(e, `${JSON.stringify(body).slice(0, 60)}: refused`);
    t.match(e, { status: 400, param, code, message: re });
  }
  t.same(
    parseTools({ tools: [weather], tool_choice: 'none' }),
    { tools: [weather], active: false, parallel: true },
    "'none': kept, inactive",
  );
  t.same(parseTools({}), { tools: [], active: false, parallel: true });
  t.same(parseTools({ tools: [], tool_choice: 'none' }).active, false);
  t.equal(
    parseTools({ tools: [{ type: 'function', function: { name: 'f', parameters: deep(61) } }] }).tools.length,
    1,
    'a schema nested 61 levels (64 with the tool list) is accepted',
  );
});

/** A scripted stand-in for the engine: each row emits the tokens of the next scripted text, then <|im_end|>. */
function scriptedModel() {
  const script: string[] = [];
  /** Each request as it reached the engine (its rows submitted together): the prompt and its token limit. */
  const requests: Array<{ prompts: Int32Array[]; rowMaxNewTokens: number[] }> = [];
  let gate: Promise<void> | null = null;
  const model = {
    vocabSize: tokenizer.vocabSize,
    config: { num_hidden_layers: 2, max_position_embeddings: 40960 },
    decodeSession(_opts: SessionOptions) {
      let open = 0;
      let ended = false;
      let next = 0;
      let resolve!: (v: unknown) => void;
      const done = new Promise((r) => (resolve = r));
      return {
        done,
        submitAll(rows: SessionRow[]): number[] {
          if (ended) return [];
          // A request's rows come in one call (the batcher submits them together).
          requests.push({ prompts: rows.map((r) => r.prompt), rowMaxNewTokens: rows.map((r) => r.maxNewTokens) });
          return rows.map((row) => {
            open++;
            const id = next++;
            void (async () => {
              await Promise.resolve();
              if (gate) await gate;
              const text = script.shift() ?? 'no script left';
              const all = [...tokenizer.encode(text), IM_END];
              const ids = all.slice(0, row.maxNewTokens);
              const finish = ids.length === all.length ? 'stop_token' : 'length';
              let end: [RowFinish, unknown?] = [finish];
              for (let i = 0; i < ids.length; i++) {
                try {
                  row.onToken?.({ row: id, token: ids[i], logprob: -0.5, ...(i === ids.length - 1 ? { finish } : {}) });
                } catch (e) {
                  end = ['cancelled', e];
                  break;
                }
              }
              row.onEnd?.(...end);
              if (--open === 0) {
                ended = true;
                resolve({
                  steps: 0,
                  rows: next,
                  joined: 0,
                  maxBatch: next,
                  prefillTokens: 0,
                  rebuilds: 0,
                  prefillSeconds: 0,
                  decodeSeconds: 0,
                });
              }
            })();
            return id;
          });
        },
      };
    },
  };
  return {
    model: model as unknown as Model,
    script,
    requests,
    /** The prompt text of the last call's first row. */
    lastPrompt: () => tokenizer.decode(Array.from(requests[requests.length - 1].prompts[0]), { skipSpecialTokens: false }),
    hold(): () => void {
      let release!: () => void;
      gate = new Promise((r) => (release = r));
      return () => {
        gate = null;
        release();
      };
    },
  };
}

async function start(t: Test, extra: Partial<ServeOptions> = {}) {
  const s = scriptedModel();
  const server = new OpenAIServer({ model: s.model, tokenizer, formatter, name: 'tiny', port: 0, ...extra });
  const port = await server.listen();
  t.teardown(() => server.close());
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
  return { ...s, server, client, base: `http://127.0.0.1:${port}` };
}

const ask = (content: string) => [{ role: 'user' as const, content }];

t.test('tools through the openai client: rendered into the prompt, calls parsed, streamed', async (t) => {
  const { client, script, lastPrompt, requests } = await start(t);

  await t.test('tools reach the prompt; tool_choice none renders none and parses nothing', async (t) => {
    script.push('Sure.');
    const plain = await client.chat.completions.create({ model: 'tiny', messages: ask('Weather in Paris?'), max_tokens: 50 });
    const noTools = lastPrompt();
    t.notMatch(noTools, /<tools>/);
    script.push(CALL);
    const r = await client.chat.completions.create({
      model: 'tiny',
      messages: ask('Weather in Paris?'),
      tools: [weather, clock],
      max_tokens: 50,
    });
    const withTools = lastPrompt();
    t.match(
      withTools,
      /^<\|im_start\|>system\n# Tools\n[\s\S]*<tools>\n\{"type": "function", "function": \{"name": "get_weather", "description": "The weather in a city now\.", "parameters": \{"type": "object", "properties": \{"city": \{"type": "string"\}\}, "required": \["city"\]\}\}\}\n\{"type": "function", "function": \{"name": "get_time"/,
      "the template's <tools> block lists each tool's schema",
    );
    t.equal(
      withTools,
      formatter.prompt(ask('Weather in Paris?'), { tools: [weather, clock] }),
      'the prompt is the template rendered with tools',
    );
    t.ok(
      r.usage!.prompt_tokens > plain.usage!.prompt_tokens + 50,
      `prompt tokens ${plain.usage!.prompt_tokens} -> ${r.usage!.prompt_tokens} with tools`,
    );
    script.push(CALL);
    const none = await client.chat.completions.create({
      model: 'tiny',
      messages: ask('Weather in Paris?'),
      tools: [weather],
      tool_choice: 'none',
      max_tokens: 50,
    });
    t.equal(lastPrompt(), noTools, "tool_choice 'none': the prompt has no tools");
    t.equal(none.choices[0].message.content, CALL, "and the reply's <tool_call> text is content, not parsed");
    t.notOk(none.choices[0].message.tool_calls);
    t.equal(none.choices[0].finish_reason, 'stop');
    t.equal(requests.length, 3);
  });

  await t.test('non-streaming: message.tool_calls and finish_reason tool_calls', async (t) => {
    script.push(`I will look it up.\n${CALL}\n${CALL2}`);
    const r = await client.chat.completions.create({
      model: 'tiny',
      messages: ask('Weather and time in Paris?'),
      tools: [weather, clock],
      max_tokens: 100,
    });
    const c = r.choices[0];
    t.equal(c.finish_reason, 'tool_calls');
    t.equal(c.message.content, 'I will look it up.\n', 'the text before the calls is the content');
    const calls = c.message.tool_calls!;
    t.equal(calls.length, 2);
    t.match(calls[0], { type: 'function', id: /^chatcmpl-tool-/, function: { name: 'get_weather' } });
    t.ok(calls[0].type === 'function' && typeof calls[0].function.arguments === 'string', 'arguments as a JSON string');
    const fns = calls.map((x) => (x.type === 'function' ? [x.function.name, JSON.parse(x.function.arguments)] : null));
    t.same(fns, [
      ['get_weather', { city: 'Paris' }],
      ['get_time', { tz: 'Europe/Paris' }],
    ]);

    script.push(`${CALL}\n${CALL2}`);
    const one = await client.chat.completions.create({
      model: 'tiny',
      messages: ask('Weather and time?'),
      tools: [weather, clock],
      parallel_tool_calls: false,
      max_tokens: 100,
    });
    t.same(
      one.choices[0].message.tool_calls!.map((x) => (x.type === 'function' ? x.function.name : '')),
      ['get_weather'],
      'parallel_tool_calls false: one call',
    );
    t.equal(one.choices[0].message.content, null);

    script.push('No tool needed: it is sunny.');
    const text = await client.chat.completions.create({ model: 'tiny', messages: ask('Weather?'), tools: [weather], max_tokens: 100 });
    t.equal(text.choices[0].message.content, 'No tool needed: it is sunny.');
    t.notOk(text.choices[0].message.tool_calls, 'a reply without a block has no tool_calls');
    t.equal(text.choices[0].finish_reason, 'stop');
  });

  await t.test('streaming: delta.tool_calls, accumulated by the client into the same calls', async (t) => {
    const reply = `I will look it up.\n${CALL}\n${CALL2}`;
    script.push(reply);
    const chunks = [];
    for await (const c of await client.chat.completions.create({
      model: 'tiny',
      messages: ask('Weather and time in Paris?'),
      tools: [weather, clock],
      max_tokens: 100,
      stream: true,
    }))
      chunks.push(c);
    const content = chunks.map((c) => c.choices[0]?.delta.content ?? '').join('');
    t.equal(content, 'I will look it up.\n', 'the content deltas add up to the text before the calls');
    t.notMatch(content, /tool_call/, 'no part of a block reached the content');
    const deltas = chunks.flatMap((c) => c.choices[0]?.delta.tool_calls ?? []);
    t.ok(deltas.length >= 2, `${deltas.length} tool-call deltas`);
    const acc: Array<{ id: string; name: string; args: string }> = [];
    for (const d of deltas) {
      if (d.id) acc[d.index] = { id: d.id, name: d.function?.name ?? '', args: '' };
      acc[d.index].args += d.function?.arguments ?? '';
    }
    t.same(
      acc.map((a) => [a.name, JSON.parse(a.args)]),
      [
        ['get_weather', { city: 'Paris' }],
        ['get_time', { tz: 'Europe/Paris' }],
      ],
    );
    t.match(acc[0].id, /^chatcmpl-tool-/);
    t.same(
      chunks.flatMap((c) => c.choices.filter((x) => x.finish_reason).map((x) => x.finish_reason)),
      ['tool_calls'],
      'one finish_reason: tool_calls',
    );

    // The client's own stream helper accumulates the deltas into a chat completion.
    script.push(reply);
    const stream = client.chat.completions.stream({
      model: 'tiny',
      messages: ask('Weather and time in Paris?'),
      tools: [weather, clock],
      max_tokens: 100,
    });
    const final = await stream.finalChatCompletion();
    const m = final.choices[0].message;
    t.equal(final.choices[0].finish_reason, 'tool_calls');
    t.equal(m.content, 'I will look it up.\n');
    t.same(
      m.tool_calls!.map((x) => (x.type === 'function' ? [x.function.name, JSON.parse(x.function.arguments)] : null)),
      [
        ['get_weather', { city: 'Paris' }],
        ['get_time', { tz: 'Europe/Paris' }],
      ],
      'chat.completions.stream: the same calls',
    );
  });

  await t.test('earlier tool calls and tool results render through the template', async (t) => {
    script.push('It is sunny in Paris.');
    const r = await client.chat.completions.create({
      model: 'tiny',
      tools: [weather],
      max_tokens: 50,
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        {
          role: 'assistant',
          content: null,
          tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }],
        },
        { role: 'tool', tool_call_id: 'call_1', content: '{"sky": "sunny"}' },
      ],
    });
    t.equal(r.choices[0].message.content, 'It is sunny in Paris.');
    t.match(
      lastPrompt(),
      /<\|im_start\|>assistant\n<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "Paris"\}\}\n<\/tool_call><\|im_end\|>\n<\|im_start\|>user\n<tool_response>\n\{"sky": "sunny"\}\n<\/tool_response><\|im_end\|>\n<\|im_start\|>assistant\n$/,
      "the call (arguments as an object) and the result, in Qwen's format",
    );
    const e = await failure(
      client.chat.completions.create({
        model: 'tiny',
        tools: [weather],
        messages: [
          { role: 'user', content: 'x' },
          {
            role: 'assistant',
            content: null,
            tool_calls: [{ id: 'c', type: 'function', function: { name: 'get_weather', arguments: '{city' } }],
          },
        ],
      }),
    );
    t.match(e, { status: 400, param: 'messages', message: /messages\[1\]\.tool_calls\[0\]\.function\.arguments is not valid JSON/ });
  });

  await t.test('hostile tools are coded 400s, and the server answers afterwards', async (t) => {
    const calls = requests.length;
    const bad: Array<[Record<string, unknown>, string, string]> = [
      [{ tools: 'get_weather' }, 'tools', 'invalid_tools'],
      [{ tools: [{ type: 'function', function: {} }] }, 'tools', 'invalid_tools'],
      [{ tools: [{ type: 'function', function: { name: 'f', description: 'x'.repeat(1 << 20) } }] }, 'tools', 'invalid_tools'],
      [{ tools: Array.from({ length: 5000 }, (_, i) => ({ type: 'function', function: { name: `f${i}` } })) }, 'tools', 'invalid_tools'],
      [{ tools: [{ type: 'function', function: { name: 'f', parameters: deep(3000) } }] }, 'tools', 'invalid_tools'],
      [{ tools: [weather], tool_choice: 'required' }, 'tool_choice', 'unsupported_tool_choice'],
      [
        { tools: [weather], tool_choice: { type: 'function', function: { name: 'get_weather' } } },
        'tool_choice',
        'unsupported_tool_choice',
      ],
      [{ response_format: { type: 'json_object' } }, 'response_format', 'unsupported_response_format'],
      [
        { response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object' } } } },
        'response_format',
        'unsupported_response_format',
      ],
      [{ response_format: 'json' }, 'response_format', 'unsupported_response_format'],
    ];
    for (const [extra, param, code] of bad) {
      const e = await failure(client.chat.completions.create({ model: 'tiny', messages: ask('x'), max_tokens: 5, ...extra } as never));
      t.ok(e instanceof OpenAI.BadRequestError, `${param} ${JSON.stringify(extra).slice(0, 50)}: BadRequestError`);
      t.match(e, { status: 400, param, code });
    }
    const e = await failure(
      client.chat.completions.create({ model: 'tiny', messages: ask('x'), response_format: { type: 'json_object' } }),
    );
    t.match(e.message, /response_format json_object is not supported: this server does not constrain generation to JSON/);
    const ec = await failure(client.completions.create({ model: 'tiny', prompt: 'x', tools: [weather] } as never));
    t.match(ec, { status: 400, param: 'tools' }, 'completions take no tools');
    // Earlier calls' arguments nested deep enough to overflow the template's stack: a 400, not a 500.
    const args = `${'{"a":'.repeat(10_000)}1${'}'.repeat(10_000)}`;
    const et = await failure(
      client.chat.completions.create({
        model: 'tiny',
        messages: [
          { role: 'user', content: 'x' },
          { role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: args } }] },
          { role: 'tool', tool_call_id: 'c', content: 'r' },
        ],
      }),
    );
    t.match(
      et,
      { status: 400, param: 'messages', code: 'chat_template_error', message: /Maximum call stack size exceeded/ },
      'a template that fails on the messages: 400 chat_template_error',
    );
    t.equal(requests.length, calls, 'nothing refused reached the model');
    script.push('still here');
    const ok = await client.chat.completions.create({
      model: 'tiny',
      messages: ask('x'),
      tools: [weather],
      response_format: { type: 'text' },
      max_tokens: 20,
    });
    t.equal(ok.choices[0].message.content, 'still here', 'the server answers afterwards');
  });
});

t.test('a chat template that raises on the messages is a 400 chat_template_error', async (t) => {
  const strict = new ChatFormatter(
    "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must start with user') }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}",
  );
  const { client, script, requests } = await start(t, { formatter: strict });
  const e = await failure(
    client.chat.completions.create({ model: 'tiny', messages: [{ role: 'system', content: 'be brief' }], max_tokens: 5 }),
  );
  t.match(e, { status: 400, param: 'messages', code: 'chat_template_error', message: /Conversation roles must start with user/ });
  t.equal(requests.length, 0, 'nothing reached the model');
  script.push('ok');
  const r = await client.chat.completions.create({ model: 'tiny', messages: ask('hi'), max_tokens: 5 });
  t.equal(r.choices[0].message.content, 'ok', 'a conversation the template takes is answered');
});

/** Prometheus' text format: `name{labels} value` lines (comments skipped) as [name, labels, value]. */
function parseProm(text: string): Array<{ name: string; labels: Record<string, string>; value: number }> {
  const out = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m) throw new Error(`not a sample line: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(/([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    out.push({ name: m[1], labels, value: m[3] === '+Inf' ? Infinity : Number(m[3]) });
  }
  return out;
}

t.test('/metrics in Prometheus text format', async (t) => {
  const { client, script, base, hold } = await start(t);
  const scrape = async () => {
    const r = await fetch(`${base}/metrics`);
    if (r.status !== 200) throw new Error(`/metrics answered ${r.status}`);
    const text = await r.text();
    const samples = parseProm(text);
    const types = Object.fromEntries([...text.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map((m) => [m[1], m[2]]));
    const get = (name: string, labels: Record<string, string> = {}) =>
      samples
        .filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))
        .reduce((a, s) => a + s.value, 0);
    return { samples, types, get };
  };
  const head = await fetch(`${base}/metrics`);
  t.equal(head.status, 200);
  t.match(head.headers.get('content-type'), /^text\/plain; version=0\.0\.4/, "Prometheus' text format");
  await head.text();
  const before = await scrape();
  t.same(before.types, {
    slm_train_requests_total: 'counter',
    slm_train_prompt_tokens_total: 'counter',
    slm_train_generation_tokens_total: 'counter',
    slm_train_requests_in_flight: 'gauge',
    slm_train_request_duration_seconds: 'histogram',
  });
  t.equal(before.get('slm_train_requests_total'), 0);
  t.equal(before.get('slm_train_request_duration_seconds_count'), 0);

  script.push('one two three', 'four five');
  const a = await client.chat.completions.create({ model: 'tiny', messages: ask('hi'), max_tokens: 50 });
  const b = await client.completions.create({ model: 'tiny', prompt: 'hello there', max_tokens: 50 });
  await failure(client.chat.completions.create({ model: 'tiny', messages: ask('hi'), presence_penalty: 1 }));
  // In flight: a request the model holds.
  const release = hold();
  script.push('held reply');
  const c = client.chat.completions.create({ model: 'tiny', messages: ask('wait'), max_tokens: 50 });
  for (let i = 0; i < 200 && (await scrape()).get('slm_train_requests_in_flight') === 0; i++) await new Promise((r) => setTimeout(r, 10));
  const during = await scrape();
  t.equal(during.get('slm_train_requests_in_flight'), 1, 'one request in flight while the model holds it');
  release();
  const cr = await c;
  const after = await scrape();
  t.equal(after.get('slm_train_requests_in_flight'), 0, 'none after it is answered');
  t.equal(after.get('slm_train_requests_total', { endpoint: '/v1/chat/completions', status: '200' }), 2);
  t.equal(after.get('slm_train_requests_total', { endpoint: '/v1/completions', status: '200' }), 1);
  t.equal(after.get('slm_train_requests_total', { endpoint: '/v1/chat/completions', status: '400' }), 1);
  const usages = [a.usage!, b.usage!, cr.usage!];
  t.equal(
    after.get('slm_train_prompt_tokens_total'),
    usages.reduce((x, u) => x + u.prompt_tokens, 0),
    'prompt tokens = the replies’ usage',
  );
  t.equal(
    after.get('slm_train_generation_tokens_total'),
    usages.reduce((x, u) => x + u.completion_tokens, 0),
    'generated tokens = the replies’ usage',
  );
  t.equal(after.get('slm_train_request_duration_seconds_count'), 4, 'four requests timed');
  const buckets = after.samples.filter((s) => s.name === 'slm_train_request_duration_seconds_bucket');
  t.ok(
    buckets.every((s, i) => i === 0 || s.value >= buckets[i - 1].value),
    'buckets are cumulative',
  );
  t.equal(buckets.at(-1)!.labels.le, '+Inf');
  t.equal(buckets.at(-1)!.value, 4);
  t.ok(after.get('slm_train_request_duration_seconds_sum') > 0);
  t.ok(after.samples.every((s) => s.labels.model_name === 'tiny'));

  // A client that leaves before its reply: counted as 499, and no longer in flight.
  const release2 = hold();
  script.push('never read');
  const gone = new AbortController();
  const left = fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'tiny', messages: ask('bye'), max_tokens: 5 }),
    signal: gone.signal,
  }).catch((e: Error) => e);
  for (let i = 0; i < 200 && (await scrape()).get('slm_train_requests_in_flight') === 0; i++) await new Promise((r) => setTimeout(r, 10));
  gone.abort();
  t.match(await left, { name: 'AbortError' });
  for (let i = 0; i < 200 && (await scrape()).get('slm_train_requests_in_flight') > 0; i++) await new Promise((r) => setTimeout(r, 10));
  const end = await scrape();
  t.equal(
    end.get('slm_train_requests_total', { endpoint: '/v1/chat/completions', status: '499' }),
    1,
    'the request whose client left: status 499',
  );
  t.equal(end.get('slm_train_requests_in_flight'), 0);
  release2();

  // A body that is not JSON is answered before it is counted.
  const notJson = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: '{"model": ',
  });
  t.equal(notJson.status, 400);
  await notJson.text();
  const last = await scrape();
  t.equal(last.get('slm_train_requests_total'), end.get('slm_train_requests_total'), 'a body that is not JSON is not counted');
});

t.test('max_tokens: the default and the limit of the server', async (t) => {
  const { client, script, requests } = await start(t, { defaultMaxTokens: 7, maxTokensLimit: 40 });
  script.push('a b c d e f g h i j k l m n o p');
  const r = await client.chat.completions.create({ model: 'tiny', messages: ask('count') });
  t.same(requests.at(-1)!.rowMaxNewTokens, [7], 'a request that names no max_tokens gets the default');
  t.equal(r.usage!.completion_tokens, 7);
  t.equal(r.choices[0].finish_reason, 'length');
  for (const [k, v] of [
    ['max_tokens', 41],
    ['max_completion_tokens', 1000],
  ] as const) {
    const e = await failure(client.chat.completions.create({ model: 'tiny', messages: ask('count'), [k]: v }));
    t.match(e, {
      status: 400,
      param: k,
      code: 'max_tokens_over_limit',
      message: new RegExp(`${k} is ${v}, over this server's limit of 40 \\(its --max-tokens-limit\\)`),
    });
  }
  const ec = await failure(client.completions.create({ model: 'tiny', prompt: 'x', max_tokens: 41 }));
  t.match(ec, { status: 400, param: 'max_tokens', code: 'max_tokens_over_limit' });
  script.push('a b');
  await client.chat.completions.create({ model: 'tiny', messages: ask('count'), max_tokens: 40 });
  t.same(requests.at(-1)!.rowMaxNewTokens, [40], 'the limit itself is accepted');
});

t.test('serve --max-tokens-default / --max-tokens-limit reach the server (the CLI, real engine)', async (t) => {
  for (const [args, re] of [
    [['--max-tokens-default', '0'], /--max-tokens-default must be a whole number of tokens from 1 to --max-tokens-limit \(4096\), found 0/],
    [['--max-tokens-default', '100', '--max-tokens-limit', '50'], /--max-tokens-default must be .* \(50\), found 100/],
    [['--max-tokens-limit', '2.5'], /--max-tokens-limit must be a whole number/],
  ] as const) {
    const r = runCli(['serve', '--model', dir, '--port', '0', ...args]);
    t.not(r.code, 0, `${args.join(' ')}: refused`);
    t.match(r.stderr, re);
  }
  const p = spawn(
    process.execPath,
    [
      join(repoRoot, 'bin', 'slm-train.js'),
      'serve',
      '--model',
      dir,
      '--name',
      'tiny',
      '--port',
      '0',
      '--max-tokens-default',
      '6',
      '--max-tokens-limit',
      '9',
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let out = '';
  let err = '';
  p.stdout.on('data', (d) => (out += d));
  p.stderr.on('data', (d) => (err += d));
  t.teardown(() => {
    if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  });
  const listening = /on http:\/\/127\.0\.0\.1:(\d+)\/v1/;
  for (let i = 0; i < 1200 && !listening.test(out); i++) await new Promise((r) => setTimeout(r, 50));
  t.match(out, listening, `listening (stderr: ${err.slice(-300)})`);
  const client = new OpenAI({
    baseURL: `http://127.0.0.1:${listening.exec(out)![1]}/v1`,
    apiKey: 'unused',
    maxRetries: 0,
    timeout: 60_000,
  });
  const r = await client.chat.completions.create({ model: 'tiny', messages: ask('Tell me a story.'), ignore_eos: true } as never);
  t.equal(r.usage!.completion_tokens, 6, 'no max_tokens: --max-tokens-default 6 tokens');
  t.equal(r.choices[0].finish_reason, 'length');
  const e = await failure(client.chat.completions.create({ model: 'tiny', messages: ask('x'), max_tokens: 10 }));
  t.match(e, { status: 400, code: 'max_tokens_over_limit', message: /over this server's limit of 9/ });
  // The real engine with tools: they reach the prompt (its token count), and the reply is parsed.
  const plain = await client.chat.completions.create({ model: 'tiny', messages: ask('Weather?'), max_tokens: 3 });
  const tooled = await client.chat.completions.create({ model: 'tiny', messages: ask('Weather?'), tools: [weather], max_tokens: 3 });
  t.equal(
    tooled.usage!.prompt_tokens,
    tokenizer.encode(formatter.prompt(ask('Weather?'), { tools: [weather] })).length,
    'the prompt rendered with the tools',
  );
  t.ok(tooled.usage!.prompt_tokens > plain.usage!.prompt_tokens);
  const metrics = await (await fetch(`http://127.0.0.1:${listening.exec(out)![1]}/metrics`)).text();
  t.match(
    metrics,
    /^slm_train_requests_total\{model_name="tiny",endpoint="\/v1\/chat\/completions",status="200"\} 3$/m,
    '/metrics of the CLI server',
  );
  p.kill('SIGTERM');
  await new Promise((r) => p.once('exit', r));
});

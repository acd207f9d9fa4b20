import t from 'tap';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ChatFormatter, ChatTemplate, chatTemplateFor, renderChat, type ChatMessage } from '../lib/model/chat.js';
import { QWEN3_PACKAGE, packagedQwen3Config } from '../lib/model/tokenizer.js';
import { fixture, haveShared, needs } from './helpers/shared.js';

const needShared = { skip: needs(!haveShared && 'needs ../shared beside the checkout (fixtures and data)', t) };
const realTemplate = () => readFileSync(fixture('qwen3-tokenizer', 'chat_template.jinja'), 'utf8');
const packagedTemplate = () => packagedQwen3Config().chat_template as string;

const tmp = mkdtempSync(join(tmpdir(), 'slm-chat-'));
t.teardown(() => rmSync(tmp, { recursive: true, force: true }));
function folder(name: string, files: Record<string, string | object>): string {
  const dir = join(tmp, name);
  mkdirSync(dir, { recursive: true });
  for (const [f, v] of Object.entries(files)) writeFileSync(join(dir, f), typeof v === 'string' ? v : JSON.stringify(v));
  return dir;
}

/** system + user + assistant (with a think block) + two tool results. */
const CONVO: ChatMessage[] = [
  { role: 'system', content: 'S' },
  { role: 'user', content: 'Q' },
  { role: 'assistant', content: '<think>\nR\n</think>\n\nA' },
  { role: 'tool', content: 'T1' },
  { role: 'tool', content: 'T2' },
];

const TOOLS = [
  {
    type: 'function',
    function: {
      name: 'search',
      description: 'Search pages',
      parameters: { type: 'object', properties: { query: { type: 'string' } }, required: ['query'] },
    },
  },
];

t.test('real Qwen3-2507 template: system + user + assistant + tool', needShared, async (t) => {
  const tpl = new ChatTemplate(realTemplate(), 'qwen3-2507');
  const body =
    '<|im_start|>system\nS<|im_end|>\n' +
    '<|im_start|>user\nQ<|im_end|>\n' +
    // 2507 Instruct has no <think> handling: the assistant content is rendered verbatim.
    '<|im_start|>assistant\n<think>\nR\n</think>\n\nA<|im_end|>\n' +
    // consecutive tool messages share one user turn, each in <tool_response>
    '<|im_start|>user\n<tool_response>\nT1\n</tool_response>\n<tool_response>\nT2\n</tool_response><|im_end|>\n';
  t.equal(tpl.render(CONVO), body, 'without generation prompt');
  t.equal(tpl.render(CONVO, { addGenerationPrompt: true }), body + '<|im_start|>assistant\n', 'with generation prompt');
  t.equal(
    tpl.render(CONVO.slice(0, 2), { addGenerationPrompt: true }),
    '<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n',
  );
  t.equal(
    tpl.render(CONVO, { addGenerationPrompt: true, enableThinking: false }),
    body + '<|im_start|>assistant\n',
    'enable_thinking is ignored by 2507',
  );
  t.equal(tpl.render([{ role: 'user', content: 'Q' }]), '<|im_start|>user\nQ<|im_end|>\n', 'no system turn unless given');
  t.equal(
    tpl.render([
      { role: 'user', content: 'Q' },
      { role: 'assistant', content: 'a' },
      { role: 'system', content: 'late' },
    ]),
    '<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n<|im_start|>system\nlate<|im_end|>\n',
    'a system message later in the conversation is an ordinary turn',
  );
});

t.test('real Qwen3-2507 template: tools and tool calls', needShared, async (t) => {
  const messages = [
    { role: 'system', content: 'S' },
    { role: 'user', content: 'Q' },
    { role: 'assistant', content: '', tool_calls: [{ type: 'function', function: { name: 'search', arguments: { query: 'x' } } }] },
    { role: 'tool', content: 'found' },
  ] as ChatMessage[];
  const expected =
    '<|im_start|>system\nS\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' +
    'You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n' +
    '{"type": "function", "function": {"name": "search", "description": "Search pages", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}\n' +
    '</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n' +
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' +
    '<|im_start|>user\nQ<|im_end|>\n' +
    '<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call><|im_end|>\n' +
    '<|im_start|>user\n<tool_response>\nfound\n</tool_response><|im_end|>\n' +
    '<|im_start|>assistant\n';
  t.equal(renderChat(realTemplate(), messages, { tools: TOOLS, addGenerationPrompt: true }), expected);
});

t.test('the packaged (original hybrid) Qwen3 template handles <think> itself', async (t) => {
  const tpl = new ChatTemplate(packagedTemplate(), 'package');
  // After the last user query the thinking of a non-final assistant turn is kept, reformatted.
  t.equal(
    tpl.render(CONVO, { addGenerationPrompt: true }),
    '<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n' +
      '<|im_start|>assistant\n<think>\nR\n</think>\n\nA<|im_end|>\n' +
      '<|im_start|>user\n<tool_response>\nT1\n</tool_response>\n<tool_response>\nT2\n</tool_response><|im_end|>\n' +
      '<|im_start|>assistant\n',
  );
  // Before the last user query it is dropped; enable_thinking=false pre-fills an empty think block.
  t.equal(
    tpl.render([...CONVO, { role: 'user', content: 'U2' }], { addGenerationPrompt: true, enableThinking: false }),
    '<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n' +
      '<|im_start|>assistant\nA<|im_end|>\n' +
      '<|im_start|>user\n<tool_response>\nT1\n</tool_response>\n<tool_response>\nT2\n</tool_response><|im_end|>\n' +
      '<|im_start|>user\nU2<|im_end|>\n' +
      '<|im_start|>assistant\n<think>\n\n</think>\n\n',
  );
  // The last assistant turn always gets a (possibly empty) think block.
  t.equal(
    tpl.render([
      { role: 'user', content: 'Q' },
      { role: 'assistant', content: 'A' },
    ]),
    '<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n',
  );
});

t.test('template failures are CHAT_TEMPLATE_ERROR with the template message', async (t) => {
  t.throws(() => renderChat('{{ raise_exception("Only user and assistant roles") }}', [{ role: 'user', content: 'x' }]), {
    code: 'CHAT_TEMPLATE_ERROR',
    message: /Only user and assistant roles/,
  });
  t.throws(() => new ChatTemplate('{% if %}', 'broken.jinja'), { code: 'CHAT_TEMPLATE_ERROR', message: /broken\.jinja does not parse/ });
  t.throws(() => new ChatTemplate(''), { code: 'CHAT_TEMPLATE_ERROR' });
  t.throws(() => renderChat('{{ messages }}', 'hi' as unknown as ChatMessage[]), { code: 'ARGUMENT_INVALID' });
  t.throws(() => renderChat('{{ messages }}', [{ role: 'user', content: 3 }] as unknown as ChatMessage[]), {
    code: 'ARGUMENT_INVALID',
    message: /message 0 \(user\)/,
  });
  t.equal(
    renderChat('{{ bos_token }}{{ eos_token }}|{{ x }}', [], { bosToken: '<s>', eosToken: '</s>', variables: { x: 1 } }),
    '<s></s>|1',
  );
});

t.test('template source of a model folder', async (t) => {
  const own = folder('own-jinja', {
    'chat_template.jinja': '{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}',
    'tokenizer.json': '{}',
  });
  t.equal(chatTemplateFor(own).render([{ role: 'user', content: 'hi' }]), '[user]hi');
  t.equal(chatTemplateFor(own).origin, join(own, 'chat_template.jinja'));

  const inConfig = folder('in-config', {
    'tokenizer.json': '{}',
    'tokenizer_config.json': {
      chat_template: '{{ bos_token }}<{{ messages[0].content }}>',
      bos_token: '<s>',
      eos_token: { content: '</s>' },
    },
  });
  const f = ChatFormatter.forModel(inConfig);
  t.equal(f.render([{ role: 'user', content: 'x' }]), '<s><x>');
  t.equal(f.eosToken, '</s>');

  const named = folder('named', {
    'tokenizer.json': '{}',
    'tokenizer_config.json': {
      chat_template: [
        { name: 'tool_use', template: 'T' },
        { name: 'default', template: 'D' },
      ],
    },
  });
  t.equal(chatTemplateFor(named).render([]), 'D');
  const noDefault = folder('no-default', {
    'tokenizer.json': '{}',
    'tokenizer_config.json': { chat_template: [{ name: 'tool_use', template: 'T' }] },
  });
  t.throws(() => chatTemplateFor(noDefault), { code: 'CHAT_TEMPLATE_ERROR', message: /"default".*"tool_use"/ });

  const bare = folder('bare', {});
  const b = chatTemplateFor(bare);
  t.equal(b.origin, `${QWEN3_PACKAGE}/models/tokenizer_config.json`, 'no tokenizer of its own: the packaged Qwen3 template');
  t.equal(b.source, packagedTemplate());
  t.equal(ChatFormatter.forModel(bare).eosToken, '<|im_end|>');

  t.throws(() => chatTemplateFor(folder('tok-only', { 'tokenizer.json': '{}' })), {
    code: 'CHAT_TEMPLATE_ERROR',
    message: /own tokenizer\.json.*chat_template\.jinja/,
  });
  t.throws(() => chatTemplateFor(join(tmp, 'nowhere')), { code: 'MODEL_NOT_FOUND' });
});

t.test('the real template folder: formatter bound to it', needShared, async (t) => {
  const f = ChatFormatter.forModel(fixture('qwen3-tokenizer'));
  t.equal(f.template.source, realTemplate());
  t.equal(f.eosToken, '<|im_end|>');
  t.equal(f.bosToken, '');
  t.equal(f.prompt([{ role: 'user', content: 'Q' }]), '<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n');
});

t.test('continuation: the text appended after the generated assistant text', needShared, async (t) => {
  const f = ChatFormatter.forModel(fixture('qwen3-tokenizer'));
  const history: ChatMessage[] = [
    { role: 'system', content: 'S' },
    { role: 'user', content: 'Q' },
    { role: 'assistant', content: '<think>r</think><python>print(1)</python>' },
  ];
  const toolReply = '<|im_end|>\n<|im_start|>user\n<tool_response>\n1\n</tool_response><|im_end|>\n<|im_start|>assistant\n';
  t.equal(f.continuation(history, { role: 'tool', content: '1' }), toolReply);
  t.equal(
    f.continuation(history, { role: 'user', content: '<python_output>1</python_output>' }),
    '<|im_end|>\n<|im_start|>user\n<python_output>1</python_output><|im_end|>\n<|im_start|>assistant\n',
  );
  // Generation stopped on <|im_end|>, which is part of the generated text: not repeated.
  const stopped = [...history.slice(0, -1), { role: 'assistant', content: history[2].content + '<|im_end|>' }] as ChatMessage[];
  t.equal(
    f.continuation(stopped, { role: 'tool', content: '1' }),
    '\n<|im_start|>user\n<tool_response>\n1\n</tool_response><|im_end|>\n<|im_start|>assistant\n',
  );
  // prompt + generated + continuation is exactly the full rendering.
  const next: ChatMessage[] = [
    { role: 'tool', content: 'a' },
    { role: 'tool', content: 'b' },
  ];
  t.equal(f.prompt(history.slice(0, -1)) + history[2].content + f.continuation(history, next), f.prompt([...history, ...next]));
  t.throws(() => f.continuation(history.slice(0, 2), { role: 'tool', content: '1' }), {
    code: 'ARGUMENT_INVALID',
    message: /ends with a "user"/,
  });
  t.throws(() => f.continuation(history, []), { code: 'ARGUMENT_INVALID' });
});

t.test('continuation with the hybrid template: rewritten turns', async (t) => {
  const f = new ChatFormatter(packagedTemplate(), { eosToken: '<|im_end|>' });
  const q: ChatMessage[] = [{ role: 'user', content: 'Q' }];
  // The template would reformat this turn's think block; the generated text is kept as generated.
  const gen: ChatMessage = { role: 'assistant', content: '<think>r</think>call' };
  const expected = '<|im_end|>\n<|im_start|>user\n<tool_response>\nout\n</tool_response><|im_end|>\n<|im_start|>assistant\n';
  t.equal(f.continuation([...q, gen], { role: 'tool', content: 'out' }), expected);

  // A tool loop followed by a user message: the template drops the earlier turn's thinking.
  const loop: ChatMessage[] = [
    ...q,
    { role: 'assistant', content: '<think>\nr\n</think>\n\ncall' },
    { role: 'tool', content: 'out' },
    { role: 'assistant', content: 'more' },
  ];
  t.throws(() => f.continuation(loop, { role: 'user', content: 'U' }), {
    code: 'CHAT_TEMPLATE_ERROR',
    message: /differs at character \d+.*strict: false/,
  });
  t.equal(
    f.continuation(loop, { role: 'user', content: 'U' }, { strict: false }),
    '<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n',
  );
  // Sent as a tool message instead, it appends cleanly.
  t.equal(
    f.continuation(loop, { role: 'tool', content: 'U' }),
    '<|im_end|>\n<|im_start|>user\n<tool_response>\nU\n</tool_response><|im_end|>\n<|im_start|>assistant\n',
  );
});

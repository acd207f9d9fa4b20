// Qwen2.5 and Llama 3.2 chat templates through the same Jinja path as Qwen3 (lib/model/chat.ts,
// @huggingface/jinja): the templates below are the ones in Qwen/Qwen2.5-*-Instruct's and
// meta-llama/Llama-3.2-*-Instruct's tokenizer_config.json, written into tiny test checkpoints of
// those architectures; the expected prompts are written out by hand from what the templates say.
import t, { type Test } from 'tap';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ChatFormatter, type ChatMessage } from '../lib/model/chat.js';
import { initModel } from '../lib/model/init.js';
import { readModelConfig } from '../lib/model/config.js';

const QWEN25_TEMPLATE = String.raw`{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
`;

const LLAMA32_TEMPLATE = String.raw`{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
`;

const TOOL = {
  type: 'function',
  function: { name: 'search', description: 'Search', parameters: { type: 'object', properties: { query: { type: 'string' } } } },
};

/** A tiny checkpoint of the architecture with the family's tokenizer_config.json (template, bos/eos). */
function checkpoint(t: Test, modelType: string, tokenizerConfig: object): string {
  const dir = join(t.testdir(), modelType);
  initModel({ preset: 'tiny', modelType, out: dir, overrides: { vocab_size: 64 } });
  writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify(tokenizerConfig));
  writeFileSync(join(dir, 'tokenizer.json'), '{}'); // its own tokenizer: the packaged Qwen3 template must not be used
  t.equal(readModelConfig(dir).model_type, modelType);
  return dir;
}

t.test('Qwen2.5-Instruct template', async (t) => {
  const dir = checkpoint(t, 'qwen2', { chat_template: QWEN25_TEMPLATE, bos_token: null, eos_token: '<|im_end|>' });
  const f = ChatFormatter.forModel(dir);
  t.equal(f.eosToken, '<|im_end|>');

  t.equal(
    f.prompt([{ role: 'user', content: 'Who founded Ostrava?' }]),
    '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' +
      '<|im_start|>user\nWho founded Ostrava?<|im_end|>\n' +
      '<|im_start|>assistant\n',
    'no system message: the default Qwen system prompt',
  );

  const convo: ChatMessage[] = [
    { role: 'system', content: 'S' },
    { role: 'user', content: 'Q' },
    { role: 'assistant', content: 'A' },
    { role: 'tool', content: 'T1' },
    { role: 'tool', content: 'T2' },
  ];
  t.equal(
    f.prompt(convo),
    '<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n' +
      '<|im_start|>user\n<tool_response>\nT1\n</tool_response>\n<tool_response>\nT2\n</tool_response><|im_end|>\n<|im_start|>assistant\n',
    'consecutive tool results share one user turn',
  );

  t.equal(
    f.render(
      [
        { role: 'user', content: 'Q' },
        { role: 'assistant', content: '', tool_calls: [{ type: 'function', function: { name: 'search', arguments: { query: 'x' } } }] },
      ] as ChatMessage[],
      { tools: [TOOL] },
    ),
    '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' +
      'You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n' +
      '{"type": "function", "function": {"name": "search", "description": "Search", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}\n' +
      '</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' +
      '<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call><|im_end|>\n',
    'tools in the system turn, a tool call in the assistant turn',
  );

  // Search-R1 style: the retrieved passages come back as a user message appended to the generated tokens.
  const history: ChatMessage[] = [
    { role: 'user', content: 'Q' },
    { role: 'assistant', content: '<search>x</search><|im_end|>' },
  ];
  t.equal(
    f.continuation(history, { role: 'user', content: '<information>P</information>' }),
    '\n<|im_start|>user\n<information>P</information><|im_end|>\n<|im_start|>assistant\n',
  );
});

t.test('Llama-3.2-Instruct template', async (t) => {
  const dir = checkpoint(t, 'llama', { chat_template: LLAMA32_TEMPLATE, bos_token: '<|begin_of_text|>', eos_token: '<|eot_id|>' });
  const f = ChatFormatter.forModel(dir);
  t.equal(f.bosToken, '<|begin_of_text|>');
  t.ok(f.stopTexts.includes('<|eot_id|>'), 'generation stops at <|eot_id|>');
  const header = (role: string) => `<|start_header_id|>${role}<|end_header_id|>\n\n`;
  // Without date_string the template asks strftime_now (provided by the Jinja runtime, as transformers
  // does) for today's date in "%d %b %Y".
  const now = new Date();
  const today = `${String(now.getDate()).padStart(2, '0')} ${now.toLocaleString('en-US', { month: 'short' })} ${now.getFullYear()}`;

  t.equal(
    f.prompt([{ role: 'user', content: '  Who founded Ostrava?\n' }]),
    '<|begin_of_text|>' +
      header('system') +
      'Cutting Knowledge Date: December 2023\nToday Date: ' +
      today +
      '\n\n<|eot_id|>' +
      header('user') +
      'Who founded Ostrava?<|eot_id|>' +
      header('assistant'),
    'bos, the system header dated today with an empty system message, the trimmed user message',
  );

  t.equal(
    f.prompt(
      [
        { role: 'system', content: 'Answer briefly.' },
        { role: 'user', content: 'Q' },
        { role: 'assistant', content: 'A' },
        { role: 'user', content: 'Q2' },
      ],
      { variables: { date_string: '23 Nov 2026' } },
    ),
    '<|begin_of_text|>' +
      header('system') +
      'Cutting Knowledge Date: December 2023\nToday Date: 23 Nov 2026\n\nAnswer briefly.<|eot_id|>' +
      header('user') +
      'Q<|eot_id|>' +
      header('assistant') +
      'A<|eot_id|>' +
      header('user') +
      'Q2<|eot_id|>' +
      header('assistant'),
    'the system message inside the system header; date_string from the caller',
  );

  t.equal(
    f.render([
      { role: 'user', content: 'Q' },
      { role: 'tool', content: 'T1' },
    ]),
    '<|begin_of_text|>' +
      header('system') +
      'Cutting Knowledge Date: December 2023\nToday Date: ' +
      today +
      '\n\n<|eot_id|>' +
      header('user') +
      'Q<|eot_id|>' +
      header('ipython') +
      '"T1"<|eot_id|>',
    'a tool result is an ipython turn; a string is iterable in Jinja, so the template writes it as JSON',
  );

  t.equal(
    f.continuation(
      [
        { role: 'user', content: 'Q' },
        { role: 'assistant', content: '<search>x</search><|eot_id|>' },
      ],
      { role: 'user', content: '<information>P</information>' },
    ),
    header('user') + '<information>P</information><|eot_id|>' + header('assistant'),
  );

  const twoCalls = {
    role: 'assistant',
    content: '',
    tool_calls: [TOOL, TOOL].map((x) => ({ type: 'function', function: { name: x.function.name, arguments: {} } })),
  };
  t.throws(
    () => f.render([{ role: 'user', content: 'Q' }, twoCalls] as ChatMessage[]),
    { code: 'CHAT_TEMPLATE_ERROR', message: /single tool-calls at once/ },
    "the template's raise_exception surfaces as CHAT_TEMPLATE_ERROR",
  );
});

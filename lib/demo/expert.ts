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

/**
 * The pattern that finds each kind of fact in a page: each one's first match in the whole page is
 * the fact (the history section, which holds the founding year and the founder, comes before the
 * population figure). Patterns without a shared lead-in: with "founded in (\d+)" and "on the (\w+
 * River)" the tiny model picked the lead-in without regard to the question.
 */
const PATTERN: Record<SyntheticQuestionKind, string> = {
  founded: '(\\d+)',
  founder: 'by (\\w+ \\w+)',
  river: '(\\w+ River)',
  economy: 'rests on (\\w+)',
  fair: '(\\w+ Fair)',
};

/**
 * The program for a question: search with the question, read the top hit's page and give the fact
 * to final_answer() (or print it: `answer: 'print'`). One decision depends on the question, the
 * pattern. The demo binds the question to the variable `question` and lets programs answer, so
 * nothing has to be copied: its 4-layer model learned neither to copy a town's name into a search
 * string nor a printed fact into <answer>. (An earlier expert read the one section that holds the
 * fact: two decisions per question, which the SFT model made independently of each other on
 * phrasings it had not seen, mixing one kind's section with another's pattern.)
 */
export function expertProgram(q: Pick<SyntheticQuestion, 'kind'>, answer: 'final_answer' | 'print' = 'final_answer'): string {
  return [
    `hits = search_pages(question)`,
    `text = read_section(hits[0]["page_id"] + ":full")`,
    `${answer === 'print' ? 'print' : 'final_answer'}(re.search(r"${PATTERN[q.kind]}", text).group(1))`,
  ].join('\n');
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
 * accepted rows and how many were rejected because the answer was not the gold one.
 */
export async function expertTrajectories(
  questions: readonly SyntheticQuestion[],
  protocol: EpisodeProtocol,
  opts: { maxTurns?: number; answer?: 'final_answer' | 'print'; onDone?: () => void } = {},
): Promise<{ rows: ExpertRow[]; rejected: number }> {
  const maxTurns = opts.maxTurns ?? 2;
  const rows: ExpertRow[] = [];
  let rejected = 0;
  await Promise.all(
    questions.map(async (syntheticQuestion) => {
      const messages = protocol.initialMessages(syntheticQuestion.question, maxTurns);
      const turn1 = `<python>\n${expertProgram(syntheticQuestion, opts.answer)}\n</python>`;
      const action = protocol.parse(turn1);
      if (action.kind !== 'code') throw new Error(`expert program did not parse as code: ${action.kind}`);
      const reply = await protocol.respond(action, {
        turn: 1,
        maxTurns,
        finishReason: 'stop_string',
        maxNewTokens: 256,
        question: syntheticQuestion.question,
      });
      opts.onDone?.();
      const printed = /<python_output>\n([\s\S]*?)\n<\/python_output>/.exec(reply.messages?.[0]?.content ?? '')?.[1]?.trim() ?? '';
      const answer = reply.answer ?? printed;
      if (!exactMatch(answer, syntheticQuestion.answer) || reply.program?.error) {
        rejected++;
        return;
      }
      messages.push({ role: 'assistant', content: turn1 });
      if (reply.answer === undefined)
        messages.push(...(reply.messages ?? []), { role: 'assistant', content: `<answer>${printed}</answer>` });
      rows.push({ question: syntheticQuestion.question, answer: syntheticQuestion.answer, messages });
    }),
  );
  // Promise.all finishes in any order; keep the questions' order.
  const order = new Map(questions.map((q, i) => [q.question, i]));
  rows.sort((a, b) => order.get(a.question)! - order.get(b.question)!);
  return { rows, rejected };
}

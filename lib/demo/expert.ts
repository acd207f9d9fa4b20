/**
 * The demo's scripted expert: for each question of the generated corpus it writes the program a
 * careful searcher would write (search with the question, read the section that holds the fact,
 * extract it with a regular expression), runs it in the real sandbox through the code protocol, and
 * answers with what the program printed. The conversation is built with the same protocol object
 * the episodes use, so SFT sees exactly the format of a rollout. Trajectories whose answer is not the
 * gold one are dropped (rejection sampling of demonstrations).
 */
import type { ChatMessage } from '../model/tokenizer-types.js';
import type { EpisodeProtocol } from '../episodes/protocol.js';
import type { SyntheticQuestion, SyntheticQuestionKind } from '../retrieval/synthetic.js';
import { exactMatch } from '../rewards/metrics.js';

export const DEMO_SYSTEM_PROMPT = [
  'Answer the question by writing Python that searches an encyclopedia.',
  'Tools: search_pages(query) -> list of {page_id, title, similarity}; read_section(section_id) -> text.',
  'Section ids: page_id + ":history", ":geography", ":economy" or ":full". re is imported.',
  'Put code in <python></python>; its output comes back in <python_output>. Put the final answer in <answer></answer>.',
].join('\n');

const PLAN: Record<SyntheticQuestionKind, { section: string; pattern: string }> = {
  founded: { section: 'history', pattern: 'founded in (\\d+)' },
  founder: { section: 'history', pattern: 'by ([A-Z]\\w+ [A-Z]\\w+)' },
  river: { section: 'geography', pattern: 'on the (\\w+ River)' },
  economy: { section: 'economy', pattern: 'rests on (\\w+)' },
  fair: { section: 'economy', pattern: 'holds the (\\w+ Fair)' },
};

export function expertProgram(q: Pick<SyntheticQuestion, 'question' | 'kind'>): string {
  const p = PLAN[q.kind];
  return [`hits = search_pages(${JSON.stringify(q.question)})`, `text = read_section(hits[0]["page_id"] + ":${p.section}")`, `print(re.search(r"${p.pattern}", text).group(1))`].join('\n');
}

export interface ExpertRow {
  question: string;
  answer: string;
  messages: ChatMessage[];
}

/**
 * Expert conversations for `questions` (two turns: the program, then the answer), run through
 * `protocol` (a code protocol over the demo's sandbox). Returns the accepted rows and how many were
 * rejected because the program's output was not the gold answer.
 */
export async function expertTrajectories(questions: readonly SyntheticQuestion[], protocol: EpisodeProtocol, maxTurns = 2, onDone?: () => void): Promise<{ rows: ExpertRow[]; rejected: number }> {
  const rows: ExpertRow[] = [];
  let rejected = 0;
  await Promise.all(
    questions.map(async (q) => {
      const messages = protocol.initialMessages(q.question, maxTurns);
      const turn1 = `<python>\n${expertProgram(q)}\n</python>`;
      const action = protocol.parse(turn1);
      if (action.kind !== 'code') throw new Error(`expert program did not parse as code: ${action.kind}`);
      const reply = await protocol.respond(action, { turn: 1, maxTurns, finishReason: 'stop_string', maxNewTokens: 256 });
      onDone?.();
      const output = /<python_output>\n([\s\S]*?)\n<\/python_output>/.exec(reply.messages?.[0]?.content ?? '')?.[1]?.trim() ?? '';
      if (!exactMatch(output, q.answer) || reply.program?.error) {
        rejected++;
        return;
      }
      messages.push({ role: 'assistant', content: turn1 }, ...(reply.messages ?? []), { role: 'assistant', content: `<answer>${output}</answer>` });
      rows.push({ question: q.question, answer: q.answer, messages });
    }),
  );
  // Promise.all finishes in any order; keep the questions' order.
  const order = new Map(questions.map((q, i) => [q.question, i]));
  rows.sort((a, b) => order.get(a.question)! - order.get(b.question)!);
  return { rows, rejected };
}

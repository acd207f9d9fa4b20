/**
 * The LLM judge's prompts: the rubrics and system prompt of each reply format (binary, graded) and
 * the user message that shows the judge the question, the reference answers, the final answer and
 * the trajectory. judge.ts turns the judge into a reward component.
 */
import type { ChatMessage } from '../model/tokenizer-types.js';
import type { RewardContext } from './types.js';

/** The reply format the judge is asked for (see judge.ts's module comment). */
export type JudgeFormat = 'binary' | 'graded';

const RUBRIC_CORRECTNESS = `Correctness: does the final answer state the same fact as one of the reference answers?
- 10: the same entity, number, date or statement, in any wording (abbreviations, a fuller name, extra correct detail are fine)
- 5: partly right (the right year but the wrong day; one of two things asked for)
- 0: wrong, missing, "I don't know", or hedging between several candidates`;

const RUBRIC_APPROACH = `Approach: how well did the assistant work towards its answer?
- 10: searched for what the question needs, read the relevant results, and based the answer on what it found
- 5: got there with wasted or repeated steps, or without checking the sources it found
- 0: no searching, guessing, or ignoring what the searches returned
Grade the approach on its own: a good approach can end in a wrong answer, and a lucky guess is a poor approach.`;

const RUBRIC_CATEGORY = `"category": which one describes the final answer?
- "correct": it states the same fact as one of the reference answers, in any wording (an abbreviation, a fuller name, a unit or extra correct detail are fine: "42 years old" matches "42", "NYC" matches "New York City")
- "incorrect": it commits to an answer that is wrong, or hedges between several candidates
- "gave_up": it gives no real answer ("Unknown", "Not found", "N/A", "I could not determine it", nothing)
Giving up is worse than a wrong answer.`;

const RUBRIC_APPROACH_SCORE = `"approach_score": an integer from 0 to 100, the sum of four parts of up to 25 each:
- queries: it searched for what the question needs, with targeted rather than generic queries
- efficiency: no wasted turns, no repeated failing steps
- sources: it found and read the documents that hold the answer
- reasoning: the answer follows from what it read
Score the approach on its own: a careful search can end in a wrong answer, and a lucky guess is a poor approach.`;

/** The JSON object a binary-format reply must end with, as the prompt shows it. */
export function binaryJudgeShape(approach = true): string {
  return `{"category": "correct" | "incorrect" | "gave_up"${approach ? ', "approach_score": <0-100>' : ''}}`;
}

/** The default system prompt of a format: the rubric, then exactly what the reply must end with. */
export function judgeSystemPrompt(approach = true, format: JudgeFormat = 'binary'): string {
  const intro = [
    'You grade the work of an assistant that answers factual questions by searching a collection of documents.',
    `You are given the question, the reference answer(s), the assistant's final answer${approach ? ' and its trajectory (its steps and what they returned)' : ''}.`,
  ];
  if (format === 'binary') {
    return [
      ...intro,
      approach
        ? 'Judge two things: the category of the final answer and the quality of the approach.'
        : 'Judge the category of the final answer.',
      RUBRIC_CATEGORY,
      ...(approach ? [RUBRIC_APPROACH_SCORE] : []),
      `Think briefly if you need to, then end your reply with one JSON object and nothing after it:\n${binaryJudgeShape(approach)}`,
    ].join('\n\n');
  }
  return [
    ...intro,
    approach ? 'Give two grades, each an integer from 0 to 10.' : 'Give one grade, an integer from 0 to 10.',
    RUBRIC_CORRECTNESS,
    ...(approach ? [RUBRIC_APPROACH] : []),
    `Think briefly if you need to, then end your reply with exactly ${approach ? 'these two lines' : 'this line'}:\nCorrectness: <0-10>${approach ? '\nApproach: <0-10>' : ''}`,
  ].join('\n\n');
}

/**
 * The trajectory as text: every message after the system prompt and the first user message (the
 * question, given separately), each headed by its role; cut in the middle beyond `maxChars`.
 */
export function renderTrajectory(messages: readonly ChatMessage[] | undefined, maxChars = 12000): string {
  if (!messages || messages.length === 0) return '(not available)';
  const firstUser = messages.findIndex((m) => m.role === 'user');
  const steps = messages.filter((m, i) => m.role !== 'system' && i !== firstUser);
  if (steps.length === 0) return '(no steps: the assistant wrote nothing)';
  const text = steps.map((m) => `[${m.role}]\n${(m.content ?? '').trim()}`).join('\n\n');
  if (text.length <= maxChars) return text;
  const head = Math.floor(maxChars / 2);
  const tail = maxChars - head;
  return `${text.slice(0, head)}\n[... ${text.length - maxChars} characters left out ...]\n${text.slice(text.length - tail)}`;
}

/** The user message the judge reads (the same for both formats). */
export function judgeUserMessage(ctx: RewardContext, approach = true, maxTrajectoryChars = 12000): string {
  const golds = ctx.golds.length ? ctx.golds.map((g) => `- ${g}`).join('\n') : '- (none given)';
  const answer = ctx.answer === null ? '(none: the assistant ended without an answer)' : ctx.answer.trim() || '(empty)';
  const parts = [`Question: ${ctx.question}`, `Reference answer(s):\n${golds}`, `Final answer: ${answer}`];
  if (approach) parts.push(`Trajectory:\n<trajectory>\n${renderTrajectory(ctx.episode?.messages, maxTrajectoryChars)}\n</trajectory>`);
  return parts.join('\n\n');
}

// ---------------------------------------------------------------------------------------------
// The reference code-search system's own prompt (judge.prompt: reference)

/**
 * The reference code-search system's judge prompt (its src/prompts/judge.py JUDGE_PROMPT_TEMPLATE,
 * lines 65-95, word for word), sent as the only (user) message; `{schema}` is its JUDGE_SCHEMA as
 * Python's json.dumps(indent=2) writes it.
 */
export const REFERENCE_JUDGE_TEMPLATE = `Evaluate the agent's answer AND search approach.

Question: {question}
Ground truth answer: {answer}
Agent's final answer: {response}

Agent's full trajectory:
{trajectory}

SCORING:

1. "category" (one of: "correct", "incorrect", "gave_up"):
   - "correct": Answer is semantically equivalent to "{answer}" (same meaning, different wording OK)
     Examples: "42 years old" matches "42", "NYC" matches "New York City"
   - "incorrect": Agent provided a WRONG answer (tried but got it wrong)
   - "gave_up": Agent gave up without providing a real answer
     Examples: "Unknown", "Not found", "N/A", "Unable to determine", "I don't know"

   IMPORTANT: "gave_up" is WORSE than "incorrect" - always penalize giving up!

2. "approach_score" (0-100):
   - 0-25: Relevant search queries (targeted vs generic)
   - 0-25: Efficiency (minimal wasted turns, no repeated failures)
   - 0-25: Found and read appropriate sources
   - 0-25: Clear reasoning, answer derived from evidence

Think briefly, then output JSON.

{schema}

JSON:`;

const REFERENCE_JUDGE_SCHEMA = {
  type: 'object',
  properties: {
    category: { type: 'string', enum: ['correct', 'incorrect', 'gave_up'], description: 'Classification of the response' },
    approach_score: { type: 'integer', minimum: 0, maximum: 100, description: 'Quality of the search approach (0-100)' },
  },
  required: ['category', 'approach_score'],
};

/**
 * The trajectory as the reference's EpisodeResult.format_for_judge writes it (src/agent/episode.py
 * 79-108): the system prompt and the question left out, each assistant turn as `[TURN n - AGENT]:`,
 * each environment message as `[EXECUTION RESULT]:` (`[SYSTEM REMINDER]:` for the final-turn notice),
 * joined by blank lines. Environment messages are the user (or tool) messages after the question.
 */
export function referenceTrajectory(messages: readonly ChatMessage[] | undefined): string {
  const parts: string[] = [];
  let turn = 0;
  let question = false;
  for (const m of messages ?? []) {
    if (m.role === 'system') continue;
    if (m.role === 'assistant') parts.push(`[TURN ${++turn} - AGENT]:\n${m.content}`);
    else if (m.role === 'user' && !question) question = true;
    else parts.push(`${m.content.startsWith('[FINAL TURN]') ? '[SYSTEM REMINDER]' : '[EXECUTION RESULT]'}:\n${m.content}`);
  }
  return parts.join('\n\n');
}

/** The reference's judge message for an episode: its template filled as its build_judge_prompt fills it. */
export function referenceJudgeMessage(ctx: RewardContext): string {
  const values: Record<string, string> = {
    question: ctx.question,
    // Its questions have one gold answer; several are listed as alternatives.
    answer: ctx.golds.join(' or '),
    response: ctx.answer ?? '(no answer)',
    trajectory: referenceTrajectory(ctx.episode?.messages) || '(no trajectory provided)',
    schema: JSON.stringify(REFERENCE_JUDGE_SCHEMA, null, 2),
  };
  return REFERENCE_JUDGE_TEMPLATE.replace(/\{(question|answer|response|trajectory|schema)\}/g, (_, k: string) => values[k]);
}

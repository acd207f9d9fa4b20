// The EpisodeRunner with the real Qwen3 tokenizer and chat template, a scripted generator (pre-written
// turns per episode, emitted token by token with the engine's stop rules) and a fake executor; one
// integration test with the real Python sandbox at the end.
import t, { type Test } from 'tap';
import { readFileSync } from 'node:fs';
import type { GenerateRequest, GenerateResult, TextGenerator } from '../lib/engine/types.js';
import { ChatFormatter } from '../lib/model/chat.js';
import { packagedQwen3Config, qwen3Tokenizer } from '../lib/model/tokenizer.js';
import {
  codeProtocol,
  EpisodeRunner,
  finalTurnNotice,
  formatInformation,
  tagsProtocol,
  tokensThrough,
  type CodeExecutor,
  type Episode,
  type EpisodeRunnerOptions,
  type ProgramResult,
} from '../lib/episodes/index.js';
import { createSandbox } from '../lib/sandbox/index.js';
import type { SearchTools } from '../lib/sandbox/types.js';
import { fixture, haveShared } from './helpers/shared.js';

const tok = qwen3Tokenizer();
const IM_END = '<|im_end|>';
const template = haveShared
  ? readFileSync(fixture('qwen3-tokenizer', 'chat_template.jinja'), 'utf8')
  : (packagedQwen3Config().chat_template as string);
const formatter = new ChatFormatter(template, { eosToken: IM_END });

/** Log-prob the scripted generator gives a token: a function of the id, never 0. */
const lp = (id: number) => Math.fround(-(1 + (id % 997)) / 1000);

interface Script {
  /** Identifies the episode: the prompt contains it. */
  key: string;
  /** Turn texts, in order; a turn's tokens are `encode(text)` unless `tokens` gives them. */
  turns: Array<string | { tokens: number[] }>;
}

/**
 * A TextGenerator that plays scripted turns. Per row it finds the script whose key the prompt
 * contains, then emits that script's current turn token by token, stopping as the engine does: after
 * a stop token, at the token whose text completes a stop string in this call's output (if honoured; the
 * engine's rule: the token may carry text past the stop string), at maxNewTokens,
 * or when the scripted turn runs out ('length'). A call whose prompt is the previous call's prompt +
 * output continues the same turn (a resume); any other call starts the next turn.
 */
class ScriptedGenerator implements TextGenerator {
  calls: Array<{
    rows: number;
    keys: string[];
    temperature: number[];
    topP?: number | number[];
    maxNewTokens: number;
    stopStrings: string[];
    stopTokenIds: number[];
  }> = [];
  readonly #state = new Map<string, { turn: number; pos: number; lastLen: number }>();
  constructor(
    readonly scripts: Script[],
    readonly honourStopStrings = true,
  ) {}

  turnTokens(s: Script, i: number): number[] {
    const turn = s.turns[i];
    if (turn === undefined) throw new Error(`script ${s.key} has no turn ${i + 1}`);
    return typeof turn === 'string' ? tok.encode(turn) : turn.tokens;
  }

  async generate(req: GenerateRequest): Promise<GenerateResult> {
    const out: GenerateResult = { tokens: [], logprobs: [], finishReasons: [] };
    const keys: string[] = [];
    for (const prompt of req.prompts) {
      const text = tok.decode(prompt);
      const script = this.scripts.find((s) => text.includes(s.key));
      if (!script) throw new Error(`no script for prompt ${JSON.stringify(text.slice(-200))}`);
      keys.push(script.key);
      const st = this.#state.get(script.key) ?? { turn: -1, pos: 0, lastLen: -1 };
      if (prompt.length !== st.lastLen) {
        st.turn++;
        st.pos = 0;
      }
      const all = this.turnTokens(script, st.turn);
      const emitted: number[] = [];
      let finish: 'stop_token' | 'stop_string' | 'length' = 'length';
      while (st.pos < all.length && emitted.length < req.maxNewTokens) {
        const id = all[st.pos++];
        emitted.push(id);
        if (req.stopTokenIds?.includes(id)) {
          finish = 'stop_token';
          break;
        }
        if (this.honourStopStrings && req.stopStrings?.some((s) => tok.decode(emitted).includes(s))) {
          finish = 'stop_string';
          break;
        }
      }
      st.lastLen = prompt.length + emitted.length;
      this.#state.set(script.key, st);
      out.tokens.push(Int32Array.from(emitted));
      out.logprobs.push(Float32Array.from(emitted, lp));
      out.finishReasons.push(finish);
    }
    const temps =
      typeof req.temperature === 'number' ? req.prompts.map(() => req.temperature as number) : Array.from(req.temperature ?? []);
    this.calls.push({
      rows: req.prompts.length,
      keys,
      temperature: temps,
      topP: req.topP,
      maxNewTokens: req.maxNewTokens,
      stopStrings: req.stopStrings ?? [],
      stopTokenIds: req.stopTokenIds ?? [],
    });
    return out;
  }
}

/** Runs programs by echoing what they are; records them. */
class FakeExecutor implements CodeExecutor {
  programs: string[] = [];
  async run(code: string): Promise<ProgramResult> {
    this.programs.push(code);
    if (code.includes('raise'))
      return { stdout: 'before the error\n', error: 'ValueError: boom', timed_out: false, calls: [], truncated: false, duration_ms: 1 };
    return {
      stdout: `ran ${code.split('\n').length} line(s)\n`,
      error: null,
      timed_out: false,
      calls: [{ name: 'search_pages', args: [code.slice(0, 10)], ok: true, ms: 0.5 }],
      truncated: false,
      duration_ms: 2,
    };
  }
}

function runner(gen: TextGenerator, exec: CodeExecutor, over: Partial<EpisodeRunnerOptions> = {}) {
  return new EpisodeRunner({
    generator: gen,
    tokenizer: tok,
    formatter,
    protocol: codeProtocol({ executor: exec }),
    maxTurns: 3,
    maxNewTokens: 400,
    maxTotalTokens: 8192,
    ...over,
  });
}

const maskedIds = (e: Episode, bit: number) => Array.from(e.ids).filter((_, k) => e.lossMask[k] === bit);

/** The invariants every episode must satisfy. */
function checkEpisode(t: Test, e: Episode) {
  t.equal(e.ids.length, e.lossMask.length, 'mask aligned with ids');
  t.equal(e.ids.length, e.logprobs.length, 'log-probs aligned with ids');
  let badLp = 0;
  for (let k = 0; k < e.ids.length; k++) {
    if (e.lossMask[k] ? e.logprobs[k] !== lp(e.ids[k]) : e.logprobs[k] !== 0) badLp++;
  }
  t.equal(badLp, 0, 'log-probs are the sampled ones where mask 1, 0 elsewhere');
  t.same(Array.from(e.lossMask.subarray(0, e.promptTokens)), new Array(e.promptTokens).fill(0), 'prompt masked out');
  // the segments tile the sequence: prompt, then model/env alternating
  t.equal(
    e.segments.reduce((n, s) => n + s.tokens, 0),
    e.ids.length,
  );
  let k = 0;
  for (const s of e.segments) {
    const bits = new Set(Array.from(e.lossMask.subarray(k, k + s.tokens)));
    if (s.tokens) t.same([...bits], [s.source === 'model' ? 1 : 0], `${s.source} segment mask`);
    t.equal(tok.decode(e.ids.subarray(k, k + s.tokens)), s.text, `${s.source} segment text`);
    k += s.tokens;
  }
  t.ok(e.ids.length < 8192 || e.finish === 'context');
}

t.test('a batch of code episodes finishing at different turns', async (t) => {
  const scripts: Script[] = [
    { key: 'QA: capital of France?', turns: ['<python>\nprint(search_pages("France"))\n</python>', '<answer>Paris</answer>'] },
    {
      key: 'QB: tallest mountain?',
      turns: [
        'Let me look.\n<python>\nx = search_pages("mountain")\nprint(x)\n</python>',
        '<think>\nNot enough.\n</think>\n\n<python>\nprint(read_section("everest:full"))\n</python>',
        '<answer>Mount Everest</answer>',
      ],
    },
    { key: 'QC: 2+2?', turns: ['<answer>4</answer>'] },
  ];
  const gen = new ScriptedGenerator(scripts);
  const exec = new FakeExecutor();
  const r = runner(gen, exec);
  const { episodes, stats } = await r.run([
    { question: scripts[0].key, temperature: 0.7, topP: 0.9 },
    { question: scripts[1].key, temperature: 1.1 },
    { question: scripts[2].key, temperature: 0.9, topP: 0.85 },
  ]);
  const [a, b, c] = episodes;

  // only active episodes are sent, with their own temperatures
  t.same(
    gen.calls.map((x) => x.rows),
    [3, 2, 1],
  );
  t.same(stats.rowsPerCall, [3, 2, 1]);
  t.same(
    gen.calls.map((x) => x.keys),
    [[scripts[0].key, scripts[1].key, scripts[2].key], [scripts[0].key, scripts[1].key], [scripts[1].key]],
  );
  t.same(
    gen.calls.map((x) => x.temperature),
    [[0.7, 1.1, 0.9], [0.7, 1.1], [1.1]],
  );
  // and their own top-p where one in the call sets it (the runner's, none = 1, for the others);
  // a call without any stays on the runner's single value
  t.same(
    gen.calls.map((x) => x.topP),
    [[0.9, 1, 0.85], [0.9, 1], undefined],
  );
  t.same(gen.calls[0].stopStrings, ['</python>', '</answer>']);
  t.same(gen.calls[0].stopTokenIds, tok.stopTokenIds);
  t.equal(gen.calls[0].maxNewTokens, 400);

  t.match(a, { answer: 'Paris', finish: 'answer', turns: 2, temperature: 0.7 });
  t.match(b, { answer: 'Mount Everest', finish: 'answer', turns: 3, temperature: 1.1 });
  t.match(c, { answer: '4', finish: 'answer', turns: 1 });
  for (const e of episodes) checkEpisode(t, e);

  // mask 1 exactly on the generated text: decoding the masked-in ids gives the scripted turns
  for (const [i, e] of episodes.entries())
    t.equal(tok.decode(maskedIds(e, 1)), scripts[i].turns.join(''), `episode ${i}: masked-in text is the scripted text`);
  // ...and the rest is the prompt plus the environment's text, chat-template glue included
  const envA = a.segments.filter((s) => s.source === 'env').map((s) => s.text);
  t.same(envA, [`${IM_END}\n<|im_start|>user\n<python_output>\nran 1 line(s)\n\n</python_output>${IM_END}\n<|im_start|>assistant\n`]);

  // the whole sequence is what the chat template renders for the conversation (up to the last turn's end)
  for (const e of episodes) {
    const full = formatter.render(e.messages);
    const text = tok.decode(e.ids);
    t.equal(full, text + `${IM_END}\n`, 'ids = the rendered conversation');
  }
  // prompt = the protocol's first messages rendered with the generation prompt
  t.same(Array.from(a.ids.subarray(0, a.promptTokens)), tok.encode(formatter.prompt(a.messages.slice(0, 2))));

  // B's last turn came after the final-turn notice (its 3rd turn is the last of 3)
  t.same(
    b.messages.map((m) => m.role),
    ['system', 'user', 'assistant', 'user', 'assistant', 'user', 'user', 'assistant'],
  );
  t.equal(b.messages[6].content, finalTurnNotice());
  t.equal(b.messages[2].content, scripts[1].turns[0]);
  t.match(b.messages[5].content, /^<python_output>\nran 1 line\(s\)\n\n<\/python_output>$/);
  // A answers at turn 2 of 3: no notice
  t.notOk(a.messages.some((m) => m.content === finalTurnNotice()));

  // programs and calls
  t.same(exec.programs, ['print(search_pages("France"))', 'x = search_pages("mountain")\nprint(x)', 'print(read_section("everest:full"))']);
  t.same(
    b.calls.map((x) => [x.turn, x.name]),
    [
      [1, 'search_pages'],
      [2, 'search_pages'],
    ],
  );
  t.same(c.calls, []);
  t.same(
    b.steps.map((s) => s.action),
    ['code', 'code', 'answer'],
  );
  t.same(
    b.steps.map((s) => s.finishReason),
    ['stop_string', 'stop_string', 'stop_string'],
  );
  t.ok(b.steps[0].envTokens > 0);
  t.equal(b.steps[2].envTokens, 0);
  t.match(b.steps[0].program, { error: null, timed_out: false });
  t.same(b.record.messages, b.messages);
  t.ok(stats.generateMs >= 0 && stats.toolMs >= 0 && b.timings.generateMs >= a.timings.generateMs);
});

t.test('max turns: a last turn without an answer ends the episode with none', async (t) => {
  const scripts: Script[] = [
    { key: 'QD: never answers', turns: ['<python>\nprint(1)\n</python>', '<python>\nprint(2)\n</python>', 'unused'] },
  ];
  const exec = new FakeExecutor();
  const gen = new ScriptedGenerator(scripts);
  const { episodes } = await runner(gen, exec, { maxTurns: 2 }).run([{ question: scripts[0].key }]);
  const [e] = episodes;
  t.match(e, { answer: null, finish: 'max_turns', turns: 2, temperature: 1 });
  t.same(exec.programs, ['print(1)'], "the last turn's program does not run");
  t.same(
    gen.calls.map((x) => x.rows),
    [1, 1],
  );
  // the notice came before turn 2, and nothing after it
  t.same(
    e.messages.map((m) => m.role),
    ['system', 'user', 'assistant', 'user', 'user', 'assistant'],
  );
  t.equal(e.segments[e.segments.length - 1].source, 'model');
  checkEpisode(t, e);

  // maxTurns 1: no notice at all (as the reference: not on the first turn)
  const gen1 = new ScriptedGenerator([{ key: 'QE: one turn', turns: ['<python>\nprint(1)\n</python>'] }]);
  const [one] = (await runner(gen1, new FakeExecutor(), { maxTurns: 1 }).run([{ question: 'QE: one turn' }])).episodes;
  t.match(one, { finish: 'max_turns', answer: null, turns: 1 });
  t.equal(one.messages.length, 3);
});

t.test('an answer inside code: the stop string inside the program resumes generation', async (t) => {
  const program = '<python>\nprint("<answer>x</answer>")\nprint("done")\n</python>';
  const scripts: Script[] = [
    { key: 'QF: tricky', turns: [program, '<answer>y</answer>'] },
    { key: 'QG: plain', turns: ['<answer>z</answer>'] },
  ];
  const gen = new ScriptedGenerator(scripts);
  const exec = new FakeExecutor();
  const { episodes, stats } = await runner(gen, exec).run([{ question: 'QF: tricky' }, { question: 'QG: plain' }]);
  const [f, g] = episodes;
  // turn 1: both rows; resume: only F (stopped at </answer> inside <python>); turn 2: F
  t.same(stats.rowsPerCall, [2, 1, 1]);
  t.same(gen.calls[1].keys, ['QF: tricky']);
  t.equal(f.steps[0].resumes, 1);
  t.equal(f.steps[0].action, 'code');
  t.same(exec.programs, ['print("<answer>x</answer>")\nprint("done")']);
  t.match(f, { answer: 'y', finish: 'answer', turns: 2 });
  t.match(g, { answer: 'z', turns: 1 });
  t.equal(tok.decode(maskedIds(f, 1)), program + '<answer>y</answer>');
  checkEpisode(t, f);
});

t.test('text after the action is dropped at a token boundary (generator ignoring stop strings)', async (t) => {
  const turn1 = '<python>\nprint(1)\n</python>';
  const scripts: Script[] = [
    {
      key: 'QH: chatty',
      turns: [turn1 + '\n<python_output>\n1\n</python_output>\nSo the answer', '<answer>Paris</answer> I hope this helps!' + IM_END],
    },
  ];
  const gen = new ScriptedGenerator(scripts, false);
  const { episodes } = await runner(gen, new FakeExecutor()).run([{ question: 'QH: chatty' }]);
  const [e] = episodes;
  t.match(e, { answer: 'Paris', finish: 'answer', turns: 2 });
  // kept: a prefix of the sampled tokens, through the token that closes the action (that token may
  // carry a little text past the tag, e.g. `>\n`)
  const keptText = (turn: string, action: string) => {
    const ids = tok.encode(turn);
    for (let k = 1; k <= ids.length; k++) if (tok.decode(ids.slice(0, k)).startsWith(action)) return tok.decode(ids.slice(0, k));
    throw new Error('action not in turn');
  };
  const kept1 = keptText(scripts[0].turns[0] as string, turn1);
  const kept2 = keptText(scripts[0].turns[1] as string, '<answer>Paris</answer>');
  t.ok(kept1.startsWith(turn1) && kept1.length - turn1.length <= 2);
  t.equal(tok.decode(maskedIds(e, 1)), kept1 + kept2);
  t.ok(e.steps[0].droppedTokens > 0);
  t.ok(e.steps[1].droppedTokens > 0);
  t.equal(e.steps[0].generatedTokens, tok.encode(turn1).length);
  t.equal(e.steps[0].finishReason, 'stop_string');
  t.equal(e.messages[2].content, kept1);
  checkEpisode(t, e);
  // tokensThrough: smallest prefix covering the text
  const ids = tok.encode('<answer>Paris</answer> tail');
  const text = tok.decode(ids);
  const k = tokensThrough(tok, ids, text, '<answer>Paris</answer>'.length);
  t.equal(tok.decode(ids.slice(0, k)), '<answer>Paris</answer>');
  t.equal(tokensThrough(tok, ids, text, text.length), ids.length);
});

t.test('generated ids are kept exactly as generated, never re-tokenized', async (t) => {
  // a non-canonical tokenization: one token per character
  const text = '<answer>Paris</answer>';
  const odd = [...text].flatMap((ch) => tok.encode(ch));
  t.not(odd.length, tok.encode(text).length);
  const gen = new ScriptedGenerator([{ key: 'QI: odd', turns: [{ tokens: odd }] }]);
  const [e] = (await runner(gen, new FakeExecutor()).run([{ question: 'QI: odd' }])).episodes;
  t.same(maskedIds(e, 1), odd);
  t.equal(e.answer, 'Paris');
  checkEpisode(t, e);
});

t.test('no action, unclosed code at the token limit, empty code: feedback, then the episode goes on', async (t) => {
  const long = '<python>\n' + Array.from({ length: 60 }, (_, i) => `x${i} = search_pages("query number ${i}")`).join('\n');
  const scripts: Script[] = [
    { key: 'QJ: rambles', turns: ['I think it is Paris.' + IM_END, '<answer>Paris</answer>'] },
    { key: 'QK: long program', turns: [long, '<python>\n   \n</python>', '<answer>?</answer>'] },
  ];
  const gen = new ScriptedGenerator(scripts);
  const exec = new FakeExecutor();
  const { episodes } = await runner(gen, exec, { maxNewTokens: 64 }).run([{ question: 'QJ: rambles' }, { question: 'QK: long program' }]);
  const [j, k] = episodes;
  t.match(j, { answer: 'Paris', finish: 'answer', turns: 2 });
  t.match(j.steps[0], { action: 'none', reason: 'no_action', finishReason: 'stop_token' });
  t.match(j.messages[3], { role: 'user', content: /no <python> code and no <answer>/ });
  // the generated <|im_end|> is kept in the ids and not repeated by the glue
  t.equal(j.messages[2].content, 'I think it is Paris.');
  t.equal(j.segments[2].text.startsWith(IM_END), false);
  t.match(k, { answer: '?', finish: 'answer', turns: 3 });
  t.match(k.steps[0], { action: 'none', reason: 'unclosed', open: 'python', finishReason: 'length', generatedTokens: 64 });
  t.match(k.messages[3].content, /not closed with <\/python> \(the reply reached the limit of 64 tokens\)/);
  t.match(k.steps[1], { action: 'none', reason: 'empty_code' });
  t.equal(k.messages[6].content, finalTurnNotice());
  t.same(exec.programs, [], 'nothing ran');
  for (const e of episodes) checkEpisode(t, e);
});

t.test('the context limit ends episodes cleanly', async (t) => {
  const scripts: Script[] = [{ key: 'QL: ctx', turns: ['<python>\nprint(1)\n</python>', '<answer>a</answer>'] }];
  const promptLen = tok.encode(formatter.prompt(codeProtocol({ executor: new FakeExecutor() }).initialMessages('QL: ctx', 3))).length;
  const gen1Len = tok.encode(scripts[0].turns[0] as string).length;

  // the generation reaches the limit
  const g1 = new ScriptedGenerator(scripts);
  const [e1] = (await runner(g1, new FakeExecutor(), { maxTotalTokens: promptLen + 5 }).run([{ question: 'QL: ctx' }])).episodes;
  t.match(e1, { finish: 'context', answer: null, turns: 1 });
  t.equal(e1.ids.length, promptLen + 5);
  t.equal(g1.calls[0].maxNewTokens, 5);
  checkEpisode(t, e1);

  // the program's output would not fit (with room to generate after it)
  const g2 = new ScriptedGenerator(scripts);
  const exec = new FakeExecutor();
  const [e2] = (await runner(g2, exec, { maxTotalTokens: promptLen + gen1Len + 10 }).run([{ question: 'QL: ctx' }])).episodes;
  t.match(e2, { finish: 'context', answer: null, turns: 1 });
  t.equal(e2.ids.length, promptLen + gen1Len);
  t.equal(exec.programs.length, 1);
  t.equal(e2.calls.length, 1, 'the call it made is still recorded');
  t.equal(e2.messages.length, 3, 'the observation that did not fit is not in the conversation');

  // the prompt alone is too long: no generation at all
  const g3 = new ScriptedGenerator(scripts);
  const [e3] = (await runner(g3, new FakeExecutor(), { maxTotalTokens: promptLen }).run([{ question: 'QL: ctx' }])).episodes;
  t.match(e3, { finish: 'context', turns: 0, answer: null });
  t.equal(g3.calls.length, 0);

  // a batch where one row has less room: its output is cut at its own limit
  const scripts4: Script[] = [
    { key: 'QM: short', turns: ['<answer>' + 'word '.repeat(40) + '</answer>'] },
    { key: 'QN: a much longer question that takes more tokens of the prompt', turns: ['<answer>' + 'word '.repeat(40) + '</answer>'] },
  ];
  const g4 = new ScriptedGenerator(scripts4);
  const lens = scripts4.map(
    (s) => tok.encode(formatter.prompt(codeProtocol({ executor: new FakeExecutor() }).initialMessages(s.key, 3))).length,
  );
  const limit = Math.max(...lens) + 20;
  const eps = (await runner(g4, new FakeExecutor(), { maxTotalTokens: limit }).run(scripts4.map((s) => ({ question: s.key })))).episodes;
  t.same(
    eps.map((e) => e.ids.length),
    [limit, limit],
  );
  t.same(
    eps.map((e) => e.finish),
    ['context', 'context'],
  );
  for (const e of eps) checkEpisode(t, e);
});

t.test('program errors come back with the printed output', async (t) => {
  const scripts: Script[] = [
    { key: 'QO: err', turns: ['<python>\nprint("before the error")\nraise ValueError("boom")\n</python>', '<answer>x</answer>'] },
  ];
  const [e] = (await runner(new ScriptedGenerator(scripts), new FakeExecutor()).run([{ question: 'QO: err' }])).episodes;
  t.equal(e.messages[3].content, '<python_output>\nbefore the error\nError: ValueError: boom\n</python_output>');
  t.match(e.steps[0].program, { error: 'ValueError: boom' });
});

t.test('environment replies as tool messages', async (t) => {
  const scripts: Script[] = [{ key: 'QP: tool role', turns: ['<python>\nprint(1)\n</python>', '<answer>1</answer>'] }];
  const r = runner(new ScriptedGenerator(scripts), new FakeExecutor(), {
    protocol: codeProtocol({ executor: new FakeExecutor(), envRole: 'tool' }),
  });
  const [e] = (await r.run([{ question: 'QP: tool role' }])).episodes;
  t.equal(e.messages[3].role, 'tool');
  t.equal(tok.decode(e.ids) + `${IM_END}\n`, formatter.render(e.messages));
  checkEpisode(t, e);
});

t.test("protocol.questionVariable: each episode's programs get their own question as a global", async (t) => {
  const seen: Array<{ code: string; globals?: Record<string, unknown> }> = [];
  const exec: CodeExecutor = {
    async run(code, opts) {
      seen.push({ code, globals: opts?.globals });
      return { stdout: `${String(opts?.globals?.question)}\n`, error: null, timed_out: false, calls: [], truncated: false, duration_ms: 1 };
    },
  };
  const scripts: Script[] = [
    { key: 'QV: first?', turns: ['<python>\nprint(question)\n</python>', '<answer>a</answer>'] },
    { key: 'QV: second?', turns: ['<python>\nprint(question)\n</python>', '<answer>b</answer>'] },
  ];
  const protocol = codeProtocol({ executor: exec, questionVariable: 'question' });
  const r = runner(new ScriptedGenerator(scripts), exec, { protocol });
  const { episodes } = await r.run([{ question: 'QV: first?' }, { question: 'QV: second?' }]);
  t.same(
    seen.map((x) => x.globals).sort((a, b) => String(a?.question).localeCompare(String(b?.question))),
    [{ question: 'QV: first?' }, { question: 'QV: second?' }],
  );
  for (const e of episodes)
    t.equal(e.messages[3].content, `<python_output>\n${e.question}\n\n</python_output>`, "the output is the episode's own question");
  t.match(episodes[0].messages[0].content, /The question is also in the variable question/);
  // Without the option no globals are passed, and a bad name is refused.
  const plain: Array<unknown> = [];
  await codeProtocol({ executor: { run: async (_c, o) => (plain.push(o), { stdout: '', error: null, timed_out: false }) } }).respond(
    { kind: 'code', code: 'x', end: 0 },
    { turn: 1, maxTurns: 2, finishReason: 'stop_string', maxNewTokens: 9, question: 'q' },
  );
  t.same(plain, [undefined]);
  t.throws(() => codeProtocol({ executor: exec, questionVariable: 'the question' }), { code: 'ARGUMENT_INVALID' });
  await t.rejects(
    protocol.respond({ kind: 'code', code: 'x', end: 0 }, { turn: 1, maxTurns: 2, finishReason: 'stop_string', maxNewTokens: 9 }),
    { code: 'PROTOCOL_ERROR' },
  );
});

t.test('protocol.finalAnswer: a program that calls final_answer() ends its episode with that answer', async (t) => {
  const seen: unknown[] = [];
  const exec: CodeExecutor = {
    async run(code, opts) {
      seen.push(opts);
      const answer = /final_answer\("(.*)"\)/.exec(code)?.[1];
      return {
        stdout: 'printed\n',
        error: null,
        timed_out: false,
        calls: [],
        truncated: false,
        duration_ms: 1,
        ...(answer !== undefined ? { final_answer: ` ${answer} ` } : {}),
      };
    },
  };
  const scripts: Script[] = [
    { key: 'QF: answers in code', turns: ['<python>\nfinal_answer("Oslo")\n</python>'] },
    {
      key: 'QF: prints first',
      turns: ['<python>\nprint(1)\n</python>', '<python>\nfinal_answer("Bergen")\n</python>', '<answer>unused</answer>'],
    },
  ];
  const protocol = codeProtocol({ executor: exec, finalAnswer: true });
  const { episodes } = await runner(new ScriptedGenerator(scripts), exec, { protocol }).run([
    { question: 'QF: answers in code' },
    { question: 'QF: prints first' },
  ]);
  t.same(
    episodes.map((e) => [e.answer, e.finish, e.turns]),
    [
      ['Oslo', 'answer', 1],
      ['Bergen', 'answer', 2],
    ],
  );
  t.same(
    episodes[0].messages.map((m) => m.role),
    ['system', 'user', 'assistant'],
    'nothing appended after the answering program',
  );
  t.equal(episodes[0].segments[episodes[0].segments.length - 1].source, 'model', "the sequence ends with the model's turn");
  t.match(episodes[1].messages[3].content, /printed/, 'a program without final_answer() gets its output back');
  t.ok(seen.every((o) => (o as { finalAnswer?: boolean }).finalAnswer === true));
  t.match(episodes[0].messages[0].content, /final_answer\(answer\) ends the program/, 'the default system prompt says so');
  for (const e of episodes) checkEpisode(t, e);
  // Without the option a program's final_answer text is not an answer.
  const plain = await runner(
    new ScriptedGenerator([{ key: 'QF: off', turns: ['<python>\nfinal_answer("Oslo")\n</python>', '<answer>tagged</answer>'] }]),
    exec,
  ).run([{ question: 'QF: off' }]);
  t.same([plain.episodes[0].answer, plain.episodes[0].turns], ['tagged', 2]);
});

t.test('tags episodes (Search-R1): passages appended inline, masked out', async (t) => {
  const scripts: Script[] = [
    {
      key: 'Question: who designed the Eiffel Tower?',
      turns: [
        '<think>I should search.</think>\n<search> Eiffel Tower designer </search>',
        '<think>Found it.</think>\n<answer> Gustave Eiffel </answer>',
      ],
    },
    { key: 'Question: capital of Japan?', turns: ['<think>I know this.</think>\n<answer>Tokyo</answer>'] },
  ];
  const passages = [
    { page_id: 'eiffel', title: 'Eiffel Tower', text: 'The tower was designed by the company of Gustave Eiffel.', score: 2 },
    { page_id: 'gustave', title: 'Gustave Eiffel', text: 'A French civil engineer.', score: 1 },
  ];
  const queries: string[] = [];
  const protocol = tagsProtocol({
    search: { searchPassages: (q: string, k?: number) => (queries.push(q), passages.slice(0, k)) },
    topK: 2,
  });
  const gen = new ScriptedGenerator(scripts);
  const r = new EpisodeRunner({
    generator: gen,
    tokenizer: tok,
    formatter,
    protocol,
    maxTurns: 4,
    maxNewTokens: 200,
    maxTotalTokens: 4096,
    temperature: 0.5,
  });
  const { episodes } = await r.run([{ question: 'who designed the Eiffel Tower?' }, { question: 'capital of Japan?' }]);
  const [a, b] = episodes;
  t.same(gen.calls[0].stopStrings, ['</search>', '</answer>']);
  t.same(
    gen.calls.map((c) => c.rows),
    [2, 1],
  );
  t.match(a, { answer: 'Gustave Eiffel', finish: 'answer', turns: 2, temperature: 0.5 });
  t.match(b, { answer: 'Tokyo', turns: 1 });
  t.same(queries, ['Eiffel Tower designer']);
  t.same(
    a.calls.map((c) => [c.turn, c.name, c.args, c.ok, c.results]),
    [[1, 'search', ['Eiffel Tower designer'], true, 2]],
  );
  // the information block sits inside the assistant turn, with no chat-template glue, mask 0
  const info = formatInformation(passages);
  t.same(
    a.segments.filter((s) => s.source === 'env').map((s) => s.text),
    [info],
  );
  t.equal(tok.decode(maskedIds(a, 1)), scripts[0].turns.join(''));
  t.equal(tok.decode(a.ids.subarray(a.promptTokens)), scripts[0].turns[0] + info + scripts[0].turns[1]);
  t.same(
    a.messages.map((m) => m.role),
    ['user', 'assistant'],
  );
  t.equal(a.messages[1].content, scripts[0].turns[0] + info + scripts[0].turns[1]);
  t.match(a.messages[0].content, /Question: who designed the Eiffel Tower\?\n$/);
  for (const e of episodes) checkEpisode(t, e);
});

t.test('tags: a search on the last turn is not run; max turns ends the episode', async (t) => {
  const scripts: Script[] = [{ key: 'Question: loops', turns: ['<search>a</search>', 'no action here', '<search>c</search>'] }];
  const queries: string[] = [];
  const protocol = tagsProtocol({ search: { searchPassages: (q: string) => (queries.push(q), [{ title: 'T', text: 'x' }]) } });
  // maxTurns 2 (was 3 when maxTurns counted generations): the tags protocol counts as Search-R1's
  // max_turns does, 2 turns with a reply (the search, the invalid-action note) and then a last one.
  const r = new EpisodeRunner({
    generator: new ScriptedGenerator(scripts),
    tokenizer: tok,
    formatter,
    protocol,
    maxTurns: 2,
    maxNewTokens: 50,
    maxTotalTokens: 4096,
  });
  const [e] = (await r.run([{ question: 'loops' }])).episodes;
  t.match(e, { finish: 'max_turns', answer: null, turns: 3 });
  t.same(queries, ['a']);
  t.match(e.segments[4].text, /My previous action is invalid/);
  checkEpisode(t, e);
});

t.test("tags: max_turns counts searches as Search-R1's (N searches, then one last generation without results)", async (t) => {
  const passages = [{ title: 'T', text: 'passage text' }];
  for (const n of [1, 2, 3]) {
    // a model that always searches: turn i asks "query i"
    const key = `Question: always searches ${n}`;
    const scripts: Script[] = [
      { key, turns: Array.from({ length: n + 1 }, (_, i) => `<think>step ${i + 1}</think>\n<search> query ${i + 1} </search>`) },
    ];
    const queries: string[] = [];
    const gen = new ScriptedGenerator(scripts);
    const protocol = tagsProtocol({ search: { searchPassages: (q: string) => (queries.push(q), passages) } });
    const r = new EpisodeRunner({
      generator: gen,
      tokenizer: tok,
      formatter,
      protocol,
      maxTurns: n,
      maxNewTokens: 50,
      maxTotalTokens: 4096,
    });
    const [e] = (await r.run([{ question: `always searches ${n}` }])).episodes;
    t.equal(queries.length, n, `max_turns ${n}: ${n} searches`);
    t.same(
      queries,
      Array.from({ length: n }, (_, i) => `query ${i + 1}`),
    );
    t.equal(gen.calls.length, n + 1, `max_turns ${n}: ${n + 1} generations`);
    t.match(e, { finish: 'max_turns', answer: null, turns: n + 1 });
    t.same(
      e.segments.map((x) => x.source),
      ['prompt', ...Array.from({ length: n }, () => ['model', 'env']).flat(), 'model'],
      'model/env alternate; the last generation gets no reply',
    );
    t.ok(e.segments.filter((x) => x.source === 'env').every((x) => x.text === formatInformation(passages)));
    const last = e.messages[e.messages.length - 1].content;
    t.ok(last.endsWith(`<search> query ${n + 1} </search>`), 'the last generation ends the sequence: no <information> after it');
    t.equal(last.split('<information>').length - 1, n);
    t.same(
      e.steps.map((x) => x.envTokens > 0),
      [...new Array(n).fill(true), false],
    );
    checkEpisode(t, e);
  }
  // turnsCount: generations gives the old meaning (N generations, N - 1 searches); the code protocol counts generations
  const queries: string[] = [];
  const key = 'Question: counted as generations';
  const gen = new ScriptedGenerator([{ key, turns: ['<search>a</search>', '<search>b</search>', '<search>c</search>'] }]);
  const protocol = tagsProtocol({ search: { searchPassages: (q: string) => (queries.push(q), passages) }, turnsCount: 'generations' });
  const [g] = (
    await new EpisodeRunner({
      generator: gen,
      tokenizer: tok,
      formatter,
      protocol,
      maxTurns: 3,
      maxNewTokens: 50,
      maxTotalTokens: 4096,
    }).run([{ question: 'counted as generations' }])
  ).episodes;
  t.same([queries, g.turns, gen.calls.length, g.finish], [['a', 'b'], 3, 3, 'max_turns']);
  t.equal(codeProtocol({ executor: new FakeExecutor() }).turnsCount, undefined, 'code: generations');
  // an answer before the limit ends the episode as before
  const early = new ScriptedGenerator([{ key: 'Question: early', turns: ['<search>x</search>', '<answer>y</answer>'] }]);
  const [a] = (
    await new EpisodeRunner({
      generator: early,
      tokenizer: tok,
      formatter,
      protocol: tagsProtocol({ search: { searchPassages: () => passages } }),
      maxTurns: 3,
      maxNewTokens: 50,
      maxTotalTokens: 4096,
    }).run([{ question: 'early' }])
  ).episodes;
  t.match(a, { finish: 'answer', answer: 'y', turns: 2 });
});

t.test("tags: an episode starts from the question row's own chat prompt, rendered with the chat template", async (t) => {
  const prompt = [
    { role: 'user' as const, content: 'Answer the given question, as my data file says. Question: who painted the Mona Lisa?\n' },
  ];
  const gen = new ScriptedGenerator([
    { key: 'as my data file says', turns: ['<answer> Leonardo </answer>'] },
    { key: 'Question: who painted the Night Watch?', turns: ['<answer> Rembrandt </answer>'] },
  ]);
  const protocol = tagsProtocol({ search: { searchPassages: () => [] } });
  const r = new EpisodeRunner({ generator: gen, tokenizer: tok, formatter, protocol, maxTurns: 2, maxNewTokens: 50, maxTotalTokens: 4096 });
  const [a, b] = (await r.run([{ question: 'who painted the Mona Lisa?', prompt }, { question: 'who painted the Night Watch?' }])).episodes;
  t.equal(
    tok.decode(a.ids.subarray(0, a.promptTokens)),
    formatter.prompt(prompt),
    "the prompt is the row's messages through the chat template (add_generation_prompt)",
  );
  t.same(Array.from(a.ids.subarray(0, a.promptTokens)), tok.encode(formatter.prompt(prompt)));
  t.same(a.messages.slice(0, 1), prompt);
  t.same(a.record.messages[0], prompt[0]);
  t.match(a, { question: 'who painted the Mona Lisa?', answer: 'Leonardo' });
  // a row without a prompt keeps the protocol's instruction
  t.same(b.messages[0], protocol.initialMessages('who painted the Night Watch?', 3)[0]);
  t.equal(b.answer, 'Rembrandt');
  // the code protocol ignores a row's prompt (it has its own system prompt and question message)
  const code = codeProtocol({ executor: new FakeExecutor() });
  t.same(code.initialMessages('q', 2, prompt), code.initialMessages('q', 2));
  await t.rejects(r.run([{ question: 'q', prompt: 'not messages' as never }]), {
    code: 'ARGUMENT_INVALID',
    message: /list of chat messages/,
  });
});

t.test('argument checks', async (t) => {
  const gen = new ScriptedGenerator([]);
  t.throws(
    () =>
      new EpisodeRunner({
        generator: gen,
        tokenizer: tok,
        formatter,
        protocol: codeProtocol({ executor: new FakeExecutor() }),
        maxTurns: 0,
        maxNewTokens: 1,
        maxTotalTokens: 10,
      }),
    {
      code: 'ARGUMENT_INVALID',
      message: /maxTurns/,
    },
  );
  t.throws(() => codeProtocol({} as never), { code: 'ARGUMENT_INVALID' });
  await t.rejects(runner(gen, new FakeExecutor()).run([{ question: 'q', temperature: -1 }]), { code: 'ARGUMENT_INVALID' });
  const broken: TextGenerator = { generate: async () => ({ tokens: [], logprobs: [], finishReasons: [] }) };
  await t.rejects(runner(broken, new FakeExecutor()).run([{ question: 'q' }]), { code: 'PROTOCOL_ERROR' });
  t.same((await runner(gen, new FakeExecutor()).run([])).episodes, []);
});

t.test('integration: the real Python sandbox', async (t) => {
  const tools: SearchTools = {
    search_pages: (q) => [{ page_id: 'kate_box', title: `Kate Box (${q})`, similarity: 0.9 }],
    view_sections: () => [{ section_id: 'kate_box:career', section_name: 'Career' }],
    read_section: (s) => (s === 'kate_box:career' ? 'In 2003, Box graduated from NIDA.' : 'whole page'),
  };
  let sandbox: Awaited<ReturnType<typeof createSandbox>>;
  try {
    sandbox = await createSandbox({ kind: 'python', tools, size: 2, allowWeakIsolation: true, timeoutMs: 10_000 });
  } catch (e) {
    t.comment(`no Python sandbox here: ${(e as Error).message}`);
    t.fail('the Python sandbox must start on a machine with python3');
    return;
  }
  t.teardown(() => sandbox.close());
  const scripts: Script[] = [
    {
      key: 'QS: where did Kate Box study?',
      turns: [
        '<python>\nhits = search_pages("Kate Box")\nprint(hits[0]["title"])\nprint(read_section(view_sections(hits[0]["page_id"])[0]["section_id"]))\n</python>',
        '<answer>NIDA</answer>',
      ],
    },
    { key: 'QT: broken program', turns: ['<python>\nprint("partial")\nprint(undefined_name)\n</python>', '<answer>?</answer>'] },
  ];
  const r = runner(new ScriptedGenerator(scripts), sandbox);
  const { episodes } = await r.run(scripts.map((s) => ({ question: s.key })));
  const [a, b] = episodes;
  t.equal(a.messages[3].content, '<python_output>\nKate Box (Kate Box)\nIn 2003, Box graduated from NIDA.\n\n</python_output>');
  t.same(
    a.calls.map((c) => [c.turn, c.name, c.args, c.ok]),
    [
      [1, 'search_pages', ['Kate Box'], true],
      [1, 'view_sections', ['kate_box'], true],
      [1, 'read_section', ['kate_box:career'], true],
    ],
  );
  t.equal(b.messages[3].content, "<python_output>\npartial\nError: NameError: name 'undefined_name' is not defined\n</python_output>");
  t.match(a, { answer: 'NIDA', finish: 'answer' });
  for (const e of episodes) checkEpisode(t, e);
});

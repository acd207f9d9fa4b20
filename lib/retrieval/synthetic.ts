/**
 * A deterministic fictional encyclopedia: invented towns, people, rivers, companies and festivals
 * with markdown sections, and questions whose answers are facts on one page. Rare by construction
 * (the names are made up, so no model has memorised them). Some questions name the page only by an
 * alias that appears in its content, never its title, to exercise content retrieval.
 */
import { normalizeId, type Page } from './corpus.js';
import { xorshift32 } from '../util/data.js';

export interface SyntheticQuestion {
  id: string;
  question: string;
  answer: string;
  page_id: string;
  /** true when the question shares no word with the page title. */
  by_alias: boolean;
  /** Which fact it asks for (the section that holds it: history, geography or economy). */
  kind: SyntheticQuestionKind;
  /** Which of the kind's phrasings (PHRASINGS) the question uses; 0 without `phrasings`. */
  phrasing: number;
}

export type SyntheticQuestionKind = 'founded' | 'founder' | 'river' | 'economy' | 'fair';

/**
 * Ways to ask for each fact: `t` is the town's title, `a` its alias (the fair questions name the town
 * only by its alias). Phrasing 0 is the one used without the `phrasings` option.
 */
export const PHRASINGS: Record<SyntheticQuestionKind, ReadonlyArray<(t: string, a: string) => string>> = {
  founded: [
    (t) => `In which year was ${t} founded?`,
    (t) => `When was ${t} founded?`,
    (t) => `What year did ${t} come into being?`,
    (t) => `${t} dates from which year?`,
  ],
  founder: [
    (t) => `Who founded ${t}?`,
    (t) => `Who was the founder of ${t}?`,
    (t) => `Which person established ${t}?`,
    (t) => `${t} owes its beginning to whom?`,
  ],
  river: [
    (t) => `On which river does ${t} lie?`,
    (t) => `Which river flows through ${t}?`,
    (t) => `Name the stream that runs past ${t}.`,
    (t) => `${t} sits beside which water?`,
  ],
  economy: [
    (t) => `What does the economy of ${t} rest on?`,
    (t) => `What is the main trade of ${t}?`,
    (t) => `How does ${t} earn its living?`,
    (t) => `${t} lives by which industry?`,
  ],
  fair: [
    (_t, a) => `Which fair is held every spring in the town chronicles call ${a}?`,
    (_t, a) => `What fair does the town once known as ${a} hold each spring?`,
    (_t, a) => `Name the spring festival of the place old records call ${a}.`,
    (_t, a) => `${a[0].toUpperCase() + a.slice(1)} celebrates which yearly event?`,
  ],
};

const SYL = [
  'var',
  'nol',
  'quil',
  'mere',
  'ost',
  'ra',
  'bel',
  'dun',
  'kar',
  'vell',
  'tor',
  'sin',
  'ash',
  'gro',
  'mir',
  'fen',
  'lod',
  'pra',
  'zeb',
  'hal',
  'ith',
  'cor',
  'wyn',
  'ul',
  'dre',
  'syl',
  'bar',
  'tam',
  'eck',
  'orn',
];
const FIRST = [
  'Aldric',
  'Berin',
  'Calla',
  'Doran',
  'Elsabet',
  'Faro',
  'Gwenna',
  'Hollis',
  'Isolde',
  'Jorund',
  'Kestra',
  'Lovan',
  'Maren',
  'Nils',
  'Orla',
  'Perrin',
  'Quenby',
  'Rosalind',
  'Sten',
  'Tamsin',
];
const TRADES = ['copper', 'salt', 'wool', 'glass', 'timber', 'amber', 'paper', 'clocks', 'ink', 'rope'];
const REGIONS = ['the Harrowmarch', 'the Lowen Vale', 'the Sorrel Coast', 'the Upper Fenn', 'the Drammic Hills', 'the Kelt Plateau'];

/**
 * `pages` pages with five questions each (one per kind). With `phrasings`, each question uses one of
 * its kind's PHRASINGS, drawn from a second generator: the pages and answers stay those of the same
 * seed without it.
 */
export function syntheticCorpus(opts: { pages: number; seed?: number; paragraphs?: number; phrasings?: boolean } = { pages: 100 }): {
  pages: Page[];
  questions: SyntheticQuestion[];
} {
  const r = xorshift32(((opts.seed ?? 1) * 2654435761) >>> 0 || 1);
  const rp = xorshift32((((opts.seed ?? 1) * 2246822519) ^ 0x9e3779b9) >>> 0 || 1);
  const pick = <T>(xs: T[]) => xs[Math.floor(r() * xs.length)];
  const used = new Set<string>();
  // Unique names; when the short names run out (30^2 = 900 two-syllable ones), use one more syllable.
  const name = (parts: number) => {
    for (let tries = 0; ; tries++) {
      let n = '';
      for (let i = 0; i < parts + Math.floor(tries / 20); i++) n += pick(SYL);
      n = n[0].toUpperCase() + n.slice(1);
      if (!used.has(n)) {
        used.add(n);
        return n;
      }
    }
  };
  const pages: Page[] = [];
  const questions: SyntheticQuestion[] = [];
  const filler = (subject: string, n: number) =>
    Array.from(
      { length: n },
      () =>
        `Records kept in ${pick(REGIONS)} describe ${subject} in letters, ledgers and travellers' accounts, most of them written in the ${pick(['old', 'plain', 'court', 'river'])} script.`,
    ).join(' ');
  for (let i = 0; i < opts.pages; i++) {
    const town = name(3);
    const title = `${town}`;
    const id = normalizeId(title);
    const founder = `${pick(FIRST)} ${name(2)}`;
    const year = 1100 + Math.floor(r() * 800);
    const river = `${name(2)} River`;
    const trade = pick(TRADES);
    const alias = `the ${pick(['Grey', 'Silent', 'Painted', 'Lantern', 'Hollow', 'Copper', 'Seventh'])} ${pick(['Harbour', 'Crossing', 'Market', 'Gate', 'Ford', 'Bell'])} of ${name(2)}`;
    const population = 1000 + Math.floor(r() * 90000);
    const festival = `${name(2)} Fair`;
    const extra = opts.paragraphs ?? 1;
    const content = [
      `${title} is a town in ${pick(REGIONS)}, known in old chronicles as ${alias}. ${filler(title, extra)}`,
      `## History`,
      `${title} was founded in ${year} by ${founder}, a ${pick(['merchant', 'surveyor', 'abbess', 'soldier', 'weaver'])}. ${filler('its founding', extra)}`,
      `## Geography`,
      `The town lies on the ${river}. Its population was ${population.toLocaleString('en-US')} at the last count. ${filler('the valley', extra)}`,
      `## Economy`,
      `The economy of ${title} rests on ${trade}. Every spring the town holds the ${festival}. ${filler('the markets', extra)}`,
    ].join('\n\n');
    pages.push({ id, title, content });
    const q = (kind: SyntheticQuestionKind, answer: string, by_alias: boolean) => {
      const phrasing = opts.phrasings ? Math.floor(rp() * PHRASINGS[kind].length) : 0;
      questions.push({
        id: `${id}-${questions.length}`,
        question: PHRASINGS[kind][phrasing](title, alias),
        answer,
        page_id: id,
        by_alias,
        kind,
        phrasing,
      });
    };
    q('founded', String(year), false);
    q('founder', founder, false);
    q('river', river, false);
    q('economy', trade, false);
    q('fair', festival, true);
  }
  return { pages, questions };
}

/**
 * A corpus of markdown pages `{id, title, content}` (the shape of the public rare-wiki-pages
 * dataset), loaded from JSONL, JSON or Parquet, split into sections by markdown headings.
 * Section ids are `page_id:normalized_heading` (lowercase, every non-alphanumeric character -> `_`,
 * trimmed of `_`, as the reference's ids); text before the first heading is the `introduction`
 * section; `page_id:full` is the whole page; repeated headings get `_2`, `_3`.
 */
import { readFileSync } from 'node:fs';
import { extname } from 'node:path';
import { SlmError, closest, describe } from '../errors.js';
import type { SectionRef } from './types.js';
import { parseJsonLines } from '../util/data.js';
import { localDataFiles } from '../hub/download.js';
import { isHubRef } from '../hub/ref.js';

export interface Page {
  id: string;
  title: string;
  content: string;
}
export interface Section {
  id: string;
  name: string;
  text: string;
}

export function normalizeId(s: string): string {
  return s
    .toLowerCase()
    .replace(/[^\p{L}\p{N}]/gu, '_')
    .replace(/^_+|_+$/g, '');
}

function splitSections(page: Page): Section[] {
  const lines = page.content.split('\n');
  const out: Section[] = [];
  const seen = new Map<string, number>();
  let name = 'introduction';
  let buf: string[] = [];
  const flush = () => {
    const text = buf.join('\n').trim();
    if (text || name !== 'introduction') {
      let id = `${page.id}:${normalizeId(name) || 'section'}`;
      const n = (seen.get(id) ?? 0) + 1;
      seen.set(id, n);
      if (n > 1) id = `${id}_${n}`;
      out.push({ id, name, text });
    }
    buf = [];
  };
  for (const line of lines) {
    const m = /^(#{1,6})\s+(.+?)\s*#*\s*$/.exec(line);
    if (m) {
      flush();
      name = m[2];
    } else buf.push(line);
  }
  flush();
  return out;
}

/** Rows of a JSONL, JSON (array) or Parquet file, or of a hub dataset's data files (`hf:OWNER/NAME[:split]`, lib/hub). */
export async function readRows(file: string): Promise<unknown[]> {
  if (isHubRef(file)) {
    const rows: unknown[] = [];
    for (const f of await localDataFiles(file)) for (const r of await readRows(f)) rows.push(r);
    return rows;
  }
  const ext = extname(file).toLowerCase();
  if (ext === '.parquet') {
    const { asyncBufferFromFile, parquetReadObjects } = await import('hyparquet');
    try {
      return (await parquetReadObjects({ file: await asyncBufferFromFile(file) })) as unknown[];
    } catch (e) {
      throw new SlmError('CORPUS_INVALID', `${file} could not be read as Parquet: ${(e as Error).message}.`);
    }
  }
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch {
    throw new SlmError('FILE_NOT_FOUND', `corpus file ${file} cannot be read. Expected JSONL, JSON or Parquet rows {id, title, content}.`);
  }
  if (ext === '.json' || text.trimStart().startsWith('[')) {
    try {
      const v = JSON.parse(text);
      if (!Array.isArray(v)) throw new Error('not an array');
      return v;
    } catch (e) {
      throw new SlmError('CORPUS_INVALID', `${file}: expected a JSON array of {id, title, content} rows (${(e as Error).message}).`);
    }
  }
  return parseJsonLines(text, file, 'CORPUS_INVALID');
}

function validatePages(rows: unknown[], where: string): Page[] {
  const ids = new Set<string>();
  return rows.map((r, i) => {
    const o = r as Record<string, unknown>;
    const id = o?.id ?? o?.page_id;
    for (const [k, v] of [
      ['id', id],
      ['title', o?.title],
      ['content', o?.content],
    ] as const)
      if (typeof v !== 'string' && !(k === 'id' && typeof v === 'number'))
        throw new SlmError(
          'CORPUS_INVALID',
          `${where}: row ${i + 1} needs a string "${k}", found ${describe(v)}. Corpus rows are {id, title, content} with markdown content.`,
        );
    const sid = String(id);
    if (ids.has(sid)) throw new SlmError('CORPUS_INVALID', `${where}: row ${i + 1} repeats the id "${sid}"; page ids must be unique.`);
    ids.add(sid);
    return { id: sid, title: o.title as string, content: o.content as string };
  });
}

export class Corpus {
  readonly pages: Page[];
  private byId = new Map<string, { page: Page; sections: Section[] }>();
  private sectionById = new Map<string, Section>();

  constructor(pages: Page[]) {
    this.pages = pages;
    for (const p of pages) {
      const sections = splitSections(p);
      this.byId.set(p.id, { page: p, sections });
      for (const s of sections) this.sectionById.set(s.id, s);
    }
  }

  static async load(file: string): Promise<Corpus> {
    return new Corpus(validatePages(await readRows(file), file));
  }

  page(id: string): Page | undefined {
    return this.byId.get(id)?.page;
  }

  sections(pageId: string): Section[] {
    return this.byId.get(pageId)?.sections ?? [];
  }

  view_sections(pageId: string): SectionRef[] {
    const e = this.byId.get(String(pageId));
    if (!e) {
      const hint = closest(String(pageId), this.byId.keys(), 6);
      throw new SlmError(
        'NOT_FOUND',
        `page_id ${JSON.stringify(pageId)} does not exist.${hint ? ` Did you mean ${JSON.stringify(hint)}?` : ''} Use search_pages(query) to find page ids.`,
      );
    }
    return [
      ...e.sections.map((s) => ({ section_id: s.id, section_name: s.name })),
      { section_id: `${e.page.id}:full`, section_name: 'full page' },
    ];
  }

  read_section(sectionId: string): string {
    const id = String(sectionId);
    const s = this.sectionById.get(id);
    if (s) return s.text ? `## ${s.name}\n${s.text}` : `## ${s.name}\n(empty section)`;
    const colon = id.lastIndexOf(':');
    const pageId = colon >= 0 ? id.slice(0, colon) : id;
    const e = this.byId.get(pageId);
    if (e && id.endsWith(':full')) return `# ${e.page.title}\n${e.page.content}`;
    if (e) {
      const ids = e.sections.map((x) => x.id);
      const hint = closest(id, ids, 8);
      throw new SlmError(
        'NOT_FOUND',
        `section_id ${JSON.stringify(id)} does not exist.${hint ? ` Did you mean ${JSON.stringify(hint)}?` : ''} Sections of ${pageId}: ${ids.slice(0, 12).join(', ')}${ids.length > 12 ? ', ...' : ''}; or ${pageId}:full for the whole page.`,
      );
    }
    const hint = closest(pageId, this.byId.keys(), 6);
    throw new SlmError(
      'NOT_FOUND',
      `section_id ${JSON.stringify(id)}: no page ${JSON.stringify(pageId)}.${hint ? ` Did you mean ${JSON.stringify(`${hint}:full`)}?` : ''} Section ids look like "page_id:section"; get them with view_sections(page_id).`,
    );
  }
}

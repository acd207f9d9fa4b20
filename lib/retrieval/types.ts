/** The three search primitives an episode's program (or a `<search>` tag) can call. */
export interface PageHit {
  page_id: string;
  title: string;
  similarity: number;
}
export interface SectionRef {
  section_id: string;
  section_name: string;
}
export interface SearchTools {
  /** The best pages for a free-text query (10, or retrieval.k). */
  search_pages(query: string): Promise<PageHit[]> | PageHit[];
  /** The sections of a page; throws SlmError('NOT_FOUND'-like) with a recovery hint for unknown ids. */
  view_sections(pageId: string): Promise<SectionRef[]> | SectionRef[];
  /** The text of a section (`page_id:full` = the whole page). */
  read_section(sectionId: string): Promise<string> | string;
}

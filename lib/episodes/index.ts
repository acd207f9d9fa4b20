/** Episodes (DESIGN §1, §9): the `code` and `tags` protocols, their prompts, and the EpisodeRunner. */
export * from './blocks.js';
export * from './code.js';
export * from './tags.js';
export * from './prompts.js';
export * from './protocol.js';
export * from './runner.js';

//! The actor runtime: per-core executors, storage actors, the journal-writer actor, flushers
//! and the reader pool. It builds on the synchronous core in `src/` and is filled in by the
//! actor-runtime work; the core never imports this module.

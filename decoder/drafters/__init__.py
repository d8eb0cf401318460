"""Draft sources. Each emits `datastore.tree.DraftTree`s; the decoder merges them into one tree."""

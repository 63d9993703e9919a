"""The embedded vector index: Chroma collections, one per user (:mod:`.index`), kept in step across processes
(:mod:`.sync`) and erased without residue (:mod:`.erase`)."""

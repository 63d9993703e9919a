"""Entries: the store that writes, scopes and searches them (:mod:`.store`), their records (:mod:`.records`),
chat transcripts as memories (:mod:`.messages`), filters (:mod:`.filters`), lifecycle and history
(:mod:`.lifecycle`), knowledge versions (:mod:`.kb_versions`) and turn context vectors (:mod:`.context_vectors`)."""

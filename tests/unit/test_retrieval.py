"""Retrieval parts below the facade: per-user lexical index, turn context, score spreading, query embedding."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from agentmem import AgentMemory
from agentmem.backends.sqlite.catalog import SqliteCatalog, fts_query
from agentmem.backends.sqlite.lexical import lexical_table
from agentmem.ports.catalog import EntryRecord
from agentmem.entries.store import Scope
from agentmem.recall.retrieval import DENSE_WEIGHT, Candidates, fuse, session_boost, session_first_stage, spill_over
from agentmem.embed.minilm import MiniLMEmbedder


def _row(entry_id: str, user: str, text: str, *, session: str | None = None, at: float = 0.0,
         kind: str = "turn") -> EntryRecord:
    return EntryRecord(id=entry_id, user_id=user, session_id=session, kind=kind, text=text, memory_text=text,
                    created_at=at)


def _insert(cat: SqliteCatalog, rows: list[EntryRecord]) -> None:
    cat.insert(rows, index_texts=[r.text for r in rows])


def test_bm25_statistics_are_per_user(tmp_path: Path) -> None:
    cat = SqliteCatalog(str(tmp_path / "c.db"))
    _insert(cat, [_row("a1", "alice", "the kayak is red"), _row("a2", "alice", "we painted the fence"),
                  _row("a3", "alice", "a kayak trip to the lake")])
    before = cat.lexical_search("red kayak", user_id="alice", limit=10)
    # Another user writing "kayak" a thousand times must not make it a common word for alice.
    _insert(cat, [_row(f"b{i}", "bob", f"kayak kayak note {i}") for i in range(1000)])
    after = cat.lexical_search("red kayak", user_id="alice", limit=10)
    assert [i for i, _ in after] == [i for i, _ in before] == ["a1", "a3"]
    assert [s for _, s in after] == pytest.approx([s for _, s in before], abs=1e-9)
    assert {i for i, _ in cat.lexical_search("kayak", user_id="bob", limit=2000)} == {f"b{i}" for i in range(1000)}
    assert cat.lexical_search("kayak", user_id="carol", limit=10) == []  # no table, no error


def test_erasing_a_users_last_entry_drops_their_lexical_table(tmp_path: Path) -> None:
    cat = SqliteCatalog(str(tmp_path / "c.db"))
    _insert(cat, [_row("a1", "alice", "red kayak"), _row("a2", "alice", "blue kayak"), _row("b1", "bob", "kayak")])
    assert lexical_table("alice") in cat.lexical_tables()
    cat.delete(["a1"])
    assert [i for i, _ in cat.lexical_search("kayak", user_id="alice", limit=5)] == ["a2"]
    cat.delete(["a2"])
    assert lexical_table("alice") not in cat.lexical_tables()
    assert cat.lexical_search("kayak", user_id="alice", limit=5) == []
    assert [i for i, _ in cat.lexical_search("kayak", user_id="bob", limit=5)] == ["b1"]
    _insert(cat, [_row("a3", "alice", "green kayak")])  # writing again recreates it
    assert [i for i, _ in cat.lexical_search("kayak", user_id="alice", limit=5)] == ["a3"]


def test_a_table_dropped_by_another_process_is_noticed(tmp_path: Path) -> None:
    path = str(tmp_path / "c.db")
    one, two = SqliteCatalog(path), SqliteCatalog(path)
    _insert(one, [_row("a1", "alice", "red kayak")])
    assert [i for i, _ in two.lexical_search("kayak", user_id="alice", limit=5)] == ["a1"]
    one.delete(["a1"])  # drops alice's table under the other catalog
    assert two.lexical_search("kayak", user_id="alice", limit=5) == []
    _insert(two, [_row("a2", "alice", "kayak again")])
    assert [i for i, _ in one.lexical_search("kayak", user_id="alice", limit=5)] == ["a2"]


def test_turn_context_two_turns_each_side_within_the_session(tmp_path: Path) -> None:
    cat = SqliteCatalog(str(tmp_path / "c.db"))
    _insert(cat, [_row(f"t{i}", "u", f"turn {i}", session="s1", at=float(i)) for i in range(5)]
            + [_row("x", "u", "other session", session="s2", at=2.5),
               _row("k", "u", "a fact", session="s1", at=2.2, kind="knowledge"),
               _row("n", "u", "no session", at=1.0)])
    ctx = cat.turn_context(["t0", "t2", "t4", "x", "k", "n", "missing"])
    assert (ctx["t2"].session_id, ctx["t2"].before, ctx["t2"].after) == ("s1", ("t1", "t0"), ("t3", "t4"))
    assert (ctx["t0"].before, ctx["t0"].after) == ((), ("t1", "t2"))
    assert (ctx["t4"].before, ctx["t4"].after) == (("t3", "t2"), ())
    assert (ctx["x"].before, ctx["x"].after) == ((), ())  # alone in its session
    assert (ctx["k"].session_id, ctx["k"].before, ctx["k"].after) == ("s1", (), ())  # not a turn: no spreading
    assert ctx["n"].session_id is None and "missing" not in ctx


def test_spill_over_and_session_boost() -> None:
    class Place:
        def __init__(self, session: str, before: tuple[str, ...], after: tuple[str, ...]) -> None:
            self.session_id, self.before, self.after = session, before, after

    spread = spill_over({"b": 0.8, "z": 0.1}, {"b": Place("s", ("a",), ("c", "d"))}, share=0.25)
    assert spread == pytest.approx({"b": 0.8, "z": 0.1, "a": 0.2, "c": 0.2, "d": 0.05})
    boosted = session_boost(spread, {"a": "s", "b": "s", "c": "s", "d": "s", "z": None}, weight=0.5)
    assert boosted["b"] == pytest.approx(1.2) and boosted["d"] == pytest.approx(0.45)
    assert boosted["z"] == 0.1  # no session, no boost
    # the boost can reorder: a weak turn in a strong session overtakes a lone medium one
    assert session_boost({"x": 0.5, "y": 0.3, "w": 0.9}, {"x": None, "y": "s", "w": "s"})["y"] > 0.5


def test_session_first_stage_lifts_the_sessions_that_match_as_a_whole() -> None:
    # s1 has one strong turn, s2 many middling ones: the sum ranks s2 first, the max (session boost) would not
    scores = {"a": 0.9, "b": 0.4, "c": 0.4, "d": 0.4, "e": 0.1}
    sessions = {"a": "s1", "b": "s2", "c": "s2", "d": "s2", "e": "s3"}
    lifted = session_first_stage(scores, sessions, weight=1.0, top=1)
    assert lifted == pytest.approx({"a": 0.9, "b": 1.4, "c": 1.4, "d": 1.4, "e": 0.1})
    two = session_first_stage(scores, sessions, weight=1.0, top=2)
    assert two["a"] == pytest.approx(0.9 + (0.9 - 0.1) / (1.2 - 0.1)) and two["e"] == 0.1
    assert session_first_stage(scores, sessions, weight=0.0, top=2) == scores
    assert session_first_stage({"x": 0.3}, {"x": None}, weight=1.0, top=2) == {"x": 0.3}  # no session: unchanged


def test_fuse_keeps_score_margins() -> None:
    scores = fuse({"a": 0.9, "b": 0.85, "c": 0.5}, {"b": 12.0, "d": 3.0})
    assert max(scores, key=scores.get) == "b"
    # lexical only: the dense part is 0, not the pool minimum
    assert scores["d"] == pytest.approx((1 - DENSE_WEIGHT) * 3.0 / 12.0)
    assert fuse({}, {}) == {}


def test_blinded_queries_drop_stop_words_before_hashing() -> None:
    blinded = fts_query("what is the name of my dog", blind=lambda w: "h" + w)
    assert blinded == '"hname" OR "hdog"'


QUERIES = ["what did the dentist recommend?", "hi", "a long question about kayaks " * 120, "Lyon"]


@pytest.mark.parametrize("onnx", [True, False], ids=["onnxruntime", "torch"])
def test_query_embeddings_match_sentence_transformers(tmp_path: Path, onnx: bool) -> None:
    emb = MiniLMEmbedder(cache_dir=tmp_path, onnx_queries=onnx)
    reference = emb.model.encode(QUERIES, normalize_embeddings=True, convert_to_numpy=True)
    assert (emb._query_encoder() is not None) if onnx else True
    for n in (1, 2, 4):  # long inputs are truncated at the model's 256 tokens, as sentence-transformers does
        np.testing.assert_allclose(emb.encode(QUERIES[:n]), reference[:n], atol=1e-5)


def test_a_single_query_is_tokenised_as_transformers_does_and_embeds_to_the_same_vector(tmp_path: Path) -> None:
    # one text goes through the Rust tokenizer directly (it keeps the GIL: agentmem.embed.onnx_query); the ids,
    # the mask and so the vector are those of the transformers call, long queries truncated at 256 tokens too
    encoder = MiniLMEmbedder(cache_dir=tmp_path)._query_encoder()
    tokenizer = encoder._tokenizer
    for query in QUERIES + ["Où est passé le café ? 😀", "  spaces\tand\nnewlines  "]:
        reference = tokenizer([query], padding=True, truncation=True, max_length=encoder._max_length, return_tensors="np")
        single = encoder._single.encode(query)
        assert single.ids == reference["input_ids"][0].tolist()
        assert single.attention_mask == reference["attention_mask"][0].tolist()
        np.testing.assert_allclose(encoder.encode([query])[0], encoder.encode([query, "x"])[0], atol=1e-6)
    tokenizer(["a", "much longer second text"], padding=True, truncation=True, max_length=8)  # rewrites its backend
    assert encoder._single.encode("word " * 300).ids == \
        tokenizer(["word " * 300], truncation=True, max_length=encoder._max_length)["input_ids"][0]


def test_query_vectors_with_int8_feed_forward_weights_stay_close_and_stored_vectors_stay_float(tmp_path: Path) -> None:
    emb = MiniLMEmbedder(cache_dir=tmp_path)
    reference = emb.model.encode(QUERIES, normalize_embeddings=True, convert_to_numpy=True)
    quantised = np.stack([emb.encode_query(q) for q in QUERIES])
    cosines = (quantised * reference).sum(1)
    assert cosines.min() > 0.98 and cosines.mean() > 0.99  # close (a two-token "hi": 0.988)
    assert not np.allclose(quantised, reference, atol=1e-4)  # and not the float graph
    assert len(list((tmp_path / "embeddings").glob("*.ffn8-*.onnx"))) == 1  # quantised once, cached
    assert len(list((tmp_path / "embeddings").glob("*.onnx"))) == 2  # from the fused graph: no export for it
    np.testing.assert_allclose(emb.encode(QUERIES[:1]), reference[:1], atol=1e-5)  # what is stored: float
    plain = MiniLMEmbedder(cache_dir=tmp_path, int8_queries=False)
    np.testing.assert_array_equal(plain.encode_query(QUERIES[0]), plain.encode(QUERIES[:1])[0])


def test_the_hand_built_query_graph_gives_the_models_vectors_and_carries_the_int8_feed_forward(tmp_path: Path) -> None:
    # the fused graph (Attention / SkipLayerNormalization / BiasGelu written from the weights) is the same
    # arithmetic as the model: float, its vectors equal sentence-transformers' to 1e-5 (long queries truncated at
    # 256 tokens as there); the query graph is that graph with the feed-forward MatMuls, and only those, in int8
    import onnx
    import onnxruntime as ort

    from agentmem.embed.onnx_query import OnnxQueryEncoder, _fused_bert

    emb = MiniLMEmbedder(cache_dir=tmp_path)
    model = emb.model
    fused = _fused_bert(model[0], tmp_path)
    assert fused is not None and fused.name.endswith(".fused.onnx")
    session = ort.InferenceSession(str(fused), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids"]
    ops = {n.op_type for n in onnx.load(str(fused)).graph.node}
    assert {"Attention", "SkipLayerNormalization", "BiasGelu"} <= ops and "Softmax" not in ops
    encoder = OnnxQueryEncoder(session, model[0].tokenizer, int(model.max_seq_length))
    reference = model.encode(QUERIES, normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(np.stack([encoder.encode([q])[0] for q in QUERIES]), reference, atol=1e-5)
    np.testing.assert_allclose(encoder.encode(QUERIES), reference, atol=1e-5)  # several texts: one at a time
    quantised = np.stack([emb.encode_query(q) for q in QUERIES])  # the query path: built from the fused graph
    [int8] = list((tmp_path / "embeddings").glob("*.fused.ffn8-*.onnx"))
    graph = onnx.load(str(int8)).graph
    float_matmuls = sorted(n.name.rsplit("_", 1)[0] for n in graph.node if n.op_type == "MatMul")
    assert float_matmuls == ["attention_out"] * 6 and sum(n.op_type == "Attention" for n in graph.node) == 6
    cosines = (quantised * reference).sum(1)
    assert cosines.min() > 0.98 and cosines.mean() > 0.99
    assert not np.allclose(quantised, reference, atol=1e-4)


def test_the_hand_built_graph_is_refused_for_another_architecture(tmp_path: Path) -> None:
    # a model whose config is not a plain BERT keeps the exported graph (queries still go through ONNX)
    from agentmem.embed.onnx_query import _fused_bert

    transformer = MiniLMEmbedder(cache_dir=tmp_path).model[0]
    config = transformer.auto_model.config
    saved = config.hidden_act
    try:
        config.hidden_act = "gelu_new"  # the tanh approximation: BiasGelu would be the wrong function
        assert _fused_bert(transformer, tmp_path) is None
    finally:
        config.hidden_act = saved
    assert not list((tmp_path / "embeddings").glob("*.fused.onnx"))


def test_building_the_int8_query_graph_leaves_the_processs_logging_alone(tmp_path: Path) -> None:
    # ONNX Runtime's quantiser logs advice through logging.warning on the root logger, which runs basicConfig()
    # when the root logger has no handler: in a fresh process (pytest's own handlers would hide it) the root logger
    # must keep no handler and no filter, and the advice must not be printed
    import subprocess
    import sys

    script = ("import logging, sys; from pathlib import Path; from agentmem.embed.minilm import MiniLMEmbedder; "
              f"v = MiniLMEmbedder(cache_dir=Path({str(tmp_path)!r})).encode_query('hi'); root = logging.getLogger(); "
              "print(len(root.handlers), len(root.filters), v.shape[0])")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    assert proc.stdout.split() == ["0", "0", "384"]
    assert list((tmp_path / "embeddings").glob("*.ffn8-*.onnx"))  # the int8 graph was built in that process
    assert "pre-processing" not in proc.stderr


def test_exported_query_model_is_cached_and_a_damaged_file_is_replaced(tmp_path: Path) -> None:
    from agentmem.embed.onnx_query import OnnxQueryEncoder

    model = MiniLMEmbedder().model
    first = OnnxQueryEncoder.for_model(model, cache_dir=tmp_path)
    [exported] = list((tmp_path / "embeddings").glob("*.onnx"))
    stamp = exported.stat().st_mtime_ns
    assert OnnxQueryEncoder.for_model(model, cache_dir=tmp_path) is not None
    assert exported.stat().st_mtime_ns == stamp  # loaded, not exported again
    exported.write_bytes(b"not a model")
    again = OnnxQueryEncoder.for_model(model, cache_dir=tmp_path)
    assert again is not None and exported.stat().st_size > 1000
    np.testing.assert_allclose(again.encode(["hello there"]), first.encode(["hello there"]), atol=1e-6)


def test_a_damaged_query_graph_or_the_graph_it_was_quantised_from_is_rebuilt(tmp_path: Path) -> None:
    # the int8 query graph is made from the hand-built float one: a damaged file at either step is rebuilt (once),
    # and the encoder gives the same vectors as before; nothing falls back to PyTorch
    from agentmem.embed.onnx_query import OnnxQueryEncoder

    model = MiniLMEmbedder().model
    first = OnnxQueryEncoder.for_model(model, cache_dir=tmp_path, ffn_int8=True)
    assert first is not None
    [fused] = list((tmp_path / "embeddings").glob("*.fused.onnx"))
    [int8] = list((tmp_path / "embeddings").glob("*.fused.ffn8-*.onnx"))
    expected = first.encode(["hello there"])
    int8.write_bytes(b"not a model")  # the graph that is loaded
    again = OnnxQueryEncoder.for_model(model, cache_dir=tmp_path, ffn_int8=True)
    assert again is not None and int8.stat().st_size > 1000
    np.testing.assert_allclose(again.encode(["hello there"]), expected, atol=1e-6)
    int8.unlink()
    fused.write_bytes(b"not a model")  # the graph it is quantised from: quantisation fails on it
    third = OnnxQueryEncoder.for_model(model, cache_dir=tmp_path, ffn_int8=True)
    assert third is not None and fused.stat().st_size > 1000 and int8.exists()
    np.testing.assert_allclose(third.encode(["hello there"]), expected, atol=1e-6)


def test_recall_spreads_to_the_reply_and_its_session(mem_path: Path) -> None:
    with AgentMemory(mem_path, recall_questions_last=False) as mem:  # the store's order: the question is the opener
        turns = ["Did you ever get the kayak repaired?", "Yes, the shop on Quai Perrache fixed it for 40 euros.",
                 "Great, let's go out on Sunday then."]
        ids = [r.id for r in mem.remember_many([dict(text=t, user_id="u", session_id="s1", kind="turn",
                                                        speaker=("Ana" if i % 2 == 0 else "Ben"))
                                                   for i, t in enumerate(turns)])]
        mem.remember_many([dict(text=f"Unrelated chat number {i} about the weather.", user_id="u", session_id="s2",
                                kind="turn") for i in range(20)])
        hits = mem.recall("kayak repaired", user_id="u", k=3)
        # the reply holds the answer but shares no word with the query: it arrives through its neighbour
        assert hits[0].id == ids[0] and ids[1] in [h.id for h in hits]


def test_context_cosines_score_a_turn_with_its_neighbours(mem_path: Path) -> None:
    with AgentMemory(mem_path, consolidation="off", recall_questions_last=False) as mem:  # the retrieval's own order
        turns = ["Which instrument did you finally pick up?", "The cello, I practise every evening now.",
                 "That sounds lovely."]
        ids = [r.id for r in mem.remember_many([dict(text=t, user_id="u", session_id="s1", kind="turn")
                                                   for t in turns])]
        mem.remember_many([dict(text=f"Note {i}: the bus to the office was late again.", user_id="u",
                                session_id="s2", kind="turn") for i in range(15)])
        store = mem._store  # the context signal sits below the facade
        cands, vec = store.candidates("what instrument does she play?", Scope("u"), pool=100, context=True)
        cosine = dict(store.vectors.query(vec, user_id="u", n=100))
        # the reply's context is the mean of its own cosine and both neighbours'
        assert cands.context[ids[1]] == pytest.approx((cosine[ids[0]] + cosine[ids[1]] + cosine[ids[2]]) / 3, abs=1e-5)
        # a turn at a session's edge averages over the one neighbour it has
        assert cands.context[ids[0]] == pytest.approx((cosine[ids[0]] + cosine[ids[1]]) / 2, abs=1e-5)
        # a small pool: neighbours and lexical-only hits outside the dense pool get their cosine from the index
        # (a head entry that is also another's neighbour is looked up once)
        small, vec2 = store.candidates("which instrument did you pick? the cello", Scope("u"), pool=2, context=True)
        cosine2 = dict(store.vectors.query(vec2, user_id="u", n=100))
        assert len(small.dense) == 2 and small.context
        for entry_id, value in small.context.items():
            place = small.places[entry_id]
            near = [entry_id, *place.before[:1], *place.after[:1]]
            assert value == pytest.approx(sum(cosine2[i] for i in near) / len(near), abs=1e-5)
        # lexical-only head entries that are also each other's neighbours: each looked up once
        crafted = Candidates({ids[0]: cosine[ids[0]]}, {ids[1]: 2.0, ids[2]: 1.0}, store.catalog.turn_context(ids))
        got = store._context(vec, Scope("u"), crafted, None)
        assert got[ids[2]] == pytest.approx((cosine[ids[1]] + cosine[ids[2]]) / 2, abs=1e-5)
        plain, _ = store.candidates("what instrument does she play?", Scope("u"), pool=100)
        assert plain.context == {}  # off by default unless the params ask for it
        store.params = replace(store.params, context_weight=0.4)
        hits = mem.recall("what instrument does she play?", user_id="u", k=3)
        assert {h.id for h in hits[:3]} == set(ids)  # the three turns of the matching exchange lead

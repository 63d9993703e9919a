"""Query embeddings through ONNX Runtime: the same MiniLM, exported once from the loaded weights and cached.

Why: a recall embeds one short query, and PyTorch's eager dispatch costs more than the arithmetic there. The
exported graph on ONNX Runtime (already installed: Chroma depends on it) gives the same vectors (max difference
~1e-7 here) about 2.5× faster (measured on this 2-core CPU: 5.5 ms vs 14.9 ms per query), which is most of a
recall's latency budget. Stored entries keep the sentence-transformers path: batches do not pay that overhead.

The query graph (int8 feed-forward weights) is written node by node from a plain BERT's weights with ONNX
Runtime's fused kernels (:func:`_fused_bert`), else exported. The export needs the ``onnx`` package and takes
~2 s once per model; each file is cached under
``<cache_dir>/embeddings/`` keyed by the weights file's path, size and modification time, written atomically.
Anything missing or failing means ``None``: the caller keeps the PyTorch path.

Example:
    >>> from agentmem.config import default_cache_dir
    >>> from agentmem.embed.minilm import MiniLMEmbedder
    >>> model = MiniLMEmbedder().model
    >>> q = OnnxQueryEncoder.for_model(model, cache_dir=default_cache_dir())
    >>> vector = q.encode(["where does the user live?"])
    >>> vector.shape, float(np.abs(vector - model.encode(["where does the user live?"])).max()) < 1e-4
    ((1, 384), True)
"""

from __future__ import annotations

import hashlib
import logging
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from agentmem._fs import publish

log = logging.getLogger(__name__)

_EXPORT_VERSION = "1"  # bump when the exported graph's inputs or outputs change
_FFN8_VERSION = "2"  # bump when the quantised nodes or settings change
_FUSED_VERSION = "1"  # bump when the hand-built query graph (:func:`_fused_bert`) changes
_lock = threading.Lock()


class OnnxQueryEncoder:
    """Transformer → mean pooling → L2 normalisation, with the transformer run by ONNX Runtime on one thread."""

    def __init__(self, session: Any, tokenizer: Any, max_length: int) -> None:
        self._session = session
        self._tokenizer = tokenizer
        self._max_length = max_length
        self._inputs = [i.name for i in session.get_inputs()]
        self._single = _single_text_tokenizer(tokenizer, max_length)
        self._masked = "attention_mask" in self._inputs  # else a graph for one unpadded text (_fused_bert)

    @classmethod
    def for_model(cls, model: Any, *, cache_dir: Path, ffn_int8: bool = False) -> OnnxQueryEncoder | None:
        """An encoder for a sentence-transformers ``model`` (Transformer + mean Pooling [+ Normalize]), or None
        when the model has another shape or ONNX Runtime / the export is unavailable. ``ffn_int8``: the query
        graph, its feed-forward weights quantised to int8 (:func:`_ffn_int8`; for queries only, research/notes/retrieval-lab-notes.md),
        built by hand with ONNX Runtime's fused kernels when the model is a plain BERT (:func:`_fused_bert`)."""
        from agentmem.embed.pooling import is_mean_pooled

        if not is_mean_pooled(model):
            return None
        try:
            import onnxruntime as ort
        except ImportError:
            return None
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # one short query: threads cost more than they save
        options.inter_op_num_threads = 1
        options.log_severity_level = 3

        def open_session(path: Path) -> Any:
            return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

        built: list[Path] = []  # the cache files this encoder's graph comes from, the one to load last

        def exported() -> Path:
            built.clear()
            if not ffn_int8:
                built.append(_exported(model[0], cache_dir))
                return built[-1]
            built.append(_fused_bert(model[0], cache_dir) or _exported(model[0], cache_dir))
            built.append(_ffn_int8(built[-1]))
            return built[-1]

        for attempt in (1, 2):
            try:
                session = open_session(exported())
                break
            except Exception as exc:  # export, quantisation or load failed
                if attempt == 2 or not built:  # twice, or nothing cached to blame: the PyTorch path still works
                    log.info("query embeddings stay on PyTorch: ONNX graph unavailable (%s)", type(exc).__name__)
                    return None
                for path in built:  # a damaged cache file (the int8 graph or the graph it was made from): again
                    path.unlink(missing_ok=True)
        return cls(session, model[0].tokenizer, int(model.max_seq_length))

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Unit vectors of ``texts`` (float32, one row each).

        Example:
            >>> vectors = encoder.encode(["where does the user live?", "I live in Lyon."])  # MiniLM's encoder
            >>> vectors.shape, np.linalg.norm(vectors, axis=1).round(3).tolist()
            ((2, 384), [1.0, 1.0])
        """
        if len(texts) > 1 and not self._masked:  # no mask input: no padding, so one text at a time
            return np.concatenate([self.encode([text]) for text in texts])
        if len(texts) == 1 and self._single is not None:  # a query: no padding, and the GIL is kept (see below)
            encoding = self._single.encode(texts[0])
            batch = {"input_ids": np.array([encoding.ids], dtype=np.int64),
                     "attention_mask": np.array([encoding.attention_mask], dtype=np.int64),
                     "token_type_ids": np.array([encoding.type_ids], dtype=np.int64)}
        else:
            batch = dict(self._tokenizer(list(texts), padding=True, truncation=True, max_length=self._max_length,
                                         return_tensors="np"))
        feeds = {name: batch[name].astype(np.int64, copy=False) for name in self._inputs}
        hidden = self._session.run(None, feeds)[0]
        mask = batch["attention_mask"][..., None].astype(np.float32)
        pooled = (hidden * mask).sum(1) / np.clip(mask.sum(1), 1e-9, None)
        return (pooled / np.clip(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12, None)).astype(np.float32)


def _single_text_tokenizer(tokenizer: Any, max_length: int) -> Any:
    """A copy of a fast tokenizer's Rust tokenizer that truncates to ``max_length`` and never pads (None for a slow
    tokenizer): the same ids as ``tokenizer([text], padding=True, truncation=True, max_length=...)``.

    Why: the transformers call goes through ``encode_batch``, which releases the GIL while it runs; recall embeds
    its query while the lexical search runs in another thread, and getting the GIL back from that thread waits up
    to the interpreter's switch interval (5 ms). Measured beside a busy Python thread: p50 / p95 0.24 / 8.0 ms per
    query that way, 0.11 / 0.18 ms through ``Tokenizer.encode`` (which keeps the GIL). A copy, because transformers
    rewrites its backend's padding and truncation on every call.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    from tokenizers import Tokenizer

    single = Tokenizer.from_str(backend.to_str())
    single.no_padding()
    single.enable_truncation(max_length)
    return single


def _ffn_nodes(path: Path) -> list[str]:
    """The feed-forward MatMuls of our BERT graphs: exported (``.../intermediate/dense/MatMul`` and the layer's
    ``.../output/dense/MatMul``; not the attention's ``.../attention/output/dense/MatMul``) or hand-built
    (``ffn_in_<layer>``, ``ffn_out_<layer>``)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return [n.name for n in graph.node if n.op_type == "MatMul" and (
        n.name.startswith(("ffn_in_", "ffn_out_"))
        or "/intermediate/dense/" in n.name or ("/output/dense/" in n.name and "/attention/" not in n.name))]


def _ffn_int8(path: Path) -> Path:
    """The graph at ``path`` (exported or :func:`_fused_bert`'s) with only its feed-forward weights quantised to
    int8 (ONNX Runtime's dynamic quantisation, per output channel), cached beside it; ``path`` itself when the graph
    has no such nodes.

    Why only those (session 7, on the exported graph): a query embeds in 8.1 ms float, 5.3 ms so (cosine to the
    float vector 0.996 on average, 0.994 at worst, 200 LoCoMo questions), and LoCoMo's cross-validated recall moves
    by -0.003 at most (-0.0025 @10): every MatMul in int8 is faster still (2.3 ms) but lost 0.004 @10
    (research/notes/retrieval-lab-notes.md, latency; session 13 re-measured the variants on the fused graph).
    """
    target = path.with_name(f"{path.stem}.ffn8-{_FFN8_VERSION}.onnx")
    if target.exists():
        return target
    nodes = _ffn_nodes(path)
    if not nodes:
        return path
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _lock:
        if target.exists():
            return target
        tmp = target.with_name(f".{target.name}.{threading.get_ident()}.tmp")
        try:
            with _quantizer_advice_muted():
                quantize_dynamic(str(path), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
                                 nodes_to_quantize=nodes,
                                 extra_options={"DefaultTensorType": 1})  # FLOAT: for _fused_bert's contrib ops
            publish(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    return target


@contextmanager
def _quantizer_advice_muted() -> Iterator[None]:
    """While ONNX Runtime quantises: drop its advice to pre-process the graph (not needed here), which it logs with
    ``logging.warning`` on the root logger — a call that also runs ``logging.basicConfig()`` when the root logger has
    no handler, leaving a stderr handler in the user's process. So: a placeholder handler for the call, and a filter
    that drops only records from ONNX Runtime's quantisation package (other threads' warnings still pass)."""
    import onnxruntime.quantization as quantization

    package = str(Path(quantization.__file__).parent)
    root = logging.getLogger()
    placeholder = logging.NullHandler() if not root.handlers else None

    def not_quantizer(record: logging.LogRecord) -> bool:
        return not record.pathname.startswith(package)

    if placeholder is not None:
        root.addHandler(placeholder)
    root.addFilter(not_quantizer)
    try:
        yield
    finally:
        root.removeFilter(not_quantizer)
        if placeholder is not None:
            root.removeHandler(placeholder)


def _weights_identity(transformer: Any) -> str:
    """Path, size and mtime of the weights the transformer was loaded from (cheap, changes with the weights)."""
    source = Path(getattr(transformer.auto_model, "name_or_path", "") or "")
    files = sorted(source.glob("*.safetensors")) + sorted(source.glob("*.bin")) if source.is_dir() else []
    parts = [str(source.resolve()) if source.exists() else str(source)]
    parts += [f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files]
    if getattr(transformer, "query_tower", None):  # the same files with a query tower merged in: other weights
        parts.append(f"tower:{transformer.query_tower}")
    return "|".join(parts)


def _exported(transformer: Any, cache_dir: Path) -> Path:
    key = hashlib.sha256(f"{_EXPORT_VERSION}|{_weights_identity(transformer)}".encode()).hexdigest()[:24]
    target = Path(cache_dir).expanduser() / "embeddings" / f"{key}.onnx"
    if target.exists():
        return target
    import torch

    class _HiddenStates(torch.nn.Module):
        def __init__(self, hf: Any) -> None:
            super().__init__()
            self.hf = hf

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.hf(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    with _lock:
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        hf = transformer.auto_model
        was_training = hf.training
        hf.eval()
        sample = transformer.tokenizer(["an example query"], return_tensors="pt")
        tmp = target.with_name(f".{target.name}.{threading.get_ident()}.tmp")
        try:
            with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # tracer and deprecation chatter, not problems
                torch.onnx.export(
                    _HiddenStates(hf), (sample["input_ids"], sample["attention_mask"]), str(tmp),
                    input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"],
                    dynamic_axes={n: {0: "batch", 1: "tokens"} for n in ("input_ids", "attention_mask", "last_hidden_state")},
                    opset_version=17, dynamo=False,
                )
            publish(tmp, target)  # atomic: another process sees no file or a whole one
        finally:
            tmp.unlink(missing_ok=True)
            hf.train(was_training)
    return target


def _fused_bert(transformer: Any, cache_dir: Path) -> Path | None:
    """A query graph written node by node from a plain BERT's weights with ONNX Runtime's fused CPU kernels
    (``Attention``, ``SkipLayerNormalization``, ``BiasGelu``), for one unpadded text (input ``input_ids`` only,
    token type 0), cached under ``<cache_dir>/embeddings/`` like :func:`_exported`; None for another model, or when
    the graph's output differs from the model's own on a sample (then the exported graph serves).

    Why: the exported graph spends ~1.5 of its ~5.5 ms (ONNX Runtime's profiler, int8 feed-forward weights) in
    small ops (masks, reshapes, transposes) that one text needs none of, and ONNX Runtime's transformer optimiser
    does not recognise the attention that transformers 5 exports. Same arithmetic (max difference ~2e-7 on unit
    vectors); per query, interleaved, 300 LoCoMo questions: float 6.1 → 5.5 ms, int8 feed-forward 4.2 → 3.7 ms
    (research/notes/retrieval-lab-notes.md, session 13).
    """
    hf = transformer.auto_model
    config = hf.config
    if (getattr(config, "model_type", None) != "bert" or getattr(config, "hidden_act", None) != "gelu"
            or getattr(config, "position_embedding_type", "absolute") != "absolute"
            or getattr(config, "is_decoder", False)):
        return None
    key = hashlib.sha256(f"fused|{_FUSED_VERSION}|{_weights_identity(transformer)}".encode()).hexdigest()[:24]
    target = Path(cache_dir).expanduser() / "embeddings" / f"{key}.fused.onnx"
    if target.exists():
        return target
    import onnx

    with _lock:
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{threading.get_ident()}.tmp")
        try:
            onnx.save(_bert_graph(hf), str(tmp))
            if not _same_as_model(tmp, transformer):
                log.info("hand-built query graph differs from the model: the exported graph serves")
                return None
            publish(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    return target


def _same_as_model(path: Path, transformer: Any) -> bool:
    """Whether the graph at ``path`` gives the model's own last hidden state (within 1e-4) on a sample text."""
    import onnxruntime as ort
    import torch

    ids = transformer.tokenizer(["Where did Caroline move to, and when? 42 km."], return_tensors="pt")["input_ids"]
    hf = transformer.auto_model
    was_training = hf.training
    hf.eval()
    try:
        with torch.inference_mode():
            expected = hf(input_ids=ids).last_hidden_state.float().numpy()
    finally:
        hf.train(was_training)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    got = session.run(None, {"input_ids": ids.numpy().astype(np.int64)})[0]
    return got.shape == expected.shape and float(np.abs(got - expected).max()) < 1e-4


def _bert_graph(hf: Any) -> Any:
    """The ONNX model of :func:`_fused_bert`: embeddings (word + position + token type 0) and LayerNorm, then per
    layer ``Attention`` (packed QKV), the output MatMul into ``SkipLayerNormalization`` (bias fused), the feed-forward
    MatMuls ``ffn_in_<l>`` / ``ffn_out_<l>`` around ``BiasGelu``, and a second ``SkipLayerNormalization``."""
    import torch
    from onnx import TensorProto, helper, numpy_helper

    with torch.no_grad():
        weights = {k: v.detach().float().cpu().numpy() for k, v in hf.state_dict().items()}
    config = hf.config
    eps = float(config.layer_norm_eps)
    inits: list[Any] = []

    def init(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    e = "embeddings."
    init("positions", weights[e + "position_embeddings.weight"] + weights[e + "token_type_embeddings.weight"][0])
    for name, value in (("one", [1]), ("zero", [0]), ("two", [2])):
        init(name, np.array(value, dtype=np.int64))
    nodes = [helper.make_node("Gather", [init("words", weights[e + "word_embeddings.weight"]), "input_ids"], ["w"]),
             helper.make_node("Shape", ["input_ids"], ["shape"]),
             helper.make_node("Slice", ["shape", "one", "two"], ["tokens"]),
             helper.make_node("Slice", ["positions", "zero", "tokens"], ["p"]),
             helper.make_node("Add", ["w", "p"], ["sum"]),
             helper.make_node("LayerNormalization", ["sum", init("emb_g", weights[e + "LayerNorm.weight"]),
                                                     init("emb_b", weights[e + "LayerNorm.bias"])], ["x0"],
                              axis=-1, epsilon=eps)]
    layers = int(config.num_hidden_layers)
    for layer in range(layers):
        out = "last_hidden_state" if layer == layers - 1 else f"x{layer + 1}"
        nodes += _bert_layer(weights, f"encoder.layer.{layer}.", layer, f"x{layer}", out, init,
                             heads=int(config.num_attention_heads), eps=eps)
    graph = helper.make_graph(
        nodes, "agentmem_bert_query", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "tokens"])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [1, "tokens", config.hidden_size])],
        inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def _bert_layer(w: dict[str, np.ndarray], p: str, n: int, x: str, out: str, init: Any, *, heads: int,
                eps: float) -> list[Any]:
    """One encoder layer's nodes for :func:`_bert_graph` (weights ``w`` under prefix ``p``, layer index ``n``)."""
    from onnx import helper

    a = p + "attention."
    qkv = np.concatenate([w[a + f"self.{m}.weight"].T for m in ("query", "key", "value")], axis=1)
    qkv_bias = np.concatenate([w[a + f"self.{m}.bias"] for m in ("query", "key", "value")])
    ms = "com.microsoft"
    return [
        helper.make_node("Attention", [x, init(f"qkv{n}", qkv), init(f"qkv_b{n}", qkv_bias)], [f"att{n}"],
                         name=f"attention_{n}", domain=ms, num_heads=heads),
        helper.make_node("MatMul", [f"att{n}", init(f"ao{n}", w[a + "output.dense.weight"].T)], [f"ao{n}_out"],
                         name=f"attention_out_{n}"),
        helper.make_node("SkipLayerNormalization",
                         [f"ao{n}_out", x, init(f"ln1_g{n}", w[a + "output.LayerNorm.weight"]),
                          init(f"ln1_b{n}", w[a + "output.LayerNorm.bias"]),
                          init(f"ao_b{n}", w[a + "output.dense.bias"])],
                         [f"y{n}"], name=f"skip_ln1_{n}", domain=ms, epsilon=eps),
        helper.make_node("MatMul", [f"y{n}", init(f"fi{n}", w[p + "intermediate.dense.weight"].T)], [f"fi{n}_out"],
                         name=f"ffn_in_{n}"),
        helper.make_node("BiasGelu", [f"fi{n}_out", init(f"fi_b{n}", w[p + "intermediate.dense.bias"])], [f"g{n}"],
                         name=f"gelu_{n}", domain=ms),
        helper.make_node("MatMul", [f"g{n}", init(f"fo{n}", w[p + "output.dense.weight"].T)], [f"fo{n}_out"],
                         name=f"ffn_out_{n}"),
        helper.make_node("SkipLayerNormalization",
                         [f"fo{n}_out", f"y{n}", init(f"ln2_g{n}", w[p + "output.LayerNorm.weight"]),
                          init(f"ln2_b{n}", w[p + "output.LayerNorm.bias"]),
                          init(f"fo_b{n}", w[p + "output.dense.bias"])],
                         [out], name=f"skip_ln2_{n}", domain=ms, epsilon=eps),
    ]


__all__ = ["OnnxQueryEncoder"]

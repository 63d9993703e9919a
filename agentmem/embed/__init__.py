"""Text to vectors: the bundled MiniLM embedder (:mod:`.minilm`), its ONNX query graph (:mod:`.onnx_query`), the
fast pooled forward pass (:mod:`.pooling`) and the tuned query tower (:mod:`.query_tower`, weights in ``weights/``)."""

"""Shipping tier (chapter 12): export to ``torch.export`` graphs and
ONNX, a decoding loop over the exported graphs in ONNX Runtime, int8
dynamic quantisation, and tensor and fully-sharded parallelism.

Built on the core and the training tier; the translator's command line
(:mod:`transformer_lite.tasks.translate`) uses it. The modules are
imported one by one: export and the runtime need the ``onnx``,
``onnxscript`` and ``onnxruntime`` packages, quantisation ``torchao``.
"""

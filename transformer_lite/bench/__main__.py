"""``python -m transformer_lite.bench``: run the benchmark."""

from transformer_lite.bench.report import main

main()

# Shared code of weft's Python tests: the reference model (qwen2), its files (files), running weft
# (runner), comparing tensors (compare) and the test harness (fixtures); imported as
# `from reference import qwen2, files, runner` or `from reference.compare import compare`.

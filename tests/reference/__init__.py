# Shared reference code for weft's Python tests (imported as `from reference import qwen2`).

"""Backends: the only package that imports vllm, torch, transformers, openai, tenacity."""

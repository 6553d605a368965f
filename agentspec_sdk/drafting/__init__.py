"""Structure-aware drafting logic (no vllm import): the plan, the proposer, the budget allocator."""

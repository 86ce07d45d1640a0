"""LLM workloads for OpenAI-compatible targets: prompts from datasets or from token-length
distributions, built to exact lengths with a local Hugging Face tokenizer, and the
request bodies (streamed or not, completions, chat or embeddings) made from them before
the run."""

from loadgen.llm.dist import LengthDist, parse_dist
from loadgen.llm.workload import LlmOptions, Workload, build_workload

__all__ = ["LengthDist", "LlmOptions", "Workload", "build_workload", "parse_dist"]

"""Output parsers of the OpenAI server: reasoning (``deepinfer.reasoning_parsers``) and tool calls
(``deepinfer.tool_parsers``). They work on text alone and import nothing of deepinfer."""

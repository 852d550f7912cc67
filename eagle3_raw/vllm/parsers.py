"""vLLM 0.32's output parser names (``--reasoning-parser``, ``--tool-call-parser``: the registries
of ``vllm/reasoning/__init__.py`` and ``vllm/tool_parsers/__init__.py``). vLLM runs its parsers
on the server (``/v1/chat/completions/derender``): a recipe's name records which one, and is
checked to be one vLLM has."""

REASONING_PARSER_NAMES = (
    "deepseek_r1", "deepseek_v3", "deepseek_v4", "deepseek_v41", "poolside_v1", "cohere_command3",
    "cohere_command4", "ernie45", "gemma4", "glm45", "glm47", "ling3", "openai_gptoss", "granite",
    "granite_thinking_parser", "hf", "holo2", "hunyuan_a13b", "hy_v3", "hy_v4", "kimi_k2", "kimi_k3",
    "k2_horizon", "mimo", "minicpmv", "minimax_m2", "minimax_m2_append_think", "minimax_m3", "mistral",
    "nemotron_v3", "olmo3", "plamo3", "muse_glimmer", "qwen3", "seed_oss", "step3", "step3p5", "inkling",
)  # fmt: skip
TOOL_CALL_PARSER_NAMES = (
    "dots", "deepseek_v3", "deepseek_v31", "deepseek_v32", "deepseek_v4", "deepseek_v41", "cohere_command3",
    "cohere_command4", "ernie45", "glm45", "glm47", "ling3", "granite", "granite4", "hermes", "hf",
    "poolside_v1", "hunyuan_a13b", "hy_v3", "hy_v4", "internlm", "jamba", "lfm2", "kimi_k2", "kimi_k3",
    "k2_horizon", "llama3_json", "llama4_json", "llama4_pythonic", "longcat", "mimo", "minimax_m2",
    "minimax_m3", "minicpm5", "mistral", "olmo3", "plamo3", "muse_glimmer", "openai", "phi4_mini_json",
    "pythonic", "qwen3_coder", "qwen3_json", "qwen3_xml", "seed_oss", "step3", "step3p5", "inkling", "xlam",
    "gigachat3", "functiongemma", "gemma4", "apertus",
)  # fmt: skip

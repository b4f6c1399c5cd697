"""The guard policy the benchmarks turn on: the settings' ``guard`` section (``docs/settings.md``, "Guard").

One policy, ``screen``, that every request gets by ``default`` and the gateway runs itself (no call leaves the
leader): emails redacted in the request and in a whole answer, card numbers and one prompt-injection pattern
blocked in the request. The benchmarks' prompts hold none of these, so every request is checked and allowed;
its record shows ``guard_action`` allow and ``guard_policy`` screen.
"""

from __future__ import annotations

GUARD_POLICY = "screen"
"""The policy's name, as a request's record gives it (``guard_policy``)."""
INJECTION = "(?i)ignore (all )?previous instructions"
"""The prompt-injection pattern the policy blocks in a request."""
GUARD = (
    "guard:\n"
    f"  default: [{GUARD_POLICY}]\n"
    "  policies:\n"
    f"    - name: {GUARD_POLICY}\n"
    "      checks:\n"
    "        - {reads: both, pii: email, action: redact}\n"
    "        - {reads: input, pii: card, action: block}\n"
    f"        - {{reads: input, pattern: '{INJECTION}', name: injection, "
    "category: prompt_injection, action: block}\n"
)
"""The settings' YAML for it, appended to a settings body."""

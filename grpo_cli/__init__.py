"""The `grpo` command: the library's commands plus those that run Prefect flows (imports point grpo_cli -> flows
-> tasks -> grpo_core, never back)."""

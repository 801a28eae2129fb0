"""Tools shipped with grpo_pipe, one module each, named as the tool (`calculator`: exact arithmetic, `python`: a
sandboxed interpreter). A module here that defines `TOOL`, the class whose instance is the tool (built with
`environment.tool_options.<name>`, its rules in `config_problems()`), ships that tool: the toolbox finds it by name."""
